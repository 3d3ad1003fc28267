//! Devices and cluster bridges ("members"), one room per concern:
//! - `record`: the member record, its reported capabilities, online or
//!   not, the console's view, reads and label edits;
//! - `tokens`: the one-time bootstrap tokens that enroll members;
//! - `enrol`: a token and a CSR become a member and its certificate;
//! - `authorize`: may this certificate call as this member (asking
//!   [`super::renewal`] once what the certificate may do);
//! - `revoke`: a member's certificates stop working for good.
//!
//! A heartbeat's own work (is a write due, batched or now) is
//! [`super::presence`]'s. The decisions are pure functions of the record
//! and `now`; the functions that touch the store are thin.

mod authorize;
mod enrol;
mod record;
mod revoke;
mod tokens;

/// The member kinds, states and request bodies are the console API's types.
pub use edgeloop_api::fleet::{
    CreateToken, CreatedToken, MemberKind, MemberStatus, MemberView, TokenState, TokenView,
};

pub use authorize::{authorize, Authorized};
pub use enrol::{enroll, retried, Enrollment};
pub use record::{
    get, member_status, member_view, set_labels, CapabilitiesRecord, GpuRecord, Member,
};
pub use revoke::revoke;
pub use tokens::{
    create_token, token_refusal, token_state, token_view, BootstrapTokenRecord, EnrolledKey,
    DEFAULT_TOKEN_TTL, MAX_TOKEN_TTL, MIN_TOKEN_TTL,
};

#[cfg(test)]
pub(crate) mod tests;
