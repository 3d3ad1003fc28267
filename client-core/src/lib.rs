//! The client side that edge agents and trainer bridges share: parsing
//! bootstrap tokens, enrolling with a CSR, keeping the issued identity on disk,
//! building mTLS channels, and the heartbeat loop with jittered backoff.
//!
//! It lives in its own crate so the security-critical parts exist once; the
//! agent and the bridge differ only in which gRPC service they call ([`Role`]).

pub mod backoff;
pub mod identity;
pub mod session;
pub mod tls;
pub mod token;

pub use backoff::Backoff;
pub use identity::{Identity, IdentityStore};
pub use session::{enroll, ensure_identity, heartbeat_loop, EnrollAttemptError, Role, SessionError};
pub use token::{BootstrapToken, TokenError};

/// Installs rustls' ring provider as the process default. Safe to call more
/// than once; every binary calls it at start.
pub fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}
