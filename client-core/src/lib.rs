//! The client side that edge agents and trainer bridges share: parsing
//! bootstrap tokens, enrolling with a CSR, keeping the issued identity on disk,
//! building mTLS channels, the heartbeat loop with jittered backoff, and the
//! TLS listener for HTTP APIs (`https`).
//!
//! It lives in its own crate so the security-critical parts exist once; the
//! agent and the bridge differ only in which gRPC service they call ([`Role`]).

pub mod backoff;
pub mod channel;
pub mod endpoints;
pub mod gpu;
pub mod https;
pub mod identity;
pub mod images;
pub mod member;
pub mod session;
pub mod sled_open;
pub mod tls;
pub mod token;

pub use backoff::Backoff;
pub use channel::{MemberChannel, Membership};
pub use identity::{Identity, IdentityStore};
pub use member::{run_member, MemberConfig, MemberSettings};
pub use session::{
    enroll, ensure_identity, heartbeat_loop, renew, EnrollAttemptError, Role, SessionError,
};
pub use token::{BootstrapToken, TokenError};

/// Installs rustls' ring provider as the process default. Safe to call more
/// than once; every binary calls it at start.
pub fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// Cancels `shutdown` on SIGTERM or SIGINT: every binary's one shutdown path.
pub async fn shutdown_on_signals(shutdown: tokio_util::sync::CancellationToken) {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        tracing::error!("cannot install signal handlers");
        return;
    };
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM received"),
        _ = int.recv() => tracing::info!("SIGINT received"),
    }
    shutdown.cancel();
}

/// Logs to stderr; the level comes from `EDGELOOP_LOG` (default `info`).
pub fn init_tracing() {
    use std::io::IsTerminal as _;
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("EDGELOOP_LOG")
                .unwrap_or_else(|_| "info".into()),
        )
        // Colours for a person at a terminal; the journal and a container's
        // log get plain text.
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr)
        .init();
}
