//! A job's image on Slurm, the cluster's way (`EDGELOOP_SLURM_CONTAINERS`,
//! in order of preference when it names several):
//!
//! - **pyxis** (NVIDIA's SPANK plugin, enroot underneath): `srun
//!   --container-image=<image> --container-mounts=<dir>:<dir>,...
//!   --container-workdir=<dir> --no-container-mount-home`. enroot writes a
//!   registry apart from the image with `#` (`nvcr.io#nvidia/pytorch:24.01`).
//! - **slurm_oci** (Slurm's own, `oci.conf` running runc or crun on the
//!   nodes): `srun --container=<bundle> sh -c 'cd <workdir> && exec "$@"'
//!   <command>`. The bridge makes one bundle per pinned image, under
//!   `EDGELOOP_SLURM_OCI_BUNDLES` (a directory the nodes share): the
//!   image's root filesystem, exported by the bridge's runtime
//!   (`--container-runtime`), and a `config.json` with the bridge's job
//!   directories bind-mounted at their paths and the host's network.
//!   Slurm 22.05 takes the bundle's `rootfs/` whatever `root.path` says
//!   (and runc refuses a symlinked root), sets the step's arguments and
//!   environment, but not its working directory: hence one bundle per
//!   image, and the `cd`. It runs one task per node in a container.
//! - **apptainer**: `apptainer exec [--nv] --bind <dir>,... --pwd <dir>
//!   docker://<image> <command>`, in the srun step (a `.sif` path is run
//!   as it is).
//!
//! Pure builders here, tested against each way's documented form; the
//! engine does the I/O.

use std::path::{Path, PathBuf};

use serde_json::{json, Value};

use super::{ContainerWay, EngineError};

/// The ways a Slurm cluster can run images.
pub const SLURM_WAYS: [ContainerWay; 3] = [
    ContainerWay::Pyxis,
    ContainerWay::SlurmOci,
    ContainerWay::Apptainer,
];

/// How one srun step runs its command in the job's image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SrunContainer {
    Pyxis {
        /// As enroot reads it.
        image: String,
        mounts: Vec<PathBuf>,
        workdir: PathBuf,
    },
    Oci {
        bundle: PathBuf,
        workdir: PathBuf,
    },
    Apptainer {
        image: String,
        binds: Vec<PathBuf>,
        workdir: PathBuf,
        gpus: bool,
    },
}

impl SrunContainer {
    /// srun's own options for the step.
    pub fn srun_options(&self) -> Vec<String> {
        let path = |p: &Path| p.to_string_lossy().into_owned();
        match self {
            SrunContainer::Pyxis {
                image,
                mounts,
                workdir,
            } => {
                let mut out = vec![format!("--container-image={image}")];
                if !mounts.is_empty() {
                    let list: Vec<String> =
                        mounts.iter().map(|m| format!("{0}:{0}", path(m))).collect();
                    out.push(format!("--container-mounts={}", list.join(",")));
                }
                out.push(format!("--container-workdir={}", path(workdir)));
                // The job's files are its mounts; the submitting user's home
                // is not part of the job.
                out.push("--no-container-mount-home".into());
                out
            }
            SrunContainer::Oci { bundle, .. } => vec![format!("--container={}", path(bundle))],
            SrunContainer::Apptainer { .. } => vec![],
        }
    }

    /// The words before the job's command in the step.
    pub fn command_prefix(&self) -> Vec<String> {
        let path = |p: &Path| p.to_string_lossy().into_owned();
        match self {
            SrunContainer::Apptainer {
                image,
                binds,
                workdir,
                gpus,
            } => {
                let mut out = vec!["apptainer".to_string(), "exec".into()];
                if *gpus {
                    out.push("--nv".into());
                }
                if !binds.is_empty() {
                    let list: Vec<String> = binds.iter().map(|b| path(b)).collect();
                    out.push("--bind".into());
                    out.push(list.join(","));
                }
                out.push("--pwd".into());
                out.push(path(workdir));
                out.push(image.clone());
                out
            }
            SrunContainer::Oci { workdir, .. } => in_workdir(workdir, &[]),
            SrunContainer::Pyxis { .. } => vec![],
        }
    }
}

/// The ways `value` names (comma-separated), each one of `allowed`; the
/// error names `setting`.
pub fn parse_ways(
    setting: &str,
    value: &str,
    allowed: &[ContainerWay],
) -> Result<Vec<ContainerWay>, EngineError> {
    let mut ways = Vec::new();
    for word in value.split(',').map(str::trim).filter(|w| !w.is_empty()) {
        match ContainerWay::parse(word).filter(|w| allowed.contains(w)) {
            Some(w) if !ways.contains(&w) => ways.push(w),
            Some(_) => {}
            None => {
                let names: Vec<&str> = allowed.iter().map(|w| w.as_str()).collect();
                return Err(EngineError::Unavailable(format!(
                    "{setting}: {word:?} is not a way this engine runs images (one of {})",
                    names.join(", ")
                )));
            }
        }
    }
    Ok(ways)
}

/// An image reference as enroot reads it: the registry host apart with
/// `#` (`ghcr.io/acme/train:1` → `ghcr.io#acme/train:1`); an image on
/// Docker Hub, a local squashfs file, or one already written so, as it is.
pub fn enroot_image(reference: &str) -> String {
    if reference.starts_with('/') || reference.contains('#') || reference.contains("://") {
        return reference.to_string();
    }
    match reference.split_once('/') {
        Some((host, rest)) if host.contains('.') || host.contains(':') || host == "localhost" => {
            format!("{host}#{rest}")
        }
        _ => reference.to_string(),
    }
}

/// An image reference as Apptainer runs it: a local `.sif` file as it is,
/// anything else from its registry (`docker://`).
pub fn apptainer_image(reference: &str) -> String {
    if reference.starts_with('/') || reference.contains("://") {
        reference.to_string()
    } else {
        format!("docker://{reference}")
    }
}

/// The bundle of an image ID under the shared directory.
pub fn bundle_dir(root: &Path, image_id_hex: &str) -> PathBuf {
    root.join(image_id_hex)
}

/// The words that run `command` in `workdir` inside the container (Slurm
/// does not set an OCI step's working directory).
pub fn in_workdir(workdir: &Path, command: &[String]) -> Vec<String> {
    let mut out = vec![
        "/bin/sh".to_string(),
        "-c".into(),
        "cd -- \"$1\" && shift && exec \"$@\"".into(),
        "edgeloop-cd".into(),
        workdir.to_string_lossy().into_owned(),
    ];
    out.extend(command.iter().cloned());
    out
}

/// The `config.json` of an image's OCI bundle: its `rootfs/` read-only,
/// `mounts` (the bridge's job directories) bind-mounted at their paths,
/// the host's network (the progress URL and NCCL's sockets), its own PID,
/// IPC, UTS and mount namespaces. Slurm sets the process's arguments and
/// environment from the step.
pub fn oci_config(mounts: &[PathBuf]) -> Value {
    let workdir = Path::new("/");
    let rootfs = Path::new("rootfs");
    let path = |p: &Path| p.to_string_lossy().into_owned();
    let mut all_mounts = vec![
        json!({"destination": "/proc", "type": "proc", "source": "proc"}),
        json!({"destination": "/dev", "type": "tmpfs", "source": "tmpfs",
               "options": ["nosuid", "strictatime", "mode=755", "size=65536k"]}),
        json!({"destination": "/dev/pts", "type": "devpts", "source": "devpts",
               "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"]}),
        // NCCL and PyTorch's DataLoader share memory through /dev/shm.
        json!({"destination": "/dev/shm", "type": "tmpfs", "source": "shm",
               "options": ["nosuid", "noexec", "nodev", "mode=1777"]}),
        json!({"destination": "/dev/mqueue", "type": "mqueue", "source": "mqueue",
               "options": ["nosuid", "noexec", "nodev"]}),
        json!({"destination": "/sys", "type": "sysfs", "source": "sysfs",
               "options": ["nosuid", "noexec", "nodev", "ro"]}),
        json!({"destination": "/tmp", "type": "tmpfs", "source": "tmpfs",
               "options": ["nosuid", "nodev", "mode=1777"]}),
        // Name resolution as the host has it (the network is the host's).
        json!({"destination": "/etc/resolv.conf", "type": "bind", "source": "/etc/resolv.conf",
               "options": ["rbind", "ro"]}),
        json!({"destination": "/etc/hosts", "type": "bind", "source": "/etc/hosts",
               "options": ["rbind", "ro"]}),
    ];
    for m in mounts {
        all_mounts.push(
            json!({"destination": path(m), "type": "bind", "source": path(m),
                               "options": ["rbind", "rw"]}),
        );
    }
    json!({
        "ociVersion": "1.0.2",
        "process": {
            "terminal": false,
            "user": {"uid": 0, "gid": 0},
            "args": ["/bin/sh"],
            "env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
            "cwd": path(workdir),
            "noNewPrivileges": true
        },
        "root": {"path": path(rootfs), "readonly": true},
        "hostname": "edgeloop",
        "mounts": all_mounts,
        "linux": {
            "namespaces": [{"type": "pid"}, {"type": "ipc"}, {"type": "uts"}, {"type": "mount"}],
            "maskedPaths": ["/proc/kcore", "/proc/keys", "/proc/timer_list", "/sys/firmware"],
            "readonlyPaths": ["/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"]
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_setting_names_known_ways_once() {
        let got = parse_ways("S", " pyxis, apptainer,pyxis ,", &SLURM_WAYS).unwrap();
        assert_eq!(got, [ContainerWay::Pyxis, ContainerWay::Apptainer]);
        assert_eq!(parse_ways("S", "", &SLURM_WAYS).unwrap(), []);
        let e = parse_ways("EDGELOOP_SLURM_CONTAINERS", "enroot", &SLURM_WAYS)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("EDGELOOP_SLURM_CONTAINERS")
                && e.contains("\"enroot\"")
                && e.contains("slurm_oci"),
            "{e}"
        );
        // A way of another engine is not one of Slurm's.
        assert!(parse_ways("S", "kubernetes", &SLURM_WAYS).is_err());
    }

    #[test]
    fn enroot_and_apptainer_read_references_their_way() {
        for (given, enroot, apptainer) in [
            ("ubuntu:22.04", "ubuntu:22.04", "docker://ubuntu:22.04"),
            (
                "pytorch/pytorch:2.3.0",
                "pytorch/pytorch:2.3.0",
                "docker://pytorch/pytorch:2.3.0",
            ),
            (
                "ghcr.io/acme/train:1",
                "ghcr.io#acme/train:1",
                "docker://ghcr.io/acme/train:1",
            ),
            (
                "registry.local:5000/train@sha256:ab",
                "registry.local:5000#train@sha256:ab",
                "docker://registry.local:5000/train@sha256:ab",
            ),
            (
                "localhost/train:1",
                "localhost#train:1",
                "docker://localhost/train:1",
            ),
            (
                "nvcr.io#nvidia/pytorch:24.01-py3",
                "nvcr.io#nvidia/pytorch:24.01-py3",
                "docker://nvcr.io#nvidia/pytorch:24.01-py3",
            ),
            (
                "/shared/images/train.sqsh",
                "/shared/images/train.sqsh",
                "/shared/images/train.sqsh",
            ),
        ] {
            assert_eq!(enroot_image(given), enroot, "{given}");
            assert_eq!(apptainer_image(given), apptainer, "{given}");
        }
    }

    #[test]
    fn each_way_builds_its_documented_command_line() {
        let mounts = vec![PathBuf::from("/shared/jobs/j-1")];
        let workdir = PathBuf::from("/shared/jobs/j-1/src");
        let pyxis = SrunContainer::Pyxis {
            image: "ghcr.io#acme/train:1".into(),
            mounts: mounts.clone(),
            workdir: workdir.clone(),
        };
        assert_eq!(
            pyxis.srun_options(),
            [
                "--container-image=ghcr.io#acme/train:1",
                "--container-mounts=/shared/jobs/j-1:/shared/jobs/j-1",
                "--container-workdir=/shared/jobs/j-1/src",
                "--no-container-mount-home"
            ]
        );
        assert!(pyxis.command_prefix().is_empty());
        let oci = SrunContainer::Oci {
            bundle: "/shared/oci/abc".into(),
            workdir: "/shared/jobs/j-1".into(),
        };
        assert_eq!(oci.srun_options(), ["--container=/shared/oci/abc"]);
        assert_eq!(oci.command_prefix()[4], "/shared/jobs/j-1");
        let apptainer = SrunContainer::Apptainer {
            image: "docker://ghcr.io/acme/train:1".into(),
            binds: vec!["/shared/jobs/j-1".into(), "/scratch/ckpt".into()],
            workdir,
            gpus: true,
        };
        assert!(apptainer.srun_options().is_empty());
        assert_eq!(
            apptainer.command_prefix().join(" "),
            "apptainer exec --nv --bind /shared/jobs/j-1,/scratch/ckpt --pwd /shared/jobs/j-1/src docker://ghcr.io/acme/train:1"
        );
    }

    #[test]
    fn an_oci_bundle_mounts_the_job_and_keeps_the_host_network() {
        let c = oci_config(&[PathBuf::from("/shared/jobs/j-1")]);
        assert_eq!(c["root"], json!({"path": "rootfs", "readonly": true}));
        assert_eq!(
            in_workdir(
                Path::new("/shared/jobs/j-1/src"),
                &["python".into(), "t.py".into()]
            ),
            [
                "/bin/sh",
                "-c",
                "cd -- \"$1\" && shift && exec \"$@\"",
                "edgeloop-cd",
                "/shared/jobs/j-1/src",
                "python",
                "t.py"
            ]
        );
        let namespaces: Vec<&str> = c["linux"]["namespaces"]
            .as_array()
            .unwrap()
            .iter()
            .map(|n| n["type"].as_str().unwrap())
            .collect();
        assert!(!namespaces.contains(&"network"), "{namespaces:?}");
        let job = c["mounts"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["destination"] == "/shared/jobs/j-1")
            .unwrap();
        assert_eq!(job["source"], "/shared/jobs/j-1");
        assert_eq!(job["type"], "bind");
    }
}
