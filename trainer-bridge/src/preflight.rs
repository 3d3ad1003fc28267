//! The pre-flight check: a pure function of a job spec and what the cluster
//! reported, run before any GPU hour is spent. It refuses a job that cannot
//! run here (too many GPUs per node, another GPU type, a CUDA release newer
//! than the driver supports, an engine the bridge does not drive) and says
//! why in words an ML engineer can act on.
//!
//! # The CUDA rule
//!
//! NVIDIA documents two driver minimums per CUDA release: the one from the
//! release's own table ("CUDA 12.2 GA needs ≥ 535.54.03") and, since 11.0,
//! *minor-version compatibility* (any 12.x runtime starts on ≥ 525.60.13).
//! The second comes with limits: PTX that the driver's JIT does not know
//! fails to load, and some APIs report "not supported". Framework wheels ship
//! PTX for their newest architecture, so the failure shows up hours in, on
//! the first kernel not built as SASS for this GPU. A refusal costs a
//! resubmission; a late failure costs the GPU hours the check exists to save.
//! So the hard check uses the per-release minimum (a driver "supports ≤"
//! the newest release whose minimum it meets), and the reason mentions minor
//! version compatibility where it would have started the job.
//!
//! The cluster's CUDA capability is the CUDA version the driver reports
//! (`nvidia-smi`'s "CUDA Version") when there is one, since the driver knows
//! releases newer than this table; otherwise it is derived from the driver
//! version. With neither, CUDA is not checked: an unknown is not a proof the
//! job cannot run.

use std::fmt;

use crate::engines::NodePool;
use crate::spec::{EngineKind, Framework, JobSpec, Requirement, Version, VersionOp};

/// What the bridge knows about its cluster: the engines it drives and each
/// engine's node pools, as last read from the engines.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClusterFacts {
    /// Engines the bridge drives ("local", "slurm", "ray", "kubernetes").
    pub engines: Vec<String>,
    pub pools: Vec<NodePool>,
}

/// One reason a job cannot run on this cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// The spec field the reason is about, e.g. `resources.gpus_per_node`.
    pub field: String,
    pub reason: String,
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.reason)
    }
}

pub use edgeloop_models::cuda::{CudaRelease, CUDA_RELEASES, MINOR_VERSION_COMPAT};

/// A framework release series and the CUDA versions (major, minor) it is
/// built for.
#[derive(Debug, Clone, Copy)]
pub struct FrameworkBuilds {
    pub major: u32,
    pub minor: u32,
    pub cuda: &'static [(u32, u32)],
}

const fn builds(major: u32, minor: u32, cuda: &'static [(u32, u32)]) -> FrameworkBuilds {
    FrameworkBuilds { major, minor, cuda }
}

/// Source: pytorch.org "Previous PyTorch Versions" (the `cuXYZ` wheel index
/// of each release) and pytorch/pytorch RELEASE.md's release compatibility
/// matrix. Wheels bundle their CUDA runtime, so the driver must support that
/// runtime; the toolkit installed on the nodes does not matter.
pub const TORCH_BUILDS: &[FrameworkBuilds] = &[
    builds(1, 10, &[(10, 2), (11, 1), (11, 3)]),
    builds(1, 11, &[(10, 2), (11, 3), (11, 5)]),
    builds(1, 12, &[(10, 2), (11, 3), (11, 6)]),
    builds(1, 13, &[(11, 6), (11, 7)]),
    builds(2, 0, &[(11, 7), (11, 8)]),
    builds(2, 1, &[(11, 8), (12, 1)]),
    builds(2, 2, &[(11, 8), (12, 1)]),
    builds(2, 3, &[(11, 8), (12, 1)]),
    builds(2, 4, &[(11, 8), (12, 1), (12, 4)]),
    builds(2, 5, &[(11, 8), (12, 1), (12, 4)]),
    builds(2, 6, &[(11, 8), (12, 4), (12, 6)]),
    builds(2, 7, &[(11, 8), (12, 6), (12, 8)]),
    builds(2, 8, &[(12, 6), (12, 8), (12, 9)]),
    builds(2, 9, &[(12, 6), (12, 8), (13, 0)]),
];

/// Source: tensorflow.org/install/source#gpu, "Tested build configurations"
/// (Linux GPU). One CUDA version per release: it needs that release or a
/// newer one of the same major.
pub const TENSORFLOW_BUILDS: &[FrameworkBuilds] = &[
    builds(2, 4, &[(11, 0)]),
    builds(2, 5, &[(11, 2)]),
    builds(2, 6, &[(11, 2)]),
    builds(2, 7, &[(11, 2)]),
    builds(2, 8, &[(11, 2)]),
    builds(2, 9, &[(11, 2)]),
    builds(2, 10, &[(11, 2)]),
    builds(2, 11, &[(11, 2)]),
    builds(2, 12, &[(11, 8)]),
    builds(2, 13, &[(11, 8)]),
    builds(2, 14, &[(11, 8)]),
    builds(2, 15, &[(12, 2)]),
    builds(2, 16, &[(12, 3)]),
    builds(2, 17, &[(12, 3)]),
    builds(2, 18, &[(12, 5)]),
    builds(2, 19, &[(12, 5)]),
];

/// Checks `spec` against `cluster`; every reason found, not just the first.
/// Holds `spec` against the pools of the engine it would run on (its
/// `engine`, else `local`). Returns the pool it fits most tightly (fewest
/// GPUs per node), or `None` for a
/// job that needs no GPUs on an engine that reported no pools. When no pool
/// fits, the refusals are those of the pool that came closest (fewest
/// reasons, then the first reported), each naming that pool.
pub fn check(spec: &JobSpec, cluster: &ClusterFacts) -> Result<Option<NodePool>, Vec<Refusal>> {
    let engine = spec.engine.map_or("local", EngineKind::as_str);
    if !cluster.engines.iter().any(|e| e == engine) {
        let mut refusals = spec
            .engine
            .map(|e| vec![engine_refusal(e, &cluster.engines)])
            .unwrap_or_default();
        if refusals.is_empty() {
            refusals.push(Refusal {
                field: "engine".into(),
                reason: format!(
                    "the default local engine is not configured on this bridge (it offers {})",
                    cluster.engines.join(", ")
                ),
            });
        }
        return Err(refusals);
    }
    let pools: Vec<&NodePool> = cluster
        .pools
        .iter()
        .filter(|p| p.engine == engine)
        .collect();
    let wanted = spec.resources.gpus_per_node;
    if pools.is_empty() {
        if wanted == 0 {
            return Ok(None);
        }
        return Err(vec![Refusal {
            field: "resources.gpus_per_node".into(),
            reason: format!(
                "needs {wanted} GPUs per node, the {engine} engine has reported no node pools (no GPU facts yet)"
            ),
        }]);
    }
    let mut best: Option<Vec<Refusal>> = None;
    let mut fits: Option<&NodePool> = None;
    for pool in pools {
        let refusals = pool_refusals(spec, pool);
        if refusals.is_empty() {
            // The tightest fit: a CPU job in a CPU pool, a 1-GPU job on the
            // smallest GPU nodes, leaving the big ones for the jobs that
            // need them. Ties go to the first reported.
            if fits.is_none_or(|f| pool.gpus_per_node < f.gpus_per_node) {
                fits = Some(pool);
            }
        } else if best.as_ref().is_none_or(|b| refusals.len() < b.len()) {
            best = Some(refusals);
        }
    }
    match fits {
        Some(pool) => Ok(Some(pool.clone())),
        None => Err(best.unwrap_or_default()),
    }
}

/// How a refusal names a pool: `slurm pool "gpu"`, or `this machine`.
pub fn pool_name(pool: &NodePool) -> String {
    if pool.engine == "local" {
        "this machine".into()
    } else {
        format!("{} pool {:?}", pool.engine, pool.name)
    }
}

/// Why `spec` cannot run in `pool`; empty when it can.
pub fn pool_refusals(spec: &JobSpec, pool: &NodePool) -> Vec<Refusal> {
    let mut refusals = Vec::new();
    let wanted = spec.resources.gpus_per_node;
    let name = pool_name(pool);
    if spec.image.is_some() && pool.containers.is_empty() {
        refusals.push(Refusal {
            field: "image".into(),
            reason: if pool.engine == "local" {
                "this machine runs no container images: its bridge has no \
                 --container-runtime (podman or docker); leave `image` out to run the command \
                 on the host"
                    .to_string()
            } else if pool.engine == "ray" {
                // Why, in docs/containers.md: Ray's `image_uri` mounts no job
                // directory and needs Ray itself inside the image.
                format!(
                    "{name} runs no per-job images: Ray runs its jobs in the image its nodes run \
                     (e.g. the RayCluster's image on KubeRay); leave `image` out, or run the \
                     job on an engine that runs images"
                )
            } else {
                format!(
                    "{name} runs no container images (its bridge reports no pyxis, Slurm OCI, \
                     Apptainer or other way for it); leave `image` out to run the command there"
                )
            },
        });
    }
    if wanted > pool.gpus_per_node {
        let has = match pool.gpus_per_node {
            0 => "no GPUs".to_string(),
            n => n.to_string(),
        };
        refusals.push(Refusal {
            field: "resources.gpus_per_node".into(),
            reason: format!("needs {wanted} GPUs per node, {name} has {has}"),
        });
    }
    if let (Some(want), Some(have)) = (&spec.resources.gpu_type, &pool.gpu_type) {
        if wanted > 0 && !gpu_type_matches(want, have) {
            refusals.push(Refusal {
                field: "resources.gpu_type".into(),
                reason: format!("needs {want} GPUs, {name} has {have}"),
            });
        }
    }
    if let Some(nodes) = pool.nodes {
        // An elastic job fits a pool that has its fewest nodes.
        let (field, needed) = match spec.resources.min_nodes {
            Some(min) => ("resources.min_nodes", min),
            None => ("resources.nodes", spec.resources.nodes),
        };
        if needed > nodes {
            refusals.push(Refusal {
                field: field.into(),
                reason: format!("needs {needed} nodes, {name} has {nodes}"),
            });
        }
    }
    if wanted > 0 {
        refusals.extend(cuda_refusals(&spec.requirements, pool));
    }
    refusals
}

fn engine_refusal(engine: EngineKind, offered: &[String]) -> Refusal {
    let offered = if offered.is_empty() {
        "none".to_string()
    } else {
        offered.join(", ")
    };
    Refusal {
        field: "engine".into(),
        reason: format!(
            "needs the {} engine, this bridge offers {offered}",
            engine.as_str()
        ),
    }
}

/// Every word of the requested type must appear in the cluster's GPU name,
/// case-insensitively: "A100" and "a100-80gb" match "NVIDIA A100-SXM4-80GB",
/// "A10" does not (a substring test would let it).
pub fn gpu_type_matches(wanted: &str, cluster: &str) -> bool {
    let words = |s: &str| -> Vec<String> {
        s.split(|c: char| !c.is_ascii_alphanumeric())
            .filter(|w| !w.is_empty())
            .map(|w| w.to_ascii_lowercase())
            .collect()
    };
    let have = words(cluster);
    let want = words(wanted);
    !want.is_empty() && want.iter().all(|w| have.contains(w))
}

/// What the cluster can run, as far as CUDA goes.
enum Capability {
    /// Neither driver nor CUDA version reported.
    Unknown,
    /// The newest CUDA (major.minor) the cluster runs.
    UpTo(Version),
    /// The driver is older than every release in [`CUDA_RELEASES`].
    BelowTable,
}

fn capability(cluster: &NodePool) -> Capability {
    if let Some(v) = cluster.cuda_version.as_deref().and_then(Version::parse) {
        return Capability::UpTo(v.truncate(2));
    }
    match cluster.driver_version.as_deref().and_then(Version::parse) {
        None => Capability::Unknown,
        Some(driver) => max_cuda_for_driver(&driver)
            .map(Capability::UpTo)
            .unwrap_or(Capability::BelowTable),
    }
}

/// The newest CUDA release whose GA minimum driver `driver` meets.
pub fn max_cuda_for_driver(driver: &Version) -> Option<Version> {
    CUDA_RELEASES
        .iter()
        .filter(|r| Version::parse(r.min_driver).is_some_and(|min| *driver >= min))
        .map(|r| Version(vec![r.major, r.minor]))
        .max()
}

/// The GA minimum driver of a CUDA release (major.minor), if in the table.
pub fn min_driver_for_cuda(cuda: &Version) -> Option<&'static str> {
    CUDA_RELEASES
        .iter()
        .find(|r| r.major == cuda.major() && r.minor == cuda.minor())
        .map(|r| r.min_driver)
}

fn cuda_refusals(requirements: &[Requirement], cluster: &NodePool) -> Vec<Refusal> {
    let cap = capability(cluster);
    if matches!(cap, Capability::Unknown) {
        return Vec::new();
    }
    let mut refusals = Vec::new();
    for framework in [Framework::Cuda, Framework::Torch, Framework::TensorFlow] {
        let group: Vec<(usize, &Requirement)> = requirements
            .iter()
            .enumerate()
            .filter(|(_, r)| r.framework == framework)
            .collect();
        if group.is_empty() {
            continue;
        }
        let reqs: Vec<&Requirement> = group.iter().map(|(_, r)| *r).collect();
        let Some(need) = min_cuda_needed(framework, &reqs) else {
            continue;
        };
        let refused = match &cap {
            Capability::UpTo(max) => need.version > *max,
            Capability::BelowTable => true,
            Capability::Unknown => false,
        };
        if !refused {
            continue;
        }
        let index = group
            .iter()
            .find(|(_, r)| r.op != VersionOp::Lt && r.op != VersionOp::Le)
            .or(group.first())
            .map(|(i, _)| *i)
            .unwrap_or(0);
        let who = match framework {
            Framework::Cuda => "image".to_string(),
            _ => reqs
                .iter()
                .map(|r| r.to_string())
                .collect::<Vec<_>>()
                .join(", "),
        };
        let mut reason = format!("{who} needs CUDA {}{}, ", need.version, need.why);
        reason.push_str(&describe_capability(&cap, cluster));
        if let Some(note) = minor_compat_note(&need.version, &cap, cluster) {
            reason.push_str(&note);
        }
        refusals.push(Refusal {
            field: format!("requirements[{index}]"),
            reason,
        });
    }
    refusals
}

struct Need {
    /// major.minor
    version: Version,
    /// Where the number comes from, for the reason (may be empty).
    why: String,
}

/// The oldest CUDA release (major.minor) that `reqs` on `framework` allow.
/// `None` when nothing is known: no lower bound (`cuda<12`), or only
/// framework releases outside the tables (neither refused nor passed on a
/// guess: the table is what the check knows).
fn min_cuda_needed(framework: Framework, reqs: &[&Requirement]) -> Option<Need> {
    match framework {
        Framework::Cuda => {
            let known = CUDA_RELEASES
                .iter()
                .map(|r| (r.major, r.minor))
                .filter(|&(major, minor)| series_matches(major, minor, reqs))
                .min();
            let version = match known {
                Some((major, minor)) => Version(vec![major, minor]),
                // Newer than the table (`cuda>=14.0`): the bound itself.
                None => reqs
                    .iter()
                    .filter(|r| !matches!(r.op, VersionOp::Lt | VersionOp::Le))
                    .map(|r| r.version.truncate(2))
                    .filter(|v| {
                        CUDA_RELEASES
                            .iter()
                            .all(|r| *v > Version(vec![r.major, r.minor]))
                    })
                    .max()?,
            };
            Some(Need {
                version,
                why: String::new(),
            })
        }
        Framework::Torch | Framework::TensorFlow => {
            let (table, label) = if framework == Framework::Torch {
                (TORCH_BUILDS, "its oldest official build")
            } else {
                (TENSORFLOW_BUILDS, "the version it is tested with")
            };
            let (major, minor) = table
                .iter()
                .filter(|b| series_matches(b.major, b.minor, reqs))
                .flat_map(|b| b.cuda.iter().copied())
                .min()?;
            Some(Need {
                version: Version(vec![major, minor]),
                why: format!(" ({label})"),
            })
        }
    }
}

/// Whether some release `major.minor.patch` of the series satisfies every
/// requirement. The satisfying patches form an interval whose ends are 0,
/// "any", or a requirement's own patch (±1 for strict bounds), so those are
/// the candidates to try.
pub fn series_matches(major: u32, minor: u32, reqs: &[&Requirement]) -> bool {
    let mut patches = vec![0, u32::MAX];
    for r in reqs {
        if r.version.major() == major && r.version.minor() == minor {
            let p = r.version.0.get(2).copied().unwrap_or(0);
            patches.extend([p.saturating_sub(1), p, p.saturating_add(1)]);
        }
    }
    patches.iter().any(|&patch| {
        let candidate = Version(vec![major, minor, patch]);
        reqs.iter().all(|r| r.matches(&candidate))
    })
}

fn describe_capability(cap: &Capability, cluster: &NodePool) -> String {
    match (cap, &cluster.driver_version) {
        (Capability::UpTo(max), Some(driver)) if cluster.cuda_version.is_none() => {
            format!("cluster driver {driver} supports ≤ {max}")
        }
        (Capability::UpTo(max), Some(driver)) => {
            format!("cluster driver {driver} reports CUDA ≤ {max}")
        }
        (Capability::UpTo(max), None) => format!("cluster supports CUDA ≤ {max}"),
        (_, driver) => {
            let oldest = CUDA_RELEASES.first().map_or(String::new(), |r| {
                format!(" ({}.{} needs ≥ {})", r.major, r.minor, r.min_driver)
            });
            format!(
                "cluster driver {} is older than every CUDA release this check knows{oldest}",
                driver.as_deref().unwrap_or("(unknown)")
            )
        }
    }
}

/// When minor-version compatibility would have started the job, say so and
/// name the driver that runs it fully.
fn minor_compat_note(need: &Version, cap: &Capability, cluster: &NodePool) -> Option<String> {
    let Capability::UpTo(max) = cap else {
        return None;
    };
    let driver = cluster.driver_version.as_deref().and_then(Version::parse)?;
    let compat_min = MINOR_VERSION_COMPAT
        .iter()
        .find(|(major, _)| *major == need.major())
        .and_then(|(_, d)| Version::parse(d))?;
    if max.major() != need.major() || driver < compat_min {
        return None;
    }
    // Without a known full-support driver there is no advice to give.
    let full = min_driver_for_cuda(need)?;
    Some(format!(
        " (CUDA {}.x minor-version compatibility might start it, but without PTX JIT for newer code; CUDA {need} needs driver ≥ {full})",
        need.major()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_parse_and_are_ordered() {
        let mut previous: Option<Version> = None;
        for r in CUDA_RELEASES {
            let driver = Version::parse(r.min_driver).unwrap();
            if let Some(p) = &previous {
                assert!(driver > *p, "{}.{} driver not increasing", r.major, r.minor);
            }
            previous = Some(driver);
        }
        for (_, d) in MINOR_VERSION_COMPAT {
            Version::parse(d).unwrap();
        }
        for table in [TORCH_BUILDS, TENSORFLOW_BUILDS] {
            for b in table {
                for &(major, minor) in b.cuda {
                    assert!(
                        CUDA_RELEASES
                            .iter()
                            .any(|r| r.major == major && r.minor == minor),
                        "{}.{} builds for unknown CUDA {major}.{minor}",
                        b.major,
                        b.minor
                    );
                }
            }
        }
    }
}
