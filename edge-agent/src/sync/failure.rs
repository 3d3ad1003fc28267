//! Why an assignment ended `Failed` (or `RolledBack`): the reason a device
//! reports, one variant per cause an operator acts on differently.

use edgeloop_models::Digest;

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Failure {
    #[error("invalid assignment: {0}")]
    InvalidAssignment(String),
    #[error("bad digest: {what} {expected} downloaded as {actual}")]
    BadDigest {
        what: &'static str,
        expected: Digest,
        actual: Digest,
    },
    #[error("bad size: {what} {digest} is {actual} bytes, expected {expected}")]
    BadSize {
        what: &'static str,
        digest: Digest,
        expected: u64,
        actual: u64,
    },
    #[error("bad signature: {0}")]
    BadSignature(String),
    #[error("the manifest does not match the assignment: {0}")]
    ManifestMismatch(String),
    #[error(
        "unsigned: version {version} has no signed manifest and this device does not allow unsigned models"
    )]
    Unsigned { version: String },
    #[error("no space: {needed} bytes needed in {dir}, {free} free")]
    NoSpace { dir: String, needed: u64, free: u64 },
    #[error("probe inputs unusable: {0}")]
    ProbeInputs(String),
    #[error("download refused by the control plane: {0}")]
    Refused(String),
    #[error("download timed out after {seconds}s")]
    TimedOut { seconds: u64 },
    #[error("activation failed: {0}")]
    Activation(String),
    /// Anti-rollback: the device served a version whose signed manifest set
    /// a floor, and this one is below it without a signed rollback.
    #[error("below the floor: version {version} is older than {floor}, the lowest this device may run (a signed manifest set it); only a manifest signed as a rollback goes below")]
    BelowFloor { version: String, floor: String },
    #[error("local storage: {0}")]
    Storage(String),
}

impl Failure {
    /// Whether trying the same content again must fail the same way (a
    /// signature, a manifest, the model itself), as opposed to depending on
    /// the moment (the network, the disk, a tampered partial file). Only
    /// permanent failures are remembered across restarts.
    pub fn is_permanent(&self) -> bool {
        match self {
            Failure::InvalidAssignment(_)
            | Failure::BadSignature(_)
            | Failure::ManifestMismatch(_)
            | Failure::Unsigned { .. }
            | Failure::ProbeInputs(_)
            | Failure::BelowFloor { .. }
            | Failure::Activation(_) => true,
            Failure::BadDigest { .. }
            | Failure::BadSize { .. }
            | Failure::NoSpace { .. }
            | Failure::Refused(_)
            | Failure::TimedOut { .. }
            | Failure::Storage(_) => false,
        }
    }

    pub(crate) fn storage(what: &str, e: impl std::fmt::Display) -> Failure {
        Failure::Storage(format!("{what}: {e}"))
    }
}
