//! A Slurm cluster's node pools, from slurmrestd's `GET nodes`: nodes that
//! share a partition, a GPU GRES (type and count) and driver facts form one
//! pool. Pure functions of the answer; the engine does the request.
//!
//! GRES strings are Slurm's: `gpu:2`, `gpu:a100:4`, `gpu:a100:4(S:0-1)`,
//! several comma-separated (`gpu:tesla:2(S:0),gpu:k80:2(S:1),nvme:1`). A
//! node with two GPU types is in one pool per type, since one job's
//! `--gres=gpu:type:N` lands on one type.
//!
//! Slurm does not know the NVIDIA driver. Sites publish it as a node
//! feature, which this reads as `driver_<version>` / `cuda_<version>` (also
//! with `-`, `=` or `:` for the `_`, and an `nvidia_` prefix); otherwise the
//! bridge's config (`EDGELOOP_SLURM_DRIVER_VERSION`,
//! `EDGELOOP_SLURM_CUDA_VERSION`) fills them in, and the pool's `source`
//! says which.

use std::collections::BTreeMap;

use serde::Deserialize;

pub use super::ConfiguredFacts;
#[cfg(test)]
use super::ContainerWay;
use super::NodePool;

/// The parts of a `GET nodes` entry the pools are made of.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct SlurmNode {
    pub name: String,
    #[serde(default)]
    pub partitions: Vec<String>,
    #[serde(default)]
    pub gres: String,
    /// Comma-separated (v0.0.38 writes a string).
    #[serde(default)]
    pub features: String,
    #[serde(default)]
    pub active_features: String,
    #[serde(default)]
    pub cpus: u32,
    /// MiB.
    #[serde(default)]
    pub real_memory: u64,
}

#[derive(Debug, Deserialize)]
pub struct NodesResponse {
    #[serde(default)]
    pub nodes: Vec<SlurmNode>,
}

/// The GPU entries of a GRES string: `(type, count)` per `gpu` entry.
/// Other GRES (`nvme:1`) and unreadable entries are skipped.
pub fn gpu_gres(gres: &str) -> Vec<(Option<String>, u32)> {
    let mut out = Vec::new();
    for entry in split_top_level(gres) {
        // Drop the socket binding: `gpu:a100:4(S:0-1)`.
        let entry = entry.split('(').next().unwrap_or("").trim();
        let parts: Vec<&str> = entry.split(':').collect();
        let (kind, ty, count) = match parts[..] {
            [kind, count] => (kind, None, count),
            [kind, ty, count] => (kind, Some(ty), count),
            _ => continue,
        };
        if kind != "gpu" {
            continue;
        }
        let Ok(count) = count.parse::<u32>() else {
            continue;
        };
        let ty = ty
            .filter(|t| !t.is_empty() && t.len() <= 64)
            .map(str::to_string);
        if count > 0 {
            out.push((ty, count));
        }
    }
    out
}

/// Splits on commas outside parentheses (`(S:0,1)` holds commas).
fn split_top_level(s: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let (mut depth, mut start) = (0i32, 0);
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth <= 0 => {
                out.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&s[start..]);
    out.into_iter().filter(|p| !p.trim().is_empty()).collect()
}

/// `(driver, cuda)` from node features such as `driver_535.104.05`,
/// `nvidia-driver=550.54.14` or `cuda_12.2`.
pub fn driver_features(features: &str) -> (Option<String>, Option<String>) {
    let mut driver = None;
    let mut cuda = None;
    for f in features.split(',').map(|f| f.trim().to_ascii_lowercase()) {
        let f = f
            .strip_prefix("nvidia")
            .map_or(f.as_str(), |r| r.trim_start_matches(['_', '-']));
        for (prefix, slot) in [("driver", &mut driver), ("cuda", &mut cuda)] {
            if let Some(rest) = f.strip_prefix(prefix) {
                let v = rest.trim_start_matches(['_', '-', '=', ':']);
                if is_version(v) && slot.is_none() {
                    *slot = Some(v.to_string());
                }
            }
        }
    }
    (driver, cuda)
}

fn is_version(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 32
        && s.split('.')
            .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
}

/// The pools of these nodes, restricted to `partition` when the bridge is
/// set to one. `endpoint` is what the facts came from, for `source`.
pub fn pools(
    nodes: &[SlurmNode],
    partition: Option<&str>,
    configured: &ConfiguredFacts,
    endpoint: &str,
) -> Vec<NodePool> {
    type Key = (String, Option<String>, u32, Option<String>, Option<String>);
    // Per key: nodes, the smallest CPU and memory figures, and whether the
    // driver facts came from the nodes.
    let mut groups: BTreeMap<Key, (u32, u32, u64, bool)> = BTreeMap::new();
    for node in nodes {
        let features = if node.active_features.is_empty() {
            &node.features
        } else {
            &node.active_features
        };
        let (driver, cuda) = driver_features(features);
        let from_nodes = driver.is_some() || cuda.is_some();
        let driver = driver.or_else(|| configured.driver_version.clone());
        let cuda = cuda.or_else(|| configured.cuda_version.clone());
        let mut gpus = gpu_gres(&node.gres);
        if gpus.is_empty() {
            gpus.push((None, 0));
        }
        for p in &node.partitions {
            if partition.is_some_and(|want| want != p) {
                continue;
            }
            for (ty, count) in &gpus {
                let key = (p.clone(), ty.clone(), *count, driver.clone(), cuda.clone());
                let g = groups
                    .entry(key)
                    .or_insert((0, u32::MAX, u64::MAX, from_nodes));
                g.0 += 1;
                g.1 = g.1.min(node.cpus);
                g.2 = g.2.min(node.real_memory);
                g.3 &= from_nodes;
            }
        }
    }
    let mut per_partition: BTreeMap<&str, usize> = BTreeMap::new();
    for (p, ..) in groups.keys() {
        *per_partition.entry(p).or_default() += 1;
    }
    groups
        .iter()
        .map(
            |((p, ty, count, driver, cuda), &(n, cpus, mem, from_nodes))| {
                let name = if per_partition[p.as_str()] == 1 {
                    p.clone()
                } else {
                    format!(
                        "{p}:{}x{count}",
                        ty.as_deref()
                            .unwrap_or(if *count == 0 { "cpu" } else { "gpu" })
                    )
                };
                let mut placement = BTreeMap::from([("partition".to_string(), p.clone())]);
                if let Some(t) = ty {
                    placement.insert("gres_type".into(), t.clone());
                }
                let facts = match (driver.is_some() || cuda.is_some(), from_nodes) {
                    (false, _) => "",
                    (true, true) => "; driver from node features",
                    (true, false) => "; driver from the bridge's config",
                };
                NodePool {
                    engine: "slurm".into(),
                    name,
                    nodes: Some(n),
                    gpus_per_node: *count,
                    gpu_type: ty.clone(),
                    gpu_memory_bytes: None,
                    driver_version: driver.clone(),
                    cuda_version: cuda.clone(),
                    cpus_per_node: if cpus == u32::MAX { 0 } else { cpus },
                    memory_mb_per_node: if mem == u64::MAX { 0 } else { mem },
                    source: format!("slurmrestd GET {endpoint}{facts}"),
                    placement,
                    containers: configured.containers.clone(),
                }
            },
        )
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    type Gpus<'a> = Vec<(Option<&'a str>, u32)>;

    #[test]
    fn gres_strings() {
        let table: &[(&str, Gpus<'_>)] = &[
            ("gpu:fake:2", vec![(Some("fake"), 2)]),
            ("gpu:2", vec![(None, 2)]),
            ("gpu:a100:4(S:0-1)", vec![(Some("a100"), 4)]),
            (
                "gpu:tesla:2(S:0),gpu:k80:2(S:1),nvme:1",
                vec![(Some("tesla"), 2), (Some("k80"), 2)],
            ),
            ("gpu:a100:4(S:0,1),mps:100", vec![(Some("a100"), 4)]),
            ("", vec![]),
            ("(null)", vec![]),
            ("gpu:x:0", vec![]),
            ("gpu:a:b:c", vec![]),
        ];
        for (gres, want) in table {
            let want: Vec<(Option<String>, u32)> = want
                .iter()
                .map(|(t, n)| (t.map(str::to_string), *n))
                .collect();
            assert_eq!(gpu_gres(gres), want, "{gres}");
        }
    }

    #[test]
    fn driver_features_table() {
        let table = [
            (
                "driver_535.104.05,cuda_12.2",
                (Some("535.104.05"), Some("12.2")),
            ),
            ("nvidia-driver=550.54.14", (Some("550.54.14"), None)),
            ("NVIDIA_DRIVER_470.82,ib", (Some("470.82"), None)),
            ("cuda12.4", (None, Some("12.4"))),
            ("driver_latest,cuda_", (None, None)),
            ("", (None, None)),
        ];
        for (features, (driver, cuda)) in table {
            assert_eq!(
                driver_features(features),
                (driver.map(str::to_string), cuda.map(str::to_string)),
                "{features}"
            );
        }
    }

    fn node(name: &str, partitions: &[&str], gres: &str, features: &str) -> SlurmNode {
        SlurmNode {
            name: name.into(),
            partitions: partitions.iter().map(|p| p.to_string()).collect(),
            gres: gres.into(),
            features: features.into(),
            cpus: 64,
            real_memory: 512_000,
            ..SlurmNode::default()
        }
    }

    #[test]
    fn nodes_group_into_pools_per_partition_and_gpu() {
        let nodes = [
            node("a1", &["gpu"], "gpu:a100:8", "driver_535.104.05"),
            node("a2", &["gpu"], "gpu:a100:8", "driver_535.104.05"),
            node("h1", &["gpu", "big"], "gpu:h100:8", "driver_550.54.14"),
            node("c1", &["cpu"], "", ""),
        ];
        let got = pools(
            &nodes,
            None,
            &ConfiguredFacts::default(),
            "/slurm/v0.0.38/nodes",
        );
        let summary: Vec<(String, Option<u32>, u32, Option<String>)> = got
            .iter()
            .map(|p| {
                (
                    p.name.clone(),
                    p.nodes,
                    p.gpus_per_node,
                    p.driver_version.clone(),
                )
            })
            .collect();
        assert_eq!(
            summary,
            vec![
                ("big".into(), Some(1), 8, Some("550.54.14".into())),
                ("cpu".into(), Some(1), 0, None),
                ("gpu:a100x8".into(), Some(2), 8, Some("535.104.05".into())),
                ("gpu:h100x8".into(), Some(1), 8, Some("550.54.14".into())),
            ]
        );
        let a100 = &got[2];
        assert_eq!(a100.placement["partition"], "gpu");
        assert_eq!(a100.placement["gres_type"], "a100");
        assert_eq!(
            a100.source,
            "slurmrestd GET /slurm/v0.0.38/nodes; driver from node features"
        );
        let only = pools(&nodes, Some("cpu"), &ConfiguredFacts::default(), "x");
        assert_eq!(only.len(), 1);
        assert_eq!(only[0].name, "cpu");
    }

    #[test]
    fn configured_facts_fill_what_the_nodes_do_not_say() {
        let nodes = [node("vm", &["edgeloop"], "gpu:fake:2", "")];
        let configured = ConfiguredFacts {
            driver_version: Some("470.82".into()),
            cuda_version: None,
            containers: vec![ContainerWay::Pyxis],
        };
        let got = pools(&nodes, None, &configured, "/slurm/v0.0.38/nodes");
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].name, "edgeloop");
        assert_eq!(got[0].gpu_type.as_deref(), Some("fake"));
        assert_eq!(got[0].driver_version.as_deref(), Some("470.82"));
        assert!(got[0].source.ends_with("driver from the bridge's config"));
        // How the nodes run images is the bridge's config too.
        assert_eq!(got[0].containers, [ContainerWay::Pyxis]);
    }

    proptest::proptest! {
        #[test]
        fn parsers_never_panic(s in ".{0,200}") {
            let _ = gpu_gres(&s);
            let _ = driver_features(&s);
        }
    }
}
