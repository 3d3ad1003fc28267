//! What the pods mount: the directories they share with the bridge, and a
//! memory-backed `/dev/shm`. Kept apart because the shared directories are
//! the engine's one filesystem contract with the bridge (checkpoints must be
//! read back at the path the trainer wrote them), and getting them wrong
//! loses a job's progress without an error.
//!
//! The bridge reads checkpoints from `EDGELOOP_CHECKPOINT_DIR` on its own
//! filesystem, so the pods must see that directory at the same path. The
//! engine mounts the checkpoint directory and the working directory (one
//! mount when one holds the other) at their own paths:
//! - with `EDGELOOP_K8S_CHECKPOINT_PVC` set, from that PersistentVolumeClaim
//!   (ReadWriteMany, e.g. NFS), which must hold the bridge's `<data
//!   dir>/jobs` directory: the bridge mounts the same volume there, and each
//!   pod mounts the claim's `<job id>/...` sub path at the same path;
//! - otherwise as `hostPath` volumes (`DirectoryOrCreate`): right for a
//!   single-node cluster on the bridge's machine, or kind with the bridge's
//!   data dir in the node's `extraMounts` at the same path.
//!
//! GPU jobs, and any job with several processes per pod, also get a
//! memory-backed `emptyDir` at `/dev/shm` for NCCL ([`needs_shm`]).

use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::{
    EmptyDirVolumeSource, HostPathVolumeSource, PersistentVolumeClaimVolumeSource, Volume,
    VolumeMount,
};

use super::{Settings, SharedVolume};
use crate::engines::{EngineError, Launch, Launcher};
use crate::launch::{CHECKPOINT_DIR, RESUME_FROM};

/// The memory-backed volume at `/dev/shm` (see [`needs_shm`]).
pub const SHM_VOLUME: &str = "dshm";
pub const SHM_PATH: &str = "/dev/shm";

pub(super) fn utf8(what: &str, path: &Path) -> Result<String, EngineError> {
    path.to_str()
        .map(str::to_string)
        .ok_or_else(|| EngineError::Refused(format!("the {what} {path:?} is not UTF-8")))
}

/// Makes the launch's paths absolute against `cwd`: the pods mount them at
/// the same paths, and a relative path would be read against the
/// container's working directory instead of the bridge's.
pub fn absolutize(launch: &Launch, cwd: &Path) -> Launch {
    let mut l = launch.clone();
    l.workdir = cwd.join(&launch.workdir);
    for key in [CHECKPOINT_DIR, RESUME_FROM] {
        if let Some(v) = l.env.get_mut(key) {
            if !v.is_empty() && Path::new(v.as_str()).is_relative() {
                *v = cwd.join(v.as_str()).to_string_lossy().into_owned();
            }
        }
    }
    l
}

/// The directories the pods must share with the bridge, each once (a
/// directory inside another one comes with it).
fn shared_dirs(launch: &Launch) -> Result<Vec<PathBuf>, EngineError> {
    let mut dirs = Vec::new();
    if let Some(ckpt) = launch.env.get(CHECKPOINT_DIR).filter(|v| !v.is_empty()) {
        dirs.push(PathBuf::from(ckpt));
    }
    dirs.push(launch.workdir.clone());
    for d in &dirs {
        if !d.is_absolute() {
            return Err(EngineError::Refused(format!(
                "{} is mounted into the pods at the same path and must be absolute",
                d.display()
            )));
        }
    }
    let mut out: Vec<PathBuf> = Vec::new();
    for d in &dirs {
        if dirs.iter().any(|o| o != d && d.starts_with(o)) || out.contains(d) {
            continue;
        }
        out.push(d.clone());
    }
    Ok(out)
}

pub(super) fn volumes(
    launch: &Launch,
    settings: &Settings,
) -> Result<(Vec<Volume>, Vec<VolumeMount>), EngineError> {
    let dirs = shared_dirs(launch)?;
    let mut volumes = Vec::new();
    let mut mounts = Vec::new();
    match &settings.volume {
        SharedVolume::HostPath => {
            for (i, dir) in dirs.iter().enumerate() {
                let path = utf8("shared directory", dir)?;
                let name = format!("edgeloop-{i}");
                volumes.push(Volume {
                    name: name.clone(),
                    host_path: Some(HostPathVolumeSource {
                        path: path.clone(),
                        type_: Some("DirectoryOrCreate".to_string()),
                    }),
                    ..Default::default()
                });
                mounts.push(VolumeMount {
                    name,
                    mount_path: path,
                    ..Default::default()
                });
            }
        }
        SharedVolume::Claim { name: claim, root } => {
            volumes.push(Volume {
                name: "edgeloop".to_string(),
                persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                    claim_name: claim.clone(),
                    read_only: None,
                }),
                ..Default::default()
            });
            for dir in &dirs {
                let sub = dir.strip_prefix(root).map_err(|_| {
                    EngineError::Refused(format!(
                        "{} is not under {}, the directory the claim {claim} holds",
                        dir.display(),
                        root.display()
                    ))
                })?;
                let sub = utf8("shared directory", sub)?;
                mounts.push(VolumeMount {
                    name: "edgeloop".to_string(),
                    mount_path: utf8("shared directory", dir)?,
                    sub_path: Some(sub).filter(|s| !s.is_empty()),
                    ..Default::default()
                });
            }
        }
    }
    Ok((volumes, mounts))
}

/// Training processes per pod: torchrun's workers, Horovod's slots.
fn procs_per_pod(launch: &Launch) -> u32 {
    match launch.launcher {
        Launcher::None => 1,
        Launcher::Torchrun { nproc_per_node } => nproc_per_node,
        Launcher::Horovod { slots_per_node } => slots_per_node,
    }
}

/// A container's `/dev/shm` is 64 MiB, too little for NCCL's shared-memory
/// transport between GPUs of one pod and for PyTorch's DataLoader workers:
/// GPU jobs, and jobs with several processes in a pod (they talk through
/// shared memory), get a memory-backed `emptyDir` there. Its pages count
/// against the pod's memory limit, which also bounds its size; one process
/// per pod without GPUs keeps the default.
pub fn needs_shm(launch: &Launch) -> bool {
    launch.gpus_per_node > 0 || procs_per_pod(launch) > 1
}

pub(super) fn shm() -> (Volume, VolumeMount) {
    (
        Volume {
            name: SHM_VOLUME.to_string(),
            empty_dir: Some(EmptyDirVolumeSource {
                medium: Some("Memory".to_string()),
                size_limit: None,
            }),
            ..Default::default()
        },
        VolumeMount {
            name: SHM_VOLUME.to_string(),
            mount_path: SHM_PATH.to_string(),
            ..Default::default()
        },
    )
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::engines::kubernetes::build_job;
    use crate::engines::kubernetes::test_fixtures::{container, cpu_launch, job_of, launch, CKPT};

    #[test]
    fn shared_directories_are_mounted_at_their_own_paths() {
        // The checkpoint dir inside the working dir: one hostPath mount.
        let (_, job) = job_of(&cpu_launch());
        let pod = job.spec.as_ref().unwrap().template.spec.clone().unwrap();
        let vols = pod.volumes.unwrap();
        assert_eq!(vols.len(), 1);
        let hp = vols[0].host_path.clone().unwrap();
        assert_eq!(hp.path, "/data/jobs/train-1a2b3c4d");
        assert_eq!(hp.type_.as_deref(), Some("DirectoryOrCreate"));
        let mounts = container(&job).volume_mounts.clone().unwrap();
        assert_eq!(mounts[0].mount_path, hp.path);
        assert_eq!(mounts[0].name, vols[0].name);

        // A working dir elsewhere: both.
        let mut l = cpu_launch();
        l.workdir = PathBuf::from("/src/project");
        let (_, job) = job_of(&l);
        let mounts: Vec<String> = container(&job)
            .volume_mounts
            .iter()
            .flatten()
            .map(|m| m.mount_path.clone())
            .collect();
        assert_eq!(mounts, [CKPT, "/src/project"]);

        // A claim that holds /data/jobs.
        let claim = Settings {
            namespace: "ml".into(),
            volume: SharedVolume::Claim {
                name: "edgeloop-jobs".into(),
                root: PathBuf::from("/data/jobs"),
            },
            ..super::super::test_fixtures::settings()
        };
        let job = build_job(&launch(), &claim).unwrap();
        let pod = job.spec.as_ref().unwrap().template.spec.clone().unwrap();
        let vols = pod.volumes.unwrap();
        assert_eq!(
            vols[0].persistent_volume_claim.as_ref().unwrap().claim_name,
            "edgeloop-jobs"
        );
        let m = &container(&job).volume_mounts.as_ref().unwrap()[0];
        assert_eq!(
            (m.mount_path.as_str(), m.sub_path.as_deref()),
            ("/data/jobs/train-1a2b3c4d", Some("train-1a2b3c4d"))
        );
        let mut l = launch();
        l.workdir = PathBuf::from("/elsewhere");
        match build_job(&l, &claim) {
            Err(EngineError::Refused(m)) => assert!(m.contains("not under /data/jobs"), "{m}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn relative_paths_are_made_absolute_against_the_bridge_cwd() {
        let mut l = launch();
        l.workdir = PathBuf::from("data/jobs/x");
        l.env
            .insert(CHECKPOINT_DIR.into(), "data/jobs/x/checkpoints".into());
        l.env.insert(RESUME_FROM.into(), String::new());
        let a = absolutize(&l, Path::new("/srv/bridge"));
        assert_eq!(a.workdir, PathBuf::from("/srv/bridge/data/jobs/x"));
        assert_eq!(a.env[CHECKPOINT_DIR], "/srv/bridge/data/jobs/x/checkpoints");
        assert_eq!(a.env[RESUME_FROM], "", "empty stays empty: a first run");
        assert_eq!(absolutize(&launch(), Path::new("/srv")), launch());
    }
}
