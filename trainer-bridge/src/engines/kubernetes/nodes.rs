//! A Kubernetes cluster's node pools, from `GET /api/v1/nodes`: pure
//! functions of the node objects; the engine does the request.
//!
//! GPUs are the node's allocatable `nvidia.com/gpu` (what the scheduler
//! counts). NVIDIA GPU Feature Discovery (GFD) labels add the facts:
//! `nvidia.com/gpu.product` (the pool's GPU type and the label a job is
//! placed with), `nvidia.com/gpu.count`, `nvidia.com/gpu.memory` (MiB), the
//! driver (`nvidia.com/cuda.driver-version.{major,minor,revision}`, or the
//! older `nvidia.com/cuda.driver.{major,minor,rev}`) and the newest CUDA the
//! driver supports (`nvidia.com/cuda.runtime-version.{major,minor}`, or
//! `nvidia.com/cuda.runtime.{major,minor}`).
//!
//! Nodes with the same product, GPU count, driver and CUDA version form one
//! pool; nodes without GPUs form the `cpu` pool. Left out: cordoned nodes
//! (`spec.unschedulable`) and nodes with a `NoSchedule`/`NoExecute` taint
//! the engine's pods do not tolerate (they tolerate only `nvidia.com/gpu`),
//! e.g. control-plane nodes: no job of ours can land there.
//!
//! Labels and quantities are input from the cluster: anything unreadable is
//! treated as absent, never as a reason to fail or panic.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Node;

use crate::engines::NodePool;

/// The extended resource of NVIDIA's device plugin.
pub const GPU_RESOURCE: &str = "nvidia.com/gpu";
/// The taint GPU nodes usually carry (GPU Operator, cloud node pools);
/// GPU jobs tolerate it.
pub const GPU_TAINT: &str = "nvidia.com/gpu";
pub const PRODUCT_LABEL: &str = "nvidia.com/gpu.product";
pub const COUNT_LABEL: &str = "nvidia.com/gpu.count";
/// MiB per GPU.
pub const MEMORY_LABEL: &str = "nvidia.com/gpu.memory";
/// The endpoint the pools are read from, for their `source`.
pub const NODES_PATH: &str = "/api/v1/nodes";

/// Driver version labels, newest GFD naming first: (major, minor, revision).
const DRIVER_LABELS: [[&str; 3]; 2] = [
    [
        "nvidia.com/cuda.driver-version.major",
        "nvidia.com/cuda.driver-version.minor",
        "nvidia.com/cuda.driver-version.revision",
    ],
    [
        "nvidia.com/cuda.driver.major",
        "nvidia.com/cuda.driver.minor",
        "nvidia.com/cuda.driver.rev",
    ],
];
/// CUDA version labels (GFD's "runtime" is what the driver supports).
const CUDA_LABELS: [[&str; 2]; 2] = [
    [
        "nvidia.com/cuda.runtime-version.major",
        "nvidia.com/cuda.runtime-version.minor",
    ],
    [
        "nvidia.com/cuda.runtime.major",
        "nvidia.com/cuda.runtime.minor",
    ],
];

/// A Kubernetes quantity (`8`, `7500m`, `32Gi`, `16374584Ki`, `1.5e3`,
/// `2E`) as a number; `None` for anything else, negative or not finite.
pub fn quantity(s: &str) -> Option<f64> {
    const BINARY: [(&str, i32); 6] = [
        ("Ki", 10),
        ("Mi", 20),
        ("Gi", 30),
        ("Ti", 40),
        ("Pi", 50),
        ("Ei", 60),
    ];
    let s = s.trim();
    if s.is_empty() || s.len() > 64 {
        return None;
    }
    let binary = BINARY
        .iter()
        .find_map(|(suffix, p)| s.strip_suffix(suffix).map(|n| (n, 2f64.powi(*p))));
    let (number, scale) = match binary {
        Some(found) => found,
        // `1e3` is an exponent, `1E` is exa: an exponent has digits after it.
        None if has_exponent(s) => (s, 1.0),
        None => {
            let last = s.chars().last()?;
            let scale = match last {
                'n' => 1e-9,
                'u' => 1e-6,
                'm' => 1e-3,
                'k' => 1e3,
                'M' => 1e6,
                'G' => 1e9,
                'T' => 1e12,
                'P' => 1e15,
                'E' => 1e18,
                c if c.is_ascii_digit() || c == '.' => 1.0,
                _ => return None,
            };
            let number = if scale == 1.0 {
                s
            } else {
                &s[..s.len() - last.len_utf8()]
            };
            (number, scale)
        }
    };
    // Rust's float parser also reads `inf` and `NaN`; quantities are digits.
    let plain = !number.is_empty()
        && number.starts_with(|c: char| c.is_ascii_digit() || matches!(c, '.' | '+' | '-'))
        && number
            .bytes()
            .all(|b| b.is_ascii_digit() || matches!(b, b'.' | b'+' | b'-' | b'e' | b'E'));
    if !plain {
        return None;
    }
    let value = number.parse::<f64>().ok()? * scale;
    (value.is_finite() && value >= 0.0).then_some(value)
}

fn has_exponent(s: &str) -> bool {
    match s.rfind(['e', 'E']) {
        Some(i) => {
            let exp = s[i + 1..].trim_start_matches(['+', '-']);
            !exp.is_empty() && exp.bytes().all(|b| b.is_ascii_digit())
        }
        None => false,
    }
}

/// A whole count: GPUs, cores (`7500m` is 7 whole cores).
fn whole(q: f64) -> u32 {
    // `as` saturates; `quantity` never returns a negative or NaN.
    q.floor() as u32
}

fn digits(s: Option<&String>) -> Option<&str> {
    let s = s?.trim();
    (!s.is_empty() && s.len() <= 10 && s.bytes().all(|b| b.is_ascii_digit())).then_some(s)
}

/// `major.minor.rev`, or `major.minor` where GFD wrote no revision.
pub fn driver_version(labels: &BTreeMap<String, String>) -> Option<String> {
    DRIVER_LABELS.iter().find_map(|[major, minor, rev]| {
        let (major, minor) = (digits(labels.get(*major))?, digits(labels.get(*minor))?);
        Some(match digits(labels.get(*rev)) {
            Some(rev) => format!("{major}.{minor}.{rev}"),
            None => format!("{major}.{minor}"),
        })
    })
}

/// `major.minor`: the newest CUDA the node's driver supports.
pub fn cuda_version(labels: &BTreeMap<String, String>) -> Option<String> {
    CUDA_LABELS.iter().find_map(|[major, minor]| {
        Some(format!(
            "{}.{}",
            digits(labels.get(*major))?,
            digits(labels.get(*minor))?
        ))
    })
}

/// The product label, when it can be a node selector value.
fn product(labels: &BTreeMap<String, String>) -> Option<String> {
    labels
        .get(PRODUCT_LABEL)
        .map(|p| p.trim())
        .filter(|p| !p.is_empty() && p.len() <= 63)
        .map(str::to_string)
}

fn is_gfd_label(key: &str) -> bool {
    key == PRODUCT_LABEL
        || key == COUNT_LABEL
        || key == MEMORY_LABEL
        || key.starts_with("nvidia.com/cuda.")
}

/// Can a pod of ours be scheduled on this node at all?
fn usable(node: &Node) -> bool {
    let Some(spec) = &node.spec else {
        return true;
    };
    if spec.unschedulable == Some(true) {
        return false;
    }
    spec.taints
        .iter()
        .flatten()
        .all(|t| !matches!(t.effect.as_str(), "NoSchedule" | "NoExecute") || t.key == GPU_TAINT)
}

/// What a node brings to its pool.
struct Facts {
    product: Option<String>,
    gpus: u32,
    driver: Option<String>,
    cuda: Option<String>,
    gpu_memory_bytes: Option<u64>,
    cpus: Option<u32>,
    memory_mb: Option<u64>,
    gfd: bool,
}

fn facts(node: &Node) -> Facts {
    let empty = BTreeMap::new();
    let labels = node.metadata.labels.as_ref().unwrap_or(&empty);
    let allocatable = node.status.as_ref().and_then(|s| s.allocatable.as_ref());
    let get = |key: &str| {
        allocatable
            .and_then(|a| a.get(key))
            .and_then(|q| quantity(&q.0))
    };
    let mut gpus = get(GPU_RESOURCE).map_or(0, whole);
    // GPU sharing (time-slicing) advertises several `nvidia.com/gpu` per
    // device; a pool never claims more GPUs per node than GFD counted.
    if let Some(counted) = digits(labels.get(COUNT_LABEL)).and_then(|c| c.parse::<u32>().ok()) {
        gpus = gpus.min(counted);
    }
    let gpu_memory_bytes = digits(labels.get(MEMORY_LABEL))
        .and_then(|m| m.parse::<u64>().ok())
        .and_then(|mib| mib.checked_mul(1 << 20))
        .filter(|_| gpus > 0);
    Facts {
        // The GPU facts of a node without schedulable GPUs are not a pool's.
        product: product(labels).filter(|_| gpus > 0),
        driver: driver_version(labels).filter(|_| gpus > 0),
        cuda: cuda_version(labels).filter(|_| gpus > 0),
        gpu_memory_bytes,
        cpus: get("cpu").map(whole),
        memory_mb: get("memory").map(|b| (b / f64::from(1u32 << 20)).floor() as u64),
        gfd: gpus > 0 && labels.keys().any(|k| is_gfd_label(k)),
        gpus,
    }
}

type Key = (Option<String>, u32, Option<String>, Option<String>);

#[derive(Default)]
struct Group {
    nodes: u32,
    gpu_memory_bytes: Option<u64>,
    cpus: Option<u32>,
    memory_mb: Option<u64>,
    gfd: bool,
    /// The GFD version labels every node of the group carries, as they are
    /// written: what selects this group among pools of the same product.
    version_labels: Option<BTreeMap<String, String>>,
}

fn min_known<T: Ord + Copy>(a: Option<T>, b: Option<T>) -> Option<T> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

fn version_labels(node: &Node) -> BTreeMap<String, String> {
    node.metadata
        .labels
        .iter()
        .flatten()
        .filter(|(k, _)| k.starts_with("nvidia.com/cuda."))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// The pools of these nodes (see the module docs), in a stable order.
pub fn pools(nodes: &[Node]) -> Vec<NodePool> {
    let mut groups: BTreeMap<Key, Group> = BTreeMap::new();
    for node in nodes.iter().filter(|n| usable(n)) {
        let f = facts(node);
        let g = groups
            .entry((f.product, f.gpus, f.driver, f.cuda))
            .or_default();
        g.nodes = g.nodes.saturating_add(1);
        g.gpu_memory_bytes = min_known(g.gpu_memory_bytes, f.gpu_memory_bytes);
        g.cpus = min_known(g.cpus, f.cpus);
        g.memory_mb = min_known(g.memory_mb, f.memory_mb);
        g.gfd |= f.gfd;
        let mine = version_labels(node);
        g.version_labels = Some(match g.version_labels.take() {
            None => mine,
            Some(common) => common
                .into_iter()
                .filter(|(k, v)| mine.get(k) == Some(v))
                .collect(),
        });
    }
    let base = |(product, gpus, ..): &Key| match (product, gpus) {
        (Some(p), _) => p.clone(),
        (None, 0) => "cpu".to_string(),
        (None, n) => format!("gpu:{n}"),
    };
    let mut per_base: BTreeMap<String, u32> = BTreeMap::new();
    for key in groups.keys() {
        *per_base.entry(base(key)).or_default() += 1;
    }
    groups
        .into_iter()
        .map(|(key, g)| {
            let shared = per_base.get(&base(&key)).copied().unwrap_or(0) > 1;
            let (product, gpus, driver, cuda) = key.clone();
            let mut name = base(&key);
            if shared {
                // Same product, other GPU count or driver: name them apart.
                name = format!(
                    "{name}:{gpus}x:driver-{}:cuda-{}",
                    driver.as_deref().unwrap_or("unknown"),
                    cuda.as_deref().unwrap_or("unknown")
                );
            }
            let mut placement = BTreeMap::new();
            if let Some(p) = &product {
                placement.insert(PRODUCT_LABEL.to_string(), p.clone());
                if shared {
                    // The product alone could land the job on another pool's
                    // driver, which the pre-flight check did not hold it to.
                    placement.extend(g.version_labels.unwrap_or_default());
                }
            }
            NodePool {
                engine: "kubernetes".into(),
                name,
                nodes: Some(g.nodes),
                gpus_per_node: gpus,
                gpu_type: product,
                gpu_memory_bytes: g.gpu_memory_bytes,
                driver_version: driver,
                cuda_version: cuda,
                cpus_per_node: g.cpus.unwrap_or(0),
                memory_mb_per_node: g.memory_mb.unwrap_or(0),
                source: if g.gfd {
                    format!("kubernetes GET {NODES_PATH} (GPU Feature Discovery labels)")
                } else {
                    format!("kubernetes GET {NODES_PATH}")
                },
                placement,
                containers: vec![super::super::ContainerWay::Kubernetes],
            }
        })
        .collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    fn node(name: &str, labels: Value, allocatable: Value, spec: Value) -> Node {
        serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": labels},
            "spec": spec,
            "status": {"allocatable": allocatable},
        }))
        .unwrap()
    }

    fn gfd(product: &str, count: u32, driver: (&str, &str, &str), cuda: (&str, &str)) -> Value {
        json!({
            "kubernetes.io/hostname": "x",
            PRODUCT_LABEL: product,
            COUNT_LABEL: count.to_string(),
            MEMORY_LABEL: "81920",
            "nvidia.com/cuda.driver.major": driver.0,
            "nvidia.com/cuda.driver.minor": driver.1,
            "nvidia.com/cuda.driver.rev": driver.2,
            "nvidia.com/cuda.runtime.major": cuda.0,
            "nvidia.com/cuda.runtime.minor": cuda.1,
        })
    }

    fn alloc(cpu: &str, memory: &str, gpus: Option<&str>) -> Value {
        let mut v = json!({"cpu": cpu, "memory": memory, "pods": "110"});
        if let Some(g) = gpus {
            v[GPU_RESOURCE] = json!(g);
        }
        v
    }

    #[test]
    fn quantities_table() {
        let gi = 1024.0 * 1024.0 * 1024.0;
        let table: &[(&str, Option<f64>)] = &[
            ("8", Some(8.0)),
            ("7500m", Some(7.5)),
            ("32Gi", Some(32.0 * gi)),
            ("16374584Ki", Some(16374584.0 * 1024.0)),
            ("1.5", Some(1.5)),
            ("1e3", Some(1000.0)),
            ("1E3", Some(1000.0)),
            ("2E", Some(2e18)),
            ("2k", Some(2000.0)),
            ("128M", Some(128e6)),
            ("100n", Some(100e-9)),
            (" 4 ", Some(4.0)),
            ("", None),
            ("Gi", None),
            ("-1", None),
            ("inf", None),
            ("NaN", None),
            ("1x", None),
            ("1.2.3", None),
            ("ü", None),
            ("1Zi", None),
            ("9e999", None),
        ];
        for (s, want) in table {
            let got = quantity(s);
            match (got, want) {
                (Some(g), Some(w)) => assert!((g - w).abs() <= w * 1e-12, "{s}: {g} != {w}"),
                _ => assert_eq!(got, *want, "{s}"),
            }
        }
    }

    #[test]
    fn versions_from_either_gfd_naming() {
        let labels = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        let new = labels(&[
            ("nvidia.com/cuda.driver-version.major", "550"),
            ("nvidia.com/cuda.driver-version.minor", "54"),
            ("nvidia.com/cuda.driver-version.revision", "15"),
            ("nvidia.com/cuda.runtime-version.major", "12"),
            ("nvidia.com/cuda.runtime-version.minor", "4"),
        ]);
        assert_eq!(driver_version(&new).as_deref(), Some("550.54.15"));
        assert_eq!(cuda_version(&new).as_deref(), Some("12.4"));
        let old = labels(&[
            ("nvidia.com/cuda.driver.major", "535"),
            ("nvidia.com/cuda.driver.minor", "104"),
            ("nvidia.com/cuda.driver.rev", ""),
            ("nvidia.com/cuda.runtime.major", "12"),
        ]);
        assert_eq!(driver_version(&old).as_deref(), Some("535.104"), "no rev");
        assert_eq!(cuda_version(&old), None, "no minor");
        let bad = labels(&[
            ("nvidia.com/cuda.driver.major", "5x5"),
            ("nvidia.com/cuda.driver.minor", "1"),
        ]);
        assert_eq!(driver_version(&bad), None);
    }

    #[test]
    fn nodes_group_into_pools_by_product_count_driver_and_cuda() {
        let a100 = |name: &str, mem: &str| {
            node(
                name,
                gfd(
                    "NVIDIA-A100-SXM4-80GB",
                    8,
                    ("535", "104", "05"),
                    ("12", "2"),
                ),
                alloc("96", mem, Some("8")),
                json!({"taints": [{"key": GPU_TAINT, "value": "present", "effect": "NoSchedule"}]}),
            )
        };
        let nodes = vec![
            a100("a1", "1056Gi"),
            a100("a2", "1000Gi"),
            node(
                "h1",
                gfd("NVIDIA-H100-80GB-HBM3", 8, ("550", "54", "15"), ("12", "4")),
                alloc("7500m", "16374584Ki", Some("8")),
                json!({}),
            ),
            // No GFD: GPUs from allocatable only.
            node("g1", json!({}), alloc("16", "64Gi", Some("2")), json!({})),
            node("c1", json!({}), alloc("8", "32Gi", None), json!({})),
            node("c2", json!({}), alloc("4", "garbage", Some("0")), json!({})),
            // GFD labels but the device plugin offers none: a CPU node.
            node(
                "c3",
                gfd("Tesla-T4", 1, ("470", "82", "01"), ("11", "4")),
                alloc("8", "32Gi", None),
                json!({}),
            ),
            // Left out: cordoned, or tainted against every pod of ours.
            node(
                "cordoned",
                json!({}),
                alloc("64", "1Ti", None),
                json!({"unschedulable": true}),
            ),
            node(
                "cp",
                json!({}),
                alloc("2", "4Gi", None),
                json!({"taints": [{"key": "node-role.kubernetes.io/control-plane", "effect": "NoSchedule"}]}),
            ),
        ];
        let got = pools(&nodes);
        let summary: Vec<(&str, Option<u32>, u32, u32, u64)> = got
            .iter()
            .map(|p| {
                (
                    p.name.as_str(),
                    p.nodes,
                    p.gpus_per_node,
                    p.cpus_per_node,
                    p.memory_mb_per_node,
                )
            })
            .collect();
        assert_eq!(
            summary,
            [
                ("cpu", Some(3), 0, 4, 32 * 1024),
                ("gpu:2", Some(1), 2, 16, 64 * 1024),
                ("NVIDIA-A100-SXM4-80GB", Some(2), 8, 96, 1000 * 1024),
                ("NVIDIA-H100-80GB-HBM3", Some(1), 8, 7, 15990),
            ]
        );
        let a = &got[2];
        assert_eq!(a.engine, "kubernetes");
        assert_eq!(a.gpu_type.as_deref(), Some("NVIDIA-A100-SXM4-80GB"));
        assert_eq!(a.gpu_memory_bytes, Some(81920 << 20));
        assert_eq!(a.driver_version.as_deref(), Some("535.104.05"));
        assert_eq!(a.cuda_version.as_deref(), Some("12.2"));
        assert_eq!(
            a.source,
            "kubernetes GET /api/v1/nodes (GPU Feature Discovery labels)"
        );
        assert_eq!(
            a.placement,
            BTreeMap::from([(PRODUCT_LABEL.to_string(), a.gpu_type.clone().unwrap())])
        );
        for plain in [&got[0], &got[1]] {
            assert_eq!(
                plain.source, "kubernetes GET /api/v1/nodes",
                "{}",
                plain.name
            );
            assert!(plain.placement.is_empty(), "{}", plain.name);
            assert_eq!(
                (plain.gpu_type.as_ref(), plain.driver_version.as_ref()),
                (None, None)
            );
        }
        assert_eq!(pools(&[]), []);
    }

    #[test]
    fn pools_of_one_product_are_told_apart_by_name_and_placement() {
        let t4 = |name: &str, driver: (&str, &str, &str), gpus: &str| {
            node(
                name,
                gfd("Tesla-T4", 4, driver, ("12", "2")),
                alloc("16", "64Gi", Some(gpus)),
                json!({}),
            )
        };
        let got = pools(&[
            t4("old", ("535", "104", "05"), "4"),
            t4("new", ("550", "54", "15"), "4"),
            // Time-sliced: 16 shares of 4 GPUs.
            t4("shared", ("550", "54", "15"), "16"),
        ]);
        let names: Vec<&str> = got.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "Tesla-T4:4x:driver-535.104.05:cuda-12.2",
                "Tesla-T4:4x:driver-550.54.15:cuda-12.2"
            ]
        );
        assert_eq!(got[1].nodes, Some(2), "GFD's count caps shared GPUs");
        assert_eq!(got[0].placement[PRODUCT_LABEL], "Tesla-T4");
        assert_eq!(got[0].placement["nvidia.com/cuda.driver.major"], "535");
        assert_eq!(got[1].placement["nvidia.com/cuda.driver.major"], "550");
    }

    proptest::proptest! {
        #[test]
        fn untrusted_labels_and_quantities_never_panic(
            values in proptest::collection::vec(".{0,24}", 12),
            gpus in ".{0,12}",
        ) {
            let _ = quantity(&values[0]);
            let keys = [
                PRODUCT_LABEL, COUNT_LABEL, MEMORY_LABEL,
                DRIVER_LABELS[0][0], DRIVER_LABELS[0][1], DRIVER_LABELS[0][2],
                DRIVER_LABELS[1][0], DRIVER_LABELS[1][1],
                CUDA_LABELS[0][0], CUDA_LABELS[1][1],
            ];
            let labels: serde_json::Map<String, Value> = keys
                .iter()
                .zip(&values)
                .map(|(k, v)| (k.to_string(), json!(v)))
                .collect();
            let n = node("n", Value::Object(labels), alloc(&values[10], &values[11], Some(&gpus)), json!({}));
            let got = pools(&[n.clone(), n]);
            proptest::prop_assert_eq!(got.len(), 1);
            proptest::prop_assert_eq!(got[0].nodes, Some(2));
        }
    }
}
