//! `--store-url`: a PostgreSQL connection URL, checked when the config is
//! resolved, printed without its password.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use postgres::config::{Host, SslMode};

use super::tls::RustlsTls;

/// How long a connection attempt may take when the URL does not say
/// (`connect_timeout=`): a store call blocks its caller meanwhile.
const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum StoreUrlError {
    #[error("--store-url must start with postgres:// or postgresql:// (the default store is sled under --data-dir)")]
    Scheme,
    #[error("--store-url is not a valid PostgreSQL URL: {0}")]
    Invalid(String),
    #[error(
        "--store-url asks for TLS (sslmode=require, verify-ca or verify-full) but names no \
         sslrootcert: give the file of the CA certificate that signed the server's \
         (e.g. ?sslmode=require&sslrootcert=/etc/edgeloop/postgres-ca.pem); Edgeloop always \
         checks the server's certificate and name"
    )]
    RootCertMissing,
    #[error("--store-url's sslrootcert {path}: {reason}")]
    RootCert { path: PathBuf, reason: String },
}

/// A parsed `postgres://user:password@host:port/database?...` URL.
#[derive(Clone)]
pub struct PostgresUrl {
    raw: String,
    config: postgres::Config,
    /// TLS, verified against `sslrootcert`: always for `sslmode=require`
    /// and up, and for `prefer` when a root is named (the server may then
    /// still answer in clear, as libpq's `prefer` allows).
    tls: Option<RustlsTls>,
}

/// `raw` as the driver takes it: without `sslrootcert` (which it does not
/// know) and with libpq's `verify-ca`/`verify-full` as `require` (which,
/// with our connector, verifies as `verify-full` does). Returns the root
/// certificate's path too.
fn driver_url(raw: &str) -> (String, Option<PathBuf>) {
    let Some((base, query)) = raw.split_once('?') else {
        return (raw.to_string(), None);
    };
    let mut root = None;
    let mut kept = Vec::new();
    for pair in query.split('&') {
        match pair.split_once('=') {
            Some(("sslrootcert", path)) => root = Some(PathBuf::from(percent_decode(path))),
            Some(("sslmode", "verify-ca" | "verify-full")) => kept.push("sslmode=require"),
            _ => kept.push(pair),
        }
    }
    if kept.is_empty() {
        (base.to_string(), root)
    } else {
        (format!("{base}?{}", kept.join("&")), root)
    }
}

/// `%XX` escapes of a URL query value (a path with spaces, say); anything
/// malformed is kept as written.
fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (bytes[i], hex) {
            (b'%', Some(b)) => {
                out.push(b);
                i += 3;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn load_root(path: PathBuf) -> Result<RustlsTls, StoreUrlError> {
    let pem = std::fs::read(&path).map_err(|e| StoreUrlError::RootCert {
        path: path.clone(),
        reason: e.to_string(),
    })?;
    RustlsTls::from_root_pem(&pem).map_err(|reason| StoreUrlError::RootCert { path, reason })
}

impl PostgresUrl {
    pub fn parse(raw: &str) -> Result<Self, StoreUrlError> {
        if !(raw.starts_with("postgres://") || raw.starts_with("postgresql://")) {
            return Err(StoreUrlError::Scheme);
        }
        let (driver, root) = driver_url(raw);
        let mut config: postgres::Config = driver
            .parse()
            // The driver's message never repeats the password.
            .map_err(|e: postgres::Error| StoreUrlError::Invalid(e.to_string()))?;
        let tls = match (config.get_ssl_mode(), root) {
            (SslMode::Disable, _) | (SslMode::Prefer, None) => None,
            (SslMode::Require, None) => return Err(StoreUrlError::RootCertMissing),
            (_, Some(path)) => Some(load_root(path)?),
            (mode, None) => {
                return Err(StoreUrlError::Invalid(format!(
                    "sslmode {mode:?} is not supported"
                )))
            }
        };
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(DEFAULT_CONNECT_TIMEOUT);
        }
        if config.get_application_name().is_none() {
            config.application_name("edgeloop-control-plane");
        }
        Ok(Self {
            raw: raw.to_string(),
            config,
            tls,
        })
    }

    #[cfg(test)]
    fn config(&self) -> &postgres::Config {
        &self.config
    }

    /// A new connection, over TLS when the URL asks for it. Blocking: not
    /// for a tokio worker (the pool's threads and the tests' own call it).
    pub(crate) fn connect(&self) -> Result<postgres::Client, postgres::Error> {
        match &self.tls {
            Some(tls) => self.config.connect(tls.clone()),
            None => self.config.connect(postgres::NoTls),
        }
    }

    #[cfg(test)]
    fn tls(&self) -> Option<&RustlsTls> {
        self.tls.as_ref()
    }

    /// The URL as given, password included: for handing to a child process.
    pub fn expose(&self) -> &str {
        &self.raw
    }

    /// The database name (the user's name when the URL names none, as
    /// PostgreSQL itself defaults).
    pub fn database(&self) -> String {
        self.config
            .get_dbname()
            .or(self.config.get_user())
            .unwrap_or_default()
            .to_string()
    }

    /// The same server and credentials, another database.
    pub fn with_database(&self, name: &str) -> Result<Self, StoreUrlError> {
        let (base, query) = match self.raw.split_once('?') {
            Some((b, q)) => (b, Some(q)),
            None => (self.raw.as_str(), None),
        };
        let after_scheme = base.find("://").map_or(0, |i| i + 3);
        let base = match base[after_scheme..].find('/') {
            Some(i) => &base[..after_scheme + i],
            None => base,
        };
        let raw = match query {
            Some(q) => format!("{base}/{name}?{q}"),
            None => format!("{base}/{name}"),
        };
        Self::parse(&raw)
    }
}

/// `host:port/database`, never the password.
impl fmt::Display for PostgresUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let hosts: Vec<String> = self
            .config
            .get_hosts()
            .iter()
            .zip(
                self.config
                    .get_ports()
                    .iter()
                    .chain(std::iter::repeat(&5432)),
            )
            .map(|(h, p)| match h {
                Host::Tcp(h) => format!("{h}:{p}"),
                Host::Unix(path) => format!("{}:{p}", path.display()),
            })
            .collect();
        write!(f, "postgres://{}/{}", hosts.join(","), self.database())
    }
}

impl fmt::Debug for PostgresUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PostgresUrl({self})")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_parse_and_print_without_the_password() {
        let u = PostgresUrl::parse("postgres://edge:s3cret@127.0.0.1:55432/db1").unwrap();
        assert_eq!(u.to_string(), "postgres://127.0.0.1:55432/db1");
        assert!(!format!("{u:?}").contains("s3cret"));
        assert_eq!(u.database(), "db1");
        let other = u.with_database("db2").unwrap();
        assert_eq!(other.expose(), "postgres://edge:s3cret@127.0.0.1:55432/db2");
        let q = PostgresUrl::parse("postgresql://e:p@h/db?sslmode=disable").unwrap();
        assert_eq!(
            q.with_database("x").unwrap().expose(),
            "postgresql://e:p@h/x?sslmode=disable"
        );
        assert_eq!(
            PostgresUrl::parse("postgres://e@h")
                .unwrap()
                .with_database("x")
                .unwrap()
                .expose(),
            "postgres://e@h/x"
        );
    }

    #[test]
    fn bad_urls_and_tls_are_refused_with_reasons() {
        assert!(matches!(
            PostgresUrl::parse("/var/lib/edgeloop"),
            Err(StoreUrlError::Scheme)
        ));
        assert!(matches!(
            PostgresUrl::parse("postgres://h/db?sslmode=require"),
            Err(StoreUrlError::RootCertMissing)
        ));
        assert!(matches!(
            PostgresUrl::parse("postgres://h/db?sslmode=verify-full"),
            Err(StoreUrlError::RootCertMissing)
        ));
        let missing =
            PostgresUrl::parse("postgres://h/db?sslmode=require&sslrootcert=/nonexistent/ca.pem")
                .unwrap_err();
        assert!(
            matches!(&missing, StoreUrlError::RootCert { path, .. } if path.ends_with("ca.pem")),
            "{missing}"
        );
        let dir = tempfile::tempdir().unwrap();
        let junk = dir.path().join("junk.pem");
        std::fs::write(&junk, "not a certificate").unwrap();
        let err = PostgresUrl::parse(&format!(
            "postgres://h/db?sslmode=require&sslrootcert={}",
            junk.display()
        ))
        .unwrap_err();
        assert!(err.to_string().contains("no certificate"), "{err}");
        assert!(matches!(
            PostgresUrl::parse("postgres://h:notaport/db"),
            Err(StoreUrlError::Invalid(_))
        ));
        // prefer without a root connects in clear, as before.
        assert!(PostgresUrl::parse("postgres://h/db?sslmode=prefer")
            .unwrap()
            .tls()
            .is_none());
    }

    #[test]
    fn tls_urls_take_a_root_and_keep_it_across_databases() {
        let dir = tempfile::tempdir().unwrap();
        let ca = dir.path().join("ca dir").join("ca.pem");
        std::fs::create_dir_all(ca.parent().unwrap()).unwrap();
        let cert = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
        std::fs::write(&ca, cert.cert.pem()).unwrap();
        let escaped = ca.display().to_string().replace(' ', "%20");
        for mode in ["require", "verify-ca", "verify-full", "prefer"] {
            let raw = format!("postgres://e:p@localhost/db?sslmode={mode}&sslrootcert={escaped}&connect_timeout=3");
            let u = PostgresUrl::parse(&raw).unwrap_or_else(|e| panic!("{mode}: {e}"));
            assert!(u.tls().is_some(), "{mode}");
            assert_eq!(
                u.config().get_connect_timeout(),
                Some(&Duration::from_secs(3))
            );
            let other = u.with_database("x").unwrap();
            assert!(other.tls().is_some(), "{mode}: kept by with_database");
            assert!(
                other.expose().contains("sslrootcert="),
                "{}",
                other.expose()
            );
        }
        let off = PostgresUrl::parse(&format!(
            "postgres://h/db?sslmode=disable&sslrootcert={escaped}"
        ))
        .unwrap();
        assert!(off.tls().is_none(), "disable means clear");
        assert_eq!(percent_decode("a%20b%2"), "a b%2");
    }
}
