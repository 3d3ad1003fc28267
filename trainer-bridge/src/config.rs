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
}

impl BridgeSettings {
    /// Each field from `self` if set, else from `lower`.
    pub fn or(self, lower: BridgeSettings) -> BridgeSettings {
        BridgeSettings {
            data_dir: self.data_dir.or(lower.data_dir),
            control_plane: self.control_plane.or(lower.control_plane),
            bootstrap_token: self.bootstrap_token.or(lower.bootstrap_token),
            container_runtime: self.container_runtime.or(lower.container_runtime),
        }
    }
}

#[derive(Debug, Clone)]
pub struct BridgeConfig {
    pub member: MemberConfig,
    /// The local engine's container runtime; `None`: images are refused.
    pub container_runtime: Option<RuntimeKind>,
}

impl BridgeConfig {
    /// A bridge that runs no images.
    pub fn new(member: MemberConfig) -> BridgeConfig {
        BridgeConfig {
            member,
            container_runtime: None,
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
        Ok(BridgeConfig {
            member: MemberConfig::from_settings(MemberSettings {
                data_dir: s.data_dir,
                control_plane: s.control_plane,
                bootstrap_token: s.bootstrap_token,
            })?,
            container_runtime,
        })
    }
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
