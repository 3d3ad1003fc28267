//! The console API as the demo uses it: `edgeloop_api::Client` with the
//! admin token, each failure naming the method and path.

use anyhow::Context as _;
use edgeloop_models::Digest;
use serde::de::DeserializeOwned;
use serde::Serialize;

use edgeloop_api::client::poll_until;

#[derive(Clone)]
pub struct Console {
    client: edgeloop_api::Client,
    base: String,
}

impl Console {
    pub fn new(base: String, token: String) -> anyhow::Result<Console> {
        Ok(Console {
            base: base.clone(),
            client: edgeloop_api::Client::new(
                &base,
                Some(token),
                std::time::Duration::from_secs(60),
            )?,
        })
    }

    /// The control plane's HTTP base URL (the web console is under `/ui/`).
    pub fn base(&self) -> &str {
        &self.base
    }

    /// A GET decoded into its view.
    pub async fn get<T: DeserializeOwned>(&self, path: &str) -> anyhow::Result<T> {
        self.client
            .get(path)
            .await
            .with_context(|| format!("GET {path}"))
    }

    pub async fn post<T: DeserializeOwned, B: Serialize>(
        &self,
        path: &str,
        body: B,
    ) -> anyhow::Result<T> {
        self.client
            .post(path, &body)
            .await
            .with_context(|| format!("POST {path}"))
    }

    pub async fn put<T: DeserializeOwned, B: Serialize>(
        &self,
        path: &str,
        body: B,
    ) -> anyhow::Result<T> {
        self.client
            .put(path, &body)
            .await
            .with_context(|| format!("PUT {path}"))
    }

    pub async fn upload(&self, bytes: Vec<u8>) -> anyhow::Result<Digest> {
        self.client
            .upload(bytes)
            .await
            .context("uploading an artifact")
    }

    pub async fn download(&self, digest: &Digest) -> anyhow::Result<Vec<u8>> {
        self.client
            .download(digest)
            .await
            .with_context(|| format!("downloading artifact {digest}"))
    }
}

/// Polls `check` every 250 ms until it returns `Some`, or fails after
/// `timeout` saying what it waited for.
pub async fn wait_for<T, F, Fut>(
    what: &str,
    timeout: std::time::Duration,
    check: F,
) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<Option<T>>>,
{
    poll_until(
        what,
        std::time::Duration::from_millis(250),
        Some(timeout),
        check,
    )
    .await
}
