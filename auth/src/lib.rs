//! Who is calling the console API and what they may do: API tokens
//! ([`tokens`]), the route → permission table ([`permissions`]) and the
//! audit log ([`audit`]). The control plane's REST layer
//! (`control-plane/src/api/rest/authorize.rs`) is the one place that
//! applies them.

pub mod audit;
pub mod permissions;
pub mod tokens;
mod trees;

pub use trees::Trees;

use std::collections::BTreeSet;
use std::sync::atomic::AtomicU64;

use edgeloop_api::access::Role;

use edgeloop_errors::Error;

/// The caller, as authenticated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    /// `k-<n>` for an API token, `admin` for the bootstrap token.
    pub token_id: String,
    pub token_name: String,
    pub role: Role,
    /// `None`: every project.
    pub projects: Option<BTreeSet<String>>,
}

pub const BOOTSTRAP_ADMIN_ID: &str = "admin";

impl Principal {
    /// The data dir's `admin.token`: it keeps working beside API tokens, so
    /// a fresh control plane can be administered at all.
    pub fn bootstrap_admin() -> Principal {
        Principal {
            token_id: BOOTSTRAP_ADMIN_ID.into(),
            token_name: "bootstrap admin".into(),
            role: Role::Admin,
            projects: None,
        }
    }

    /// What records of changes (an alias's history, a sample's labeller) name.
    pub fn name(&self) -> &str {
        &self.token_id
    }

    pub fn sees(&self, project: &str) -> bool {
        self.projects.as_ref().is_none_or(|p| p.contains(project))
    }

    /// For a creation: the caller may only create in its own projects.
    pub fn may_create_in(&self, project: &str) -> Result<(), Error> {
        if self.sees(project) {
            Ok(())
        } else {
            Err(Error::PermissionDenied(format!(
                "token {} is not scoped to project {project:?}",
                self.token_id
            )))
        }
    }
}

/// A console API request the web console makes in-process for a session's
/// principal: `authorize` takes it instead of a bearer token, and checks
/// the role, the projects and the audit log exactly as for one.
#[derive(Debug, Clone)]
pub struct ConsoleCaller(pub Principal);

/// What `/metrics` reports about refusals (counts only, no identities).
#[derive(Debug, Default)]
pub struct SecurityCounters {
    /// Console calls with a missing, unknown, expired or revoked token.
    pub unauthenticated: AtomicU64,
    /// Console calls whose token lacked the role or the project.
    pub forbidden: AtomicU64,
    /// Telemetry, sketches, samples or status a device sent for a model
    /// version it was never assigned.
    pub foreign_device_data: AtomicU64,
    /// Sketches and samples refused over a device's per-model quota.
    pub device_over_quota: AtomicU64,
    /// Telemetry reports refused over a device's hourly byte rate.
    pub device_telemetry_throttled: AtomicU64,
}
