//! The bridge's settings: the member settings every enrolled process has,
//! and what only a bridge needs (the local engine's container runtime).
//! Flags win over `EDGELOOP_*` variables, which win over the TOML file.
//! The cluster engines (Slurm, Ray, Kubernetes) still take their settings
//! from the environment (see each engine's `from_env`).

use std::path::PathBuf;

use edgeloop_client_core::{MemberConfig, MemberSettings};
use serde::Deserialize;

use crate::engines::local::container::RuntimeKind;

#[derive(Debug, Clone, Default, clap::Args, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct BridgeSettings {
    /// Local state: the identity (key 0600), job directories, engine state.
    #[arg(long, env = "EDGELOOP_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
    /// gRPC URL of the control plane, e.g. https://cp.example:7443
    #[arg(long, env = "EDGELOOP_CONTROL_PLANE")]
    pub control_plane: Option<String>,
    /// One-time bootstrap token; needed only for the first start.
    #[arg(long, env = "EDGELOOP_BOOTSTRAP_TOKEN")]
    pub bootstrap_token: Option<String>,
    /// What runs a job's `image` on the local engine: `podman` or `docker`.
    /// Unset: the local engine refuses a job that names an image.
    #[arg(long, env = "EDGELOOP_CONTAINER_RUNTIME")]
    pub container_runtime: Option<String>,
    /// Host directories every container of the local engine gets,
    /// read-only at the same path (comma-separated absolute paths): the
    /// site's datasets and shared software, as clusters mount them.
    #[arg(long, env = "EDGELOOP_CONTAINER_MOUNTS")]
    pub container_mounts: Option<String>,
}

impl BridgeSettings {
    /// Each field from `self` if set, else from `lower`.
    pub fn or(self, lower: BridgeSettings) -> BridgeSettings {
        BridgeSettings {
            data_dir: self.data_dir.or(lower.data_dir),
            control_plane: self.control_plane.or(lower.control_plane),
            bootstrap_token: self.bootstrap_token.or(lower.bootstrap_token),
            container_runtime: self.container_runtime.or(lower.container_runtime),
            container_mounts: self.container_mounts.or(lower.container_mounts),
        }
    }
}

#[derive(Debug, Clone)]
pub struct BridgeConfig {
    pub member: MemberConfig,
    /// The local engine's container runtime; `None`: images are refused.
    pub container_runtime: Option<RuntimeKind>,
    /// Read-only in every container of the local engine.
    pub container_mounts: Vec<PathBuf>,
}

impl BridgeConfig {
    /// A bridge that runs no images.
    pub fn new(member: MemberConfig) -> BridgeConfig {
        BridgeConfig {
            member,
            container_runtime: None,
            container_mounts: Vec::new(),
        }
    }

    pub fn from_settings(s: BridgeSettings) -> anyhow::Result<BridgeConfig> {
        let container_runtime = s
            .container_runtime
            .as_deref()
            .filter(|v| !v.trim().is_empty())
            .map(RuntimeKind::parse)
            .transpose()
            .map_err(anyhow::Error::msg)?;
        let container_mounts = s
            .container_mounts
            .as_deref()
            .map(parse_mounts)
            .transpose()?
            .unwrap_or_default();
        Ok(BridgeConfig {
            member: MemberConfig::from_settings(MemberSettings {
                data_dir: s.data_dir,
                control_plane: s.control_plane,
                bootstrap_token: s.bootstrap_token,
            })?,
            container_runtime,
            container_mounts,
        })
    }
}

/// `--container-mounts`: absolute paths of directories that exist.
fn parse_mounts(value: &str) -> anyhow::Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    for word in value.split(',').map(str::trim).filter(|w| !w.is_empty()) {
        let path = PathBuf::from(word);
        if !path.is_absolute() || word.contains(':') {
            anyhow::bail!(
                "container mounts (--container-mounts, EDGELOOP_CONTAINER_MOUNTS): {word:?} is \
                 not an absolute path without ':'"
            );
        }
        if !path.is_dir() {
            anyhow::bail!(
                "container mounts (--container-mounts, EDGELOOP_CONTAINER_MOUNTS): {word:?} is \
                 not a directory on this machine"
            );
        }
        out.push(path);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(runtime: Option<&str>) -> BridgeSettings {
        BridgeSettings {
            data_dir: Some("/var/lib/edgeloop-bridge".into()),
            control_plane: Some("https://cp.example:7443".into()),
            bootstrap_token: None,
            container_runtime: runtime.map(str::to_string),
            container_mounts: None,
        }
    }

    #[test]
    fn the_container_runtime_is_podman_docker_or_none() {
        for (given, want) in [
            (None, None),
            (Some(""), None),
            (Some("podman"), Some(RuntimeKind::Podman)),
            (Some("docker"), Some(RuntimeKind::Docker)),
        ] {
            let c = BridgeConfig::from_settings(settings(given)).unwrap();
            assert_eq!(c.container_runtime, want, "{given:?}");
        }
        let e = BridgeConfig::from_settings(settings(Some("crio")))
            .unwrap_err()
            .to_string();
        assert!(e.contains("container") && e.contains("crio"), "{e}");
    }

    #[test]
    fn container_mounts_are_existing_absolute_directories() {
        let dir = std::env::temp_dir();
        let ok = format!("{}, /", dir.display());
        let c = BridgeConfig::from_settings(BridgeSettings {
            container_mounts: Some(ok),
            ..settings(Some("podman"))
        })
        .unwrap();
        assert_eq!(c.container_mounts, [dir, PathBuf::from("/")]);
        for bad in ["relative/dir", "/no/such/edgeloop/dir", "/tmp:/elsewhere"] {
            let e = BridgeConfig::from_settings(BridgeSettings {
                container_mounts: Some(bad.into()),
                ..settings(Some("podman"))
            })
            .unwrap_err()
            .to_string();
            assert!(e.contains("--container-mounts") && e.contains(bad), "{e}");
        }
    }

    #[test]
    fn flags_win_over_the_file_field_by_field() {
        let flags = BridgeSettings {
            container_runtime: Some("docker".into()),
            ..Default::default()
        };
        let file: BridgeSettings = toml::from_str(
            "data-dir = \"/d\"\ncontrol-plane = \"https://cp:7443\"\ncontainer-runtime = \"podman\"\n",
        )
        .unwrap();
        let merged = flags.or(file);
        assert_eq!(merged.container_runtime.as_deref(), Some("docker"));
        assert_eq!(merged.data_dir, Some(PathBuf::from("/d")));
        assert!(toml::from_str::<BridgeSettings>("container-runtimes = \"podman\"\n").is_err());
    }
}
