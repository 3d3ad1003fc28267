//! Jobs with an `image` on the local engine: each process runs in a
//! container of the configured runtime (`EDGELOOP_CONTAINER_RUNTIME`:
//! `podman` or `docker`), started in the foreground by the same exit-code
//! wrapper as a host process, so status, logs and a restarted bridge's
//! re-adoption work as they do without an image.
//!
//! - The image is pinned before the job's first attempt ([`ContainerRuntime::pin`]):
//!   to its ID, or to the manifest digest the reference names. Every attempt
//!   runs the pin, so a tag moved since changes nothing.
//! - The job's directories (its working directory, the checkpoint directory,
//!   the checkpoint it resumes from) are bind-mounted at the same paths, so
//!   the contract's `EDGELOOP_*` paths mean the same inside; the network is
//!   the host's, so the progress URL on `127.0.0.1` is reachable.
//! - Environment values pass by name (`-e KEY`, the value from the
//!   runtime's own environment): no value shows on a command line.
//! - GPUs: the allocated devices through CDI (`--device nvidia.com/gpu=N`)
//!   where a CDI spec names them, else the legacy `--gpus device=N,...`.
//!   Inside, they are numbered from 0.
//! - `--init`: the job's process gets SIGTERM on cancel as it would outside
//!   a container (a trainer that checkpoints on SIGTERM still can).

use std::path::{Path, PathBuf};

use edgeloop_api::images::{check_reference, without_digest, ContainerWay, PinKind, PinnedImage};
use edgeloop_models::Digest;

use crate::engines::{EngineError, Launch};

/// Names the runtime the local engine runs images with (the variable of
/// the bridge's `--container-runtime`).
pub const RUNTIME_ENV: &str = "EDGELOOP_CONTAINER_RUNTIME";

/// The runtime's own settings in the bridge's environment, which the
/// runtime's process gets (the job's processes start from a cleared
/// environment): Podman's config files, Docker's daemon and client config.
const RUNTIME_SETTINGS: [&str; 6] = [
    "CONTAINERS_CONF",
    "CONTAINERS_STORAGE_CONF",
    "CONTAINERS_REGISTRIES_CONF",
    "XDG_RUNTIME_DIR",
    "DOCKER_HOST",
    "DOCKER_CONFIG",
];

/// Where CDI specs live (the CDI specification's two directories).
const CDI_DIRS: [&str; 2] = ["/etc/cdi", "/var/run/cdi"];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RuntimeKind {
    Podman,
    Docker,
}

impl RuntimeKind {
    pub fn parse(value: &str) -> Result<RuntimeKind, String> {
        match value.trim() {
            "podman" => Ok(RuntimeKind::Podman),
            "docker" => Ok(RuntimeKind::Docker),
            other => Err(format!(
                "container runtime (--container-runtime, {RUNTIME_ENV}): {other:?} is not one \
                 this bridge runs (podman or docker)"
            )),
        }
    }

    fn program(self) -> &'static str {
        match self {
            RuntimeKind::Podman => "podman",
            RuntimeKind::Docker => "docker",
        }
    }

    /// The pool fact this runtime is.
    pub fn way(self) -> ContainerWay {
        match self {
            RuntimeKind::Podman => ContainerWay::Podman,
            RuntimeKind::Docker => ContainerWay::Docker,
        }
    }
}

/// How allocated GPUs reach a container.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GpuMode {
    /// `--device nvidia.com/gpu=N` (the NVIDIA Container Toolkit's CDI spec,
    /// `nvidia-ctk cdi generate`).
    Cdi,
    /// `--gpus device=N,...` (the toolkit's runtime hook).
    Legacy,
}

impl GpuMode {
    /// CDI where a spec on this machine names `nvidia.com/gpu` devices.
    pub fn detect() -> GpuMode {
        let names_gpus = |dir: &str| {
            std::fs::read_dir(dir).ok().is_some_and(|entries| {
                entries.flatten().any(|e| {
                    std::fs::read_to_string(e.path()).is_ok_and(|t| t.contains("nvidia.com/gpu"))
                })
            })
        };
        if CDI_DIRS.iter().any(|d| names_gpus(d)) {
            GpuMode::Cdi
        } else {
            GpuMode::Legacy
        }
    }
}

#[derive(Debug, Clone)]
pub struct ContainerRuntime {
    pub kind: RuntimeKind,
    pub gpus: GpuMode,
    /// Host directories every container gets read-only at the same path
    /// (the bridge's `--container-mounts`).
    pub site_mounts: Vec<PathBuf>,
}

/// One process's container, as [`ContainerRuntime::run_args`] starts it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerRun<'a> {
    /// Unique per attempt and process, so a cancel can name it.
    pub name: &'a str,
    /// The pinned image, as the runtime names it ([`PinnedImage::runnable`]).
    pub image: &'a str,
    pub workdir: &'a Path,
    /// Host directories mounted at the same path.
    pub mounts: &'a [PathBuf],
    /// The variables passed in by name.
    pub env_keys: Vec<&'a str>,
    /// The host's GPU indexes this process holds.
    pub gpus: &'a [u32],
    pub command: &'a [String],
}

impl ContainerRuntime {
    /// A runtime of `kind`, with GPUs passed the way this machine is set
    /// up for (see [`GpuMode::detect`]).
    pub fn new(kind: RuntimeKind) -> ContainerRuntime {
        ContainerRuntime {
            kind,
            gpus: GpuMode::detect(),
            site_mounts: Vec::new(),
        }
    }

    /// The runtime with `mounts` read-only in every container.
    pub fn with_site_mounts(self, mounts: Vec<PathBuf>) -> ContainerRuntime {
        ContainerRuntime {
            site_mounts: mounts,
            ..self
        }
    }

    pub fn program(&self) -> &'static str {
        self.kind.program()
    }

    /// The runtime's settings from the bridge's environment, for the
    /// runtime's process (never passed into the container).
    pub fn settings(&self) -> Vec<(&'static str, String)> {
        RUNTIME_SETTINGS
            .iter()
            .filter_map(|k| std::env::var(k).ok().map(|v| (*k, v)))
            .collect()
    }

    /// The ID of the local image `reference` names (a name, an ID, or
    /// `name@sha256:...`); `None` when the runtime has no such image.
    async fn image_id(&self, reference: &str) -> Result<Result<Digest, String>, EngineError> {
        let out = tokio::process::Command::new(self.program())
            .args(["image", "inspect", "--format", "{{.Id}}", reference])
            .stdin(std::process::Stdio::null())
            .output()
            .await
            .map_err(|e| {
                EngineError::Unavailable(format!(
                    "{RUNTIME_ENV}: cannot run {}: {e}",
                    self.program()
                ))
            })?;
        let stdout = String::from_utf8_lossy(&out.stdout);
        // Docker writes `sha256:<hex>`, Podman the hex alone.
        let id = stdout.trim().trim_start_matches("sha256:");
        if !out.status.success() || id.is_empty() {
            return Ok(Err(String::from_utf8_lossy(&out.stderr).trim().to_string()));
        }
        id.parse::<Digest>().map(Ok).map_err(|e| {
            EngineError::Protocol(format!(
                "{} image inspect gave the ID {id:?}: {e}",
                self.program()
            ))
        })
    }

    /// Pins `reference` to what this runtime has (see [`crate::engines::Engine::pin_image`]):
    /// `earlier` if its image is still here; else the manifest digest the
    /// reference names, or the ID of the image its tag names now. Nothing
    /// is pulled: the image is the team's, built or loaded on this machine.
    pub async fn pin(
        &self,
        reference: &str,
        earlier: Option<&PinnedImage>,
    ) -> Result<PinnedImage, EngineError> {
        if let Some(pin) = earlier {
            return match self.image_id(&pin.runnable()).await? {
                Ok(id) if pin.kind == PinKind::Manifest || id == pin.digest => Ok(pin.clone()),
                Ok(id) => Err(EngineError::Refused(format!(
                    "image: the job is pinned to {pin}, but {} here names the image sha256:{id}",
                    pin.runnable()
                ))),
                Err(why) => Err(EngineError::Refused(format!(
                    "image: the job is pinned to {pin} (its first attempt ran it), and {} has \
                     no such image on this machine ({why}); every attempt runs the pinned \
                     image, never what the tag names now: load that image here, or submit a \
                     new job",
                    self.program()
                ))),
            };
        }
        let named =
            check_reference(reference).map_err(|e| EngineError::Refused(format!("image: {e}")))?;
        match (self.image_id(reference).await?, named) {
            (Ok(_), Some(digest)) => Ok(PinnedImage {
                reference: reference.to_string(),
                digest,
                kind: PinKind::Manifest,
            }),
            (Ok(id), None) => Ok(PinnedImage {
                reference: reference.to_string(),
                digest: id,
                kind: PinKind::ImageId,
            }),
            (Err(why), Some(digest)) => Err(EngineError::Refused(format!(
                "image: {} has no image {:?} with the digest sha256:{digest} on this machine \
                 ({why}); nothing is pulled",
                self.program(),
                without_digest(reference)
            ))),
            (Err(why), None) => Err(EngineError::Refused(format!(
                "image: {reference:?} is not an image {} has on this machine ({why}); nothing \
                 is pulled: build or load it here first",
                self.program()
            ))),
        }
    }

    /// Exports `image`'s root filesystem into `into` (a directory it
    /// creates), once: an existing `into` is taken as done. Written beside
    /// it first and renamed, so a half export is never used.
    pub async fn export_rootfs(&self, image: &str, into: &Path) -> Result<(), EngineError> {
        if into.is_dir() {
            return Ok(());
        }
        let parent = into
            .parent()
            .ok_or_else(|| EngineError::Refused(format!("{} has no parent", into.display())))?;
        std::fs::create_dir_all(parent)?;
        let partial = parent.join(format!(".partial-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&partial);
        std::fs::create_dir_all(&partial)?;
        let run = |args: Vec<String>| async move {
            let out = tokio::process::Command::new(self.program())
                .args(&args)
                .stdin(std::process::Stdio::null())
                .output()
                .await
                .map_err(|e| EngineError::Unavailable(format!("{}: {e}", self.program())))?;
            if out.status.success() {
                Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
            } else {
                Err(EngineError::Unavailable(format!(
                    "{} {}: {}",
                    self.program(),
                    args.join(" "),
                    String::from_utf8_lossy(&out.stderr).trim()
                )))
            }
        };
        let container = run(vec!["create".into(), image.into(), "/bin/true".into()]).await?;
        let tar = partial.with_extension("tar");
        let exported = run(vec![
            "export".into(),
            "--output".into(),
            tar.to_string_lossy().into_owned(),
            container.clone(),
        ])
        .await;
        let _ = run(vec!["rm".into(), "--force".into(), container]).await;
        exported?;
        let untar = tokio::process::Command::new("tar")
            .arg("-xf")
            .arg(&tar)
            .arg("-C")
            .arg(&partial)
            .status()
            .await?;
        let _ = std::fs::remove_file(&tar);
        if !untar.success() {
            let _ = std::fs::remove_dir_all(&partial);
            return Err(EngineError::Unavailable(format!(
                "unpacking {image}'s root filesystem failed"
            )));
        }
        if let Err(e) = std::fs::rename(&partial, into) {
            let _ = std::fs::remove_dir_all(&partial);
            // Another attempt exported the same image first.
            if !into.is_dir() {
                return Err(e.into());
            }
        }
        Ok(())
    }

    /// The runtime's arguments that run `run` in the foreground (the
    /// program first).
    pub fn run_args(&self, run: &ContainerRun<'_>) -> Vec<String> {
        let path = |p: &Path| p.to_string_lossy().into_owned();
        let mut args: Vec<String> = vec![
            self.program().into(),
            "run".into(),
            "--rm".into(),
            "--init".into(),
            "--name".into(),
            run.name.into(),
            "--network".into(),
            "host".into(),
        ];
        for m in run.mounts {
            args.push("--volume".into());
            args.push(format!("{0}:{0}", path(m)));
        }
        // Nested in either direction is fine (the runtime mounts parents
        // first); the same destination twice is not.
        for m in self.site_mounts.iter().filter(|m| !run.mounts.contains(m)) {
            args.push("--volume".into());
            args.push(format!("{0}:{0}:ro", path(m)));
        }
        args.push("--workdir".into());
        args.push(path(run.workdir));
        for k in &run.env_keys {
            args.push("--env".into());
            args.push((*k).to_string());
        }
        if !run.gpus.is_empty() {
            match self.gpus {
                GpuMode::Cdi => {
                    for g in run.gpus {
                        args.push("--device".into());
                        args.push(format!("nvidia.com/gpu={g}"));
                    }
                }
                GpuMode::Legacy => {
                    let list: Vec<String> = run.gpus.iter().map(u32::to_string).collect();
                    args.push("--gpus".into());
                    args.push(format!("device={}", list.join(",")));
                }
            }
        }
        args.push(run.image.into());
        args.extend(run.command.iter().cloned());
        args
    }

    /// Removes the container `name` (stopping it with SIGTERM, then SIGKILL
    /// after `grace_seconds`); nothing when it is gone already.
    /// Whether the runtime says it is gone.
    pub async fn remove(&self, name: &str, grace_seconds: u32) -> bool {
        tokio::process::Command::new(self.program())
            .args(["rm", "--force", "--time", &grace_seconds.to_string(), name])
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .await
            .is_ok_and(|s| s.success())
    }
}

/// The host directories a job's processes need at the same path inside a
/// container, on every engine that mounts them: the working directory, the
/// contract's checkpoint directory and the directory of the checkpoint it
/// resumes from, and `extra`.
pub fn job_mounts(launch: &Launch, extra: &[&Path]) -> Vec<PathBuf> {
    let contract = |key: &str| launch.env.get(key).filter(|v| !v.is_empty()).map(Path::new);
    let checkpoints = contract(crate::launch::CHECKPOINT_DIR);
    let resume = contract(crate::launch::RESUME_FROM).and_then(Path::parent);
    let paths: Vec<&Path> = checkpoints
        .into_iter()
        .chain(resume)
        .chain(extra.iter().copied())
        .collect();
    mounts(&launch.workdir, &paths)
}

/// The host directories a process needs at the same path: its working
/// directory and the directories the contract's paths name, without one
/// that another already contains.
pub fn mounts(workdir: &Path, contract_paths: &[&Path]) -> Vec<PathBuf> {
    let mut all: Vec<PathBuf> = std::iter::once(workdir)
        .chain(contract_paths.iter().copied())
        .filter(|p| p.is_absolute() && !p.as_os_str().is_empty())
        .map(Path::to_path_buf)
        .collect();
    all.sort();
    all.dedup();
    let mut out: Vec<PathBuf> = Vec::new();
    for p in all {
        if !out.iter().any(|kept| p.starts_with(kept)) {
            out.push(p);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn podman(gpus: GpuMode) -> ContainerRuntime {
        ContainerRuntime {
            kind: RuntimeKind::Podman,
            gpus,
            site_mounts: vec![],
        }
    }

    #[test]
    fn the_runtime_is_podman_or_docker_and_names_the_setting_otherwise() {
        assert_eq!(RuntimeKind::parse("podman").unwrap(), RuntimeKind::Podman);
        assert_eq!(
            RuntimeKind::parse(" docker\n").unwrap(),
            RuntimeKind::Docker
        );
        let e = RuntimeKind::parse("crio").unwrap_err().to_string();
        assert!(e.contains(RUNTIME_ENV) && e.contains("crio"), "{e}");
    }

    #[test]
    fn a_run_mounts_the_job_passes_env_by_name_and_runs_the_pinned_image() {
        let command = vec!["python".to_string(), "train.py".to_string()];
        let mounts = vec![PathBuf::from("/jobs/j-1")];
        let run = ContainerRun {
            name: "edgeloop-j-1-a1-0",
            image: "sha256:abc",
            workdir: Path::new("/jobs/j-1/src"),
            mounts: &mounts,
            env_keys: vec!["EDGELOOP_JOB_ID", "SECRET"],
            gpus: &[],
            command: &command,
        };
        let args = podman(GpuMode::Cdi).run_args(&run);
        assert_eq!(
            args,
            [
                "podman",
                "run",
                "--rm",
                "--init",
                "--name",
                "edgeloop-j-1-a1-0",
                "--network",
                "host",
                "--volume",
                "/jobs/j-1:/jobs/j-1",
                "--workdir",
                "/jobs/j-1/src",
                "--env",
                "EDGELOOP_JOB_ID",
                "--env",
                "SECRET",
                "sha256:abc",
                "python",
                "train.py"
            ]
        );
    }

    #[test]
    fn gpus_go_in_through_cdi_or_the_legacy_flag() {
        let command = vec!["t".to_string()];
        let run = ContainerRun {
            name: "n",
            image: "i",
            workdir: Path::new("/w"),
            mounts: &[],
            env_keys: vec![],
            gpus: &[2, 3],
            command: &command,
        };
        let cdi = podman(GpuMode::Cdi).run_args(&run).join(" ");
        assert!(
            cdi.contains("--device nvidia.com/gpu=2 --device nvidia.com/gpu=3 i t"),
            "{cdi}"
        );
        let legacy = podman(GpuMode::Legacy).run_args(&run).join(" ");
        assert!(legacy.contains("--gpus device=2,3 i t"), "{legacy}");
    }

    #[test]
    fn site_mounts_are_read_only_beside_the_jobs() {
        let command = vec!["t".to_string()];
        let mounts = vec![PathBuf::from("/data/jobs/j-1"), PathBuf::from("/opt/sw")];
        let run = ContainerRun {
            name: "n",
            image: "i",
            workdir: Path::new("/data/jobs/j-1"),
            mounts: &mounts,
            env_keys: vec![],
            gpus: &[],
            command: &command,
        };
        let runtime = podman(GpuMode::Cdi)
            .with_site_mounts(vec![PathBuf::from("/data"), PathBuf::from("/opt/sw")]);
        let args = runtime.run_args(&run).join(" ");
        assert!(
            args.contains(
                "--volume /data/jobs/j-1:/data/jobs/j-1 --volume /opt/sw:/opt/sw --volume /data:/data:ro --workdir"
            ),
            "{args}"
        );
    }

    #[test]
    fn mounts_are_absolute_distinct_and_not_nested() {
        let got = mounts(
            Path::new("/jobs/j-1/src"),
            &[
                Path::new("/jobs/j-1"),
                Path::new("/jobs/j-1/checkpoints"),
                Path::new("/data/ckpt/a1"),
                Path::new(""),
                Path::new("relative"),
            ],
        );
        assert_eq!(
            got,
            [PathBuf::from("/data/ckpt/a1"), PathBuf::from("/jobs/j-1")]
        );
    }
}
