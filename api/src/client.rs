//! The one console-API client: the CLI, the demo and the integration tests
//! all talk to the control plane through it. Responses are decoded into
//! the views of this crate, so a renamed field fails to compile (or fails
//! here, naming the path and field), never silently reads as missing.

use std::future::Future;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use edgeloop_models::digest::Sha256Writer;
use edgeloop_models::Digest;
use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::io::{AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _};
use tokio::time::Instant;

use crate::error::ErrorBody;

/// The kind of a failure, for callers that branch on it (the CLI's exit
/// codes, tests that expect a 4xx).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// The control plane could not be reached.
    Unreachable,
    /// 400, 413, 422: the request was refused as invalid.
    Invalid,
    /// 401, 403.
    Auth,
    /// 404.
    NotFound,
    /// 409.
    Conflict,
    /// Any other status, or a response that is not the expected view.
    Server,
    /// A request that could not be built (a bad server URL).
    Usage,
    /// A wait that ran out of time, or a transfer that stalled.
    Timeout,
    /// A local file could not be read or written.
    Io,
}

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("cannot reach the control plane at {server}: {detail}")]
    Unreachable { server: String, detail: String },
    /// The server refused the request; `message` is its own, prefixed by
    /// the field it names when it names one.
    #[error("{message}")]
    Status { status: u16, message: String },
    #[error("{method} {path}: the response is not a {what}: {detail}")]
    Decode {
        method: String,
        path: String,
        what: &'static str,
        detail: String,
    },
    #[error("{0}")]
    Usage(String),
    #[error("timed out after {after:?} waiting for {what}")]
    Timeout { what: String, after: Duration },
    /// A local file being sent or received failed.
    #[error("{path}: {detail}")]
    Io { path: String, detail: String },
}

impl ApiError {
    pub fn kind(&self) -> ErrorKind {
        match self {
            ApiError::Unreachable { .. } => ErrorKind::Unreachable,
            ApiError::Status { status, .. } => match status {
                400 | 413 | 422 => ErrorKind::Invalid,
                401 | 403 => ErrorKind::Auth,
                404 => ErrorKind::NotFound,
                409 => ErrorKind::Conflict,
                _ => ErrorKind::Server,
            },
            ApiError::Decode { .. } => ErrorKind::Server,
            ApiError::Usage(_) => ErrorKind::Usage,
            ApiError::Timeout { .. } => ErrorKind::Timeout,
            ApiError::Io { .. } => ErrorKind::Io,
        }
    }

    /// The HTTP status the server answered with, if it answered.
    pub fn status(&self) -> Option<u16> {
        match self {
            ApiError::Status { status, .. } => Some(*status),
            _ => None,
        }
    }
}

pub type Result<T, E = ApiError> = std::result::Result<T, E>;

/// A console-API client holding the server's base URL and the admin token.
#[derive(Clone)]
pub struct Client {
    http: reqwest::Client,
    /// For artifact transfers: no overall deadline (a large model takes as
    /// long as it takes); `stall` bounds the time without progress instead.
    transfer: reqwest::Client,
    stall: Duration,
    base: String,
    token: Option<String>,
}

/// The size of a transfer's chunks read from disk.
const CHUNK_BYTES: usize = 1 << 20;

/// The shortest stall a transfer is allowed: the server fsyncs a large
/// artifact after its last byte, before it answers.
const MIN_STALL: Duration = Duration::from_secs(60);

/// When a transfer last moved, for its stall watchdog.
#[derive(Clone)]
struct Activity(Arc<Mutex<Instant>>);

impl Activity {
    fn new() -> Activity {
        Activity(Arc::new(Mutex::new(Instant::now())))
    }

    fn touch(&self) {
        if let Ok(mut t) = self.0.lock() {
            *t = Instant::now();
        }
    }

    fn last(&self) -> Instant {
        self.0
            .lock()
            .map(|t| *t)
            .unwrap_or_else(|p| *p.into_inner())
    }
}

fn io_error(path: &Path, e: std::io::Error) -> ApiError {
    ApiError::Io {
        path: path.display().to_string(),
        detail: e.to_string(),
    }
}

/// Which certificate an `https://` console may present.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Trust {
    /// reqwest's default roots.
    #[default]
    Default,
    /// Only CAs in this PEM (the control plane's `pki/ca.crt`, say).
    CaPem(Vec<u8>),
    /// Only a chain that holds the CA with this sha256 (as a bootstrap
    /// token pins it; `ca_fingerprint` of a created token).
    CaFingerprint(Digest),
}

impl Trust {
    fn tls_config(&self) -> Result<Option<rustls::ClientConfig>> {
        let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| ApiError::Usage(format!("TLS: {e}")))?;
        let mut config = match self {
            Trust::Default => return Ok(None),
            Trust::CaPem(pem) => {
                use rustls::pki_types::pem::PemObject as _;
                let mut roots = rustls::RootCertStore::empty();
                for cert in rustls::pki_types::CertificateDer::pem_slice_iter(pem) {
                    let cert = cert.map_err(|e| ApiError::Usage(format!("CA file: {e}")))?;
                    roots
                        .add(cert)
                        .map_err(|e| ApiError::Usage(format!("CA file: {e}")))?;
                }
                if roots.is_empty() {
                    return Err(ApiError::Usage("the CA file holds no certificate".into()));
                }
                builder.with_root_certificates(roots).with_no_client_auth()
            }
            Trust::CaFingerprint(pin) => builder
                .dangerous()
                .with_custom_certificate_verifier(std::sync::Arc::new(
                    crate::tls::PinnedCaVerifier::new(*pin),
                ))
                .with_no_client_auth(),
        };
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(Some(config))
    }
}

impl Client {
    /// `base` is the console API's root (`http://127.0.0.1:7080`); every
    /// request carries `token` as a bearer token when there is one.
    /// `timeout` bounds each request, not a wait.
    pub fn new(base: &str, token: Option<String>, timeout: Duration) -> Result<Client> {
        Self::with_trust(base, token, timeout, &Trust::Default)
    }

    /// [`Client::new`] for an `https://` console whose certificate `trust`
    /// says how to check.
    pub fn with_trust(
        base: &str,
        token: Option<String>,
        timeout: Duration,
        trust: &Trust,
    ) -> Result<Client> {
        let tls = trust.tls_config()?;
        let builder = || {
            let b = reqwest::Client::builder();
            match &tls {
                Some(config) => b.use_preconfigured_tls(config.clone()),
                None => b,
            }
        };
        let http = builder()
            .timeout(timeout)
            .build()
            .map_err(|e| ApiError::Usage(format!("HTTP client: {e}")))?;
        let transfer = builder()
            .connect_timeout(timeout)
            .build()
            .map_err(|e| ApiError::Usage(format!("HTTP client: {e}")))?;
        Ok(Client {
            http,
            transfer,
            stall: timeout.max(MIN_STALL),
            base: base.trim_end_matches('/').to_string(),
            token,
        })
    }

    pub fn base(&self) -> &str {
        &self.base
    }

    /// How long an artifact transfer may go without progress before it
    /// fails (default: the request timeout, at least a minute).
    pub fn with_stall(mut self, stall: Duration) -> Client {
        self.stall = stall;
        self
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// A request with the token, for callers that need the response as it
    /// came (status, headers, bytes): the protocol tests.
    pub fn request(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        let r = self.http.request(method, self.url(path));
        match &self.token {
            Some(t) => r.bearer_auth(t),
            None => r,
        }
    }

    pub async fn get<T: DeserializeOwned>(&self, path: &str) -> Result<T> {
        self.call(
            reqwest::Method::GET,
            path,
            self.request(reqwest::Method::GET, path),
        )
        .await
    }

    /// A GET with query parameters, encoded by `Url` (selectors hold `=`,
    /// `,`, `!` and spaces). Parameters set to `None` are left out, so the
    /// server's defaults apply.
    pub async fn get_query<T: DeserializeOwned>(
        &self,
        path: &str,
        params: &[(&str, Option<String>)],
    ) -> Result<T> {
        let mut url = reqwest::Url::parse(&self.url(path))
            .map_err(|e| ApiError::Usage(format!("--server {}: {e}", self.base)))?;
        let given: Vec<(&str, &String)> = params
            .iter()
            .filter_map(|(k, v)| v.as_ref().map(|v| (*k, v)))
            .collect();
        if !given.is_empty() {
            url.query_pairs_mut().extend_pairs(given);
        }
        let mut req = self.http.get(url);
        if let Some(t) = &self.token {
            req = req.bearer_auth(t);
        }
        self.call(reqwest::Method::GET, path, req).await
    }

    pub async fn post<B: Serialize + ?Sized, T: DeserializeOwned>(
        &self,
        path: &str,
        body: &B,
    ) -> Result<T> {
        let req = self.request(reqwest::Method::POST, path).json(body);
        self.call(reqwest::Method::POST, path, req).await
    }

    pub async fn put<B: Serialize + ?Sized, T: DeserializeOwned>(
        &self,
        path: &str,
        body: &B,
    ) -> Result<T> {
        let req = self.request(reqwest::Method::PUT, path).json(body);
        self.call(reqwest::Method::PUT, path, req).await
    }

    /// A DELETE; an empty answer (204) decodes as `()`.
    pub async fn delete<T: DeserializeOwned>(&self, path: &str) -> Result<T> {
        self.call(
            reqwest::Method::DELETE,
            path,
            self.request(reqwest::Method::DELETE, path),
        )
        .await
    }

    /// Uploads an artifact under its own digest (the server checks it).
    pub async fn upload(&self, bytes: Vec<u8>) -> Result<Digest> {
        let digest = Digest::of(&bytes);
        let path = format!("/api/v1/artifacts/{digest}");
        let req = self.request(reqwest::Method::PUT, &path).body(bytes);
        self.send(&path, req).await?;
        Ok(digest)
    }

    /// Downloads an artifact and checks it against its digest.
    pub async fn download(&self, digest: &Digest) -> Result<Vec<u8>> {
        let path = format!("/api/v1/artifacts/{digest}");
        let resp = self
            .send(&path, self.request(reqwest::Method::GET, &path))
            .await?;
        let bytes = resp.bytes().await.map_err(|e| self.unreachable(e))?;
        if Digest::of(&bytes) != *digest {
            return Err(ApiError::Decode {
                method: "GET".into(),
                path,
                what: "artifact with that digest",
                detail: format!("the bytes hash to {}", Digest::of(&bytes)),
            });
        }
        Ok(bytes.to_vec())
    }

    /// The size of an artifact the server holds (`HEAD`), or `None` if it
    /// holds none with that digest: what a push need not send again.
    pub async fn artifact_size(&self, digest: &Digest) -> Result<Option<u64>> {
        let path = format!("/api/v1/artifacts/{digest}");
        let resp = self
            .request(reqwest::Method::HEAD, &path)
            .send()
            .await
            .map_err(|e| self.unreachable(e))?;
        match resp.status() {
            reqwest::StatusCode::NOT_FOUND => Ok(None),
            s if s.is_success() => resp
                .headers()
                .get(reqwest::header::CONTENT_LENGTH)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse().ok())
                .map(Some)
                .ok_or_else(|| ApiError::Decode {
                    method: "HEAD".into(),
                    path,
                    what: "artifact size (Content-Length)",
                    detail: "no Content-Length".into(),
                }),
            s => Err(ApiError::Status {
                status: s.as_u16(),
                message: format!("{s} from HEAD {path}"),
            }),
        }
    }

    /// Uploads the file at `path`, streamed from disk (never whole in
    /// memory), under `digest`, which the server checks; `size` is its
    /// length. `progress` is told the bytes sent so far. True if the server
    /// stored it now, false if it had it already. A transfer that makes no
    /// progress for a while fails with [`ApiError::Timeout`].
    pub async fn upload_file(
        &self,
        path: &Path,
        digest: &Digest,
        size: u64,
        progress: impl Fn(u64) + Send + Sync + 'static,
    ) -> Result<bool> {
        let file = tokio::fs::File::open(path)
            .await
            .map_err(|e| io_error(path, e))?;
        let activity = Activity::new();
        let state = (file, 0u64, progress, activity.clone(), path.to_path_buf());
        let chunks = futures::stream::try_unfold(
            state,
            |(mut file, sent, progress, seen, shown)| async move {
                let mut buf = vec![0u8; CHUNK_BYTES];
                let n = file.read(&mut buf).await.map_err(|e| io_error(&shown, e))?;
                seen.touch();
                if n == 0 {
                    return Ok::<_, ApiError>(None);
                }
                buf.truncate(n);
                let sent = sent + n as u64;
                progress(sent);
                Ok(Some((buf, (file, sent, progress, seen, shown))))
            },
        );
        let url_path = format!("/api/v1/artifacts/{digest}");
        let mut req = self
            .transfer
            .put(self.url(&url_path))
            .header(reqwest::header::CONTENT_LENGTH, size)
            .header(reqwest::header::CONTENT_TYPE, "application/octet-stream")
            .body(reqwest::Body::wrap_stream(chunks));
        if let Some(t) = &self.token {
            req = req.bearer_auth(t);
        }
        let resp = self
            .until_stalled(
                &format!("PUT {url_path}"),
                &activity,
                self.send(&url_path, req),
            )
            .await?;
        Ok(resp.status() == reqwest::StatusCode::CREATED)
    }

    /// Streams the artifact `digest` into `out`, hashing it on the way, and
    /// fails (`ApiError::Decode`) if the bytes are not the digest's: the
    /// caller must then discard what was written. `progress` is told the
    /// bytes received so far and the whole size, when the server said it.
    /// Returns the size.
    pub async fn download_to<W: AsyncWrite + Unpin>(
        &self,
        digest: &Digest,
        out: &mut W,
        out_path: &Path,
        mut progress: impl FnMut(u64, Option<u64>),
    ) -> Result<u64> {
        let path = format!("/api/v1/artifacts/{digest}");
        let activity = Activity::new();
        let fetch = async {
            let req = self.transfer.get(self.url(&path));
            let req = match &self.token {
                Some(t) => req.bearer_auth(t),
                None => req,
            };
            let mut resp = self.send(&path, req).await?;
            let total = resp.content_length();
            let mut hash = Sha256Writer::new();
            while let Some(chunk) = resp.chunk().await.map_err(|e| self.unreachable(e))? {
                activity.touch();
                hash.update(&chunk);
                out.write_all(&chunk)
                    .await
                    .map_err(|e| io_error(out_path, e))?;
                progress(hash.len(), total);
            }
            out.flush().await.map_err(|e| io_error(out_path, e))?;
            let size = hash.len();
            let got = hash.finish();
            if got != *digest {
                return Err(ApiError::Decode {
                    method: "GET".into(),
                    path: path.clone(),
                    what: "artifact with that digest",
                    detail: format!("the bytes hash to {got}"),
                });
            }
            Ok(size)
        };
        self.until_stalled(&format!("GET {path}"), &activity, fetch)
            .await
    }

    /// Runs a transfer, failing it once `activity` has not moved for the
    /// stall limit.
    async fn until_stalled<T>(
        &self,
        what: &str,
        activity: &Activity,
        transfer: impl Future<Output = Result<T>>,
    ) -> Result<T> {
        let mut transfer = std::pin::pin!(transfer);
        loop {
            let deadline = activity.last() + self.stall;
            tokio::select! {
                done = &mut transfer => return done,
                _ = tokio::time::sleep_until(deadline) => {
                    if activity.last() + self.stall <= Instant::now() {
                        return Err(ApiError::Timeout {
                            what: format!("{what} to make progress"),
                            after: self.stall,
                        });
                    }
                }
            }
        }
    }

    /// Polls `path` every `every` until `done` says the record ended, and
    /// returns it; `seen` gets every record read (progress display).
    /// `timeout` of `None` waits as long as it takes (a person pressing
    /// Ctrl-C ends it).
    pub async fn wait_for<T: DeserializeOwned>(
        &self,
        path: &str,
        every: Duration,
        timeout: Option<Duration>,
        mut seen: impl FnMut(&T),
        done: impl Fn(&T) -> bool,
    ) -> Result<T> {
        let deadline = timeout.map(|t| (tokio::time::Instant::now() + t, t));
        loop {
            let record: T = self.get(path).await?;
            seen(&record);
            if done(&record) {
                return Ok(record);
            }
            if let Some((at, after)) = deadline {
                if tokio::time::Instant::now() >= at {
                    return Err(ApiError::Timeout {
                        what: path.to_string(),
                        after,
                    });
                }
            }
            tokio::time::sleep(every).await;
        }
    }

    async fn call<T: DeserializeOwned>(
        &self,
        method: reqwest::Method,
        path: &str,
        req: reqwest::RequestBuilder,
    ) -> Result<T> {
        let resp = self.send(path, req).await?;
        let bytes = resp.bytes().await.map_err(|e| self.unreachable(e))?;
        // An empty body reads as `null`, so `()` and `Option<_>` decode it.
        let body: &[u8] = if bytes.is_empty() { b"null" } else { &bytes };
        serde_json::from_slice(body).map_err(|e| ApiError::Decode {
            method: method.to_string(),
            path: path.to_string(),
            what: std::any::type_name::<T>(),
            detail: e.to_string(),
        })
    }

    /// Sends `req`; a non-2xx answer becomes `ApiError::Status` with the
    /// server's message (and the field it names).
    async fn send(&self, path: &str, req: reqwest::RequestBuilder) -> Result<reqwest::Response> {
        let resp = req.send().await.map_err(|e| self.unreachable(e))?;
        let status = resp.status();
        if status.is_success() {
            return Ok(resp);
        }
        let bytes = resp.bytes().await.unwrap_or_default();
        let message = match serde_json::from_slice::<ErrorBody>(&bytes) {
            Ok(body) => body.error.to_string(),
            Err(_) if bytes.is_empty() => format!("{status} (no message) from {path}"),
            Err(_) => format!("{status}: {}", String::from_utf8_lossy(&bytes)),
        };
        Err(ApiError::Status {
            status: status.as_u16(),
            message,
        })
    }

    fn unreachable(&self, e: reqwest::Error) -> ApiError {
        ApiError::Unreachable {
            server: self.base.clone(),
            detail: e.to_string(),
        }
    }
}

/// Runs `check` every `every` until it returns `Some`; fails after
/// `timeout` (when given) saying what it waited for. The one poller behind
/// every wait of the CLI, the demo and the tests.
pub async fn poll_until<T, E, F, Fut>(
    what: &str,
    every: Duration,
    timeout: Option<Duration>,
    mut check: F,
) -> Result<T, E>
where
    E: From<ApiError>,
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Option<T>, E>>,
{
    let deadline = timeout.map(|t| (tokio::time::Instant::now() + t, t));
    loop {
        if let Some(v) = check().await? {
            return Ok(v);
        }
        if let Some((at, after)) = deadline {
            if tokio::time::Instant::now() >= at {
                return Err(ApiError::Timeout {
                    what: what.to_string(),
                    after,
                }
                .into());
            }
        }
        tokio::time::sleep(every).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_have_their_kinds() {
        let status = |status| ApiError::Status {
            status,
            message: String::new(),
        };
        for (code, kind) in [
            (400, ErrorKind::Invalid),
            (413, ErrorKind::Invalid),
            (422, ErrorKind::Invalid),
            (401, ErrorKind::Auth),
            (403, ErrorKind::Auth),
            (404, ErrorKind::NotFound),
            (409, ErrorKind::Conflict),
            (500, ErrorKind::Server),
            (503, ErrorKind::Server),
        ] {
            assert_eq!(status(code).kind(), kind, "{code}");
            assert_eq!(status(code).status(), Some(code));
        }
    }

    /// A server that sends headers and a little of the body, then nothing.
    async fn stalling_server() -> String {
        use tokio::io::AsyncReadExt as _;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let (mut conn, _) = listener.accept().await.unwrap();
            let mut buf = [0u8; 4096];
            let _ = conn.read(&mut buf).await;
            let _ = conn
                .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n0123456789")
                .await;
            tokio::time::sleep(Duration::from_secs(60)).await;
            drop(conn);
        });
        format!("http://{addr}")
    }

    #[tokio::test]
    async fn a_transfer_that_stops_moving_times_out_and_says_which() {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let base = stalling_server().await;
        let client = Client::new(&base, None, Duration::from_secs(5))
            .unwrap()
            .with_stall(Duration::from_millis(300));
        let mut out = Vec::new();
        let mut seen = 0;
        let digest = Digest::of(b"whatever");
        let e = client
            .download_to(&digest, &mut out, Path::new("out"), |n, total| {
                seen = n;
                assert_eq!(total, Some(100));
            })
            .await
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Timeout, "{e}");
        assert!(e.to_string().contains("to make progress"), "{e}");
        assert_eq!((seen, out.as_slice()), (10, &b"0123456789"[..]));
    }

    #[tokio::test]
    async fn a_poll_ends_with_the_value_or_a_timeout_naming_what() {
        let mut n = 0;
        let v = poll_until("three", Duration::from_millis(1), None, || {
            n += 1;
            let v = n;
            async move { Ok::<_, ApiError>((v == 3).then_some(v)) }
        })
        .await
        .unwrap();
        assert_eq!(v, 3);
        let e = poll_until::<(), ApiError, _, _>(
            "nothing",
            Duration::from_millis(1),
            Some(Duration::from_millis(5)),
            || async { Ok(None) },
        )
        .await
        .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Timeout);
        assert!(e.to_string().contains("waiting for nothing"), "{e}");
    }
}
