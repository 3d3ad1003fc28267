//! Running as a fleet member: the settings and the main loop that the edge
//! agent and the trainer bridge share (enroll once, then heartbeat until
//! shutdown, reconnecting with backoff).

use std::path::{Path, PathBuf};

use anyhow::Context as _;
use edgeloop_proto::common::v1::{Capabilities, Gpu};
use serde::de::DeserializeOwned;
use serde::Deserialize;
use tokio_util::sync::CancellationToken;

use crate::gpu::LocalGpus;
use crate::session::{ensure_identity, heartbeat_loop, Role, SessionError};
use crate::{Backoff, IdentityStore, Membership};

/// Settings from flags, `EDGELOOP_*` env vars, or a TOML file (kebab-case).
#[derive(Debug, Clone, Default, clap::Args, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct MemberSettings {
    /// Local state: the identity (key 0600) and what the member keeps.
    #[arg(long, env = "EDGELOOP_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
    /// gRPC URL of the control plane, e.g. https://cp.example:7443
    #[arg(long, env = "EDGELOOP_CONTROL_PLANE")]
    pub control_plane: Option<String>,
    /// One-time bootstrap token; needed only for the first start.
    #[arg(long, env = "EDGELOOP_BOOTSTRAP_TOKEN")]
    pub bootstrap_token: Option<String>,
}

impl MemberSettings {
    /// Each field from `self` if set, else from `lower`.
    pub fn or(self, lower: MemberSettings) -> MemberSettings {
        MemberSettings {
            data_dir: self.data_dir.or(lower.data_dir),
            control_plane: self.control_plane.or(lower.control_plane),
            bootstrap_token: self.bootstrap_token.or(lower.bootstrap_token),
        }
    }
}

/// Reads a TOML settings file, or the defaults when there is none.
pub fn settings_file<T: DeserializeOwned + Default>(path: Option<&Path>) -> anyhow::Result<T> {
    let Some(path) = path else {
        return Ok(T::default());
    };
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    toml::from_str(&text).with_context(|| format!("parsing {}", path.display()))
}

#[derive(Debug, Clone)]
pub struct MemberConfig {
    pub data_dir: PathBuf,
    pub control_plane: String,
    pub bootstrap_token: Option<String>,
    pub backoff: Backoff,
}

impl MemberConfig {
    pub fn from_settings(s: MemberSettings) -> anyhow::Result<MemberConfig> {
        let control_plane = s
            .control_plane
            .context("--control-plane (or EDGELOOP_CONTROL_PLANE) is required")?;
        crate::endpoints::parse(&control_plane)?;
        Ok(MemberConfig {
            data_dir: s
                .data_dir
                .context("--data-dir (or EDGELOOP_DATA_DIR) is required")?,
            control_plane,
            bootstrap_token: s.bootstrap_token,
            backoff: Backoff::default(),
        })
    }
}

/// The host facts every member reports.
// statvfs counts are 32-bit on some edge targets, so the conversions stay.
#[allow(clippy::useless_conversion)]
/// What this host is: OS, architecture, name, free disk, and its NVIDIA
/// GPUs (one entry per product, with the count).
pub fn host_capabilities(data_dir: &Path, version: &str, gpus: &LocalGpus) -> Capabilities {
    let mut by_model: Vec<Gpu> = Vec::new();
    for g in &gpus.gpus {
        match by_model.iter_mut().find(|m| m.model == g.name) {
            Some(m) => m.count += 1,
            None => by_model.push(Gpu {
                model: g.name.clone(),
                memory_bytes: g.memory_bytes,
                count: 1,
            }),
        }
    }
    let mut extra = std::collections::HashMap::new();
    if let Some(r) = &gpus.l4t_release {
        extra.insert("l4t_release".to_string(), r.clone());
    }
    Capabilities {
        gpus: by_model,
        extra,
        driver_version: gpus.driver_version.clone().unwrap_or_default(),
        cuda_version: gpus.cuda_version.clone().unwrap_or_default(),
        agent_version: version.to_string(),
        os: std::env::consts::OS.to_string(),
        arch: std::env::consts::ARCH.to_string(),
        hostname: nix::unistd::gethostname()
            .ok()
            .and_then(|h| h.into_string().ok())
            .unwrap_or_default(),
        free_disk_bytes: nix::sys::statvfs::statvfs(data_dir)
            .map(|s| u64::from(s.blocks_available()).saturating_mul(u64::from(s.fragment_size())))
            .unwrap_or(0),
        ..Default::default()
    }
}

pub fn create_private_dir(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
}

/// Enrolls if needed, then heartbeats until `shutdown`, renewing the
/// certificate when the control plane says so. `membership` gets the
/// identity once there is one, for the member's other tasks to call
/// through. An error means the control plane refused us (bad token,
/// revoked): retrying cannot fix that.
pub async fn run_member(
    role: Role,
    config: &MemberConfig,
    membership: &Membership,
    capabilities: Capabilities,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    crate::install_crypto_provider();
    create_private_dir(&config.data_dir)
        .with_context(|| format!("creating data dir {}", config.data_dir.display()))?;
    let store = IdentityStore::new(&config.data_dir);
    let identity = match ensure_identity(
        role,
        &config.control_plane,
        config.bootstrap_token.as_deref(),
        &store,
        capabilities.clone(),
        config.backoff,
        &shutdown,
    )
    .await
    {
        Err(SessionError::Cancelled) => return Ok(()),
        other => other?,
    };
    membership
        .set_identity(identity)
        .context("the control-plane URL")?;
    heartbeat_loop(
        role,
        membership,
        tokio::sync::watch::channel(capabilities).1,
        config.backoff,
        shutdown,
    )
    .await?;
    Ok(())
}
