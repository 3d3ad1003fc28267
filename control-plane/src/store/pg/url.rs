//! `--store-url`: a PostgreSQL connection URL, checked when the config is
//! resolved, printed without its password.

use std::fmt;
use std::time::Duration;

use postgres::config::{Host, SslMode};

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
        "--store-url asks for sslmode=require, but this build connects to PostgreSQL without TLS; \
         use sslmode=disable (or prefer, which then connects in clear) on a trusted network or \
         through a local TLS tunnel"
    )]
    TlsUnsupported,
}

/// A parsed `postgres://user:password@host:port/database?...` URL.
#[derive(Clone)]
pub struct PostgresUrl {
    raw: String,
    config: postgres::Config,
}

impl PostgresUrl {
    pub fn parse(raw: &str) -> Result<Self, StoreUrlError> {
        if !(raw.starts_with("postgres://") || raw.starts_with("postgresql://")) {
            return Err(StoreUrlError::Scheme);
        }
        let mut config: postgres::Config = raw
            .parse()
            // The driver's message never repeats the password.
            .map_err(|e: postgres::Error| StoreUrlError::Invalid(e.to_string()))?;
        match config.get_ssl_mode() {
            SslMode::Disable | SslMode::Prefer => {}
            _ => return Err(StoreUrlError::TlsUnsupported),
        }
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(DEFAULT_CONNECT_TIMEOUT);
        }
        if config.get_application_name().is_none() {
            config.application_name("edgeloop-control-plane");
        }
        Ok(Self {
            raw: raw.to_string(),
            config,
        })
    }

    pub(in crate::store) fn config(&self) -> &postgres::Config {
        &self.config
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
            Err(StoreUrlError::TlsUnsupported)
        ));
        assert!(matches!(
            PostgresUrl::parse("postgres://h:notaport/db"),
            Err(StoreUrlError::Invalid(_))
        ));
        PostgresUrl::parse("postgres://h/db?sslmode=prefer").unwrap();
    }
}
