#![allow(clippy::unwrap_used)]
//! The job spec (parsing, field-named errors), the pre-flight check against
//! real compatibility tables, and the launch builders.

use std::collections::BTreeMap;
use std::path::Path;

use edgeloop_trainer_bridge::engines::Launcher;
use edgeloop_trainer_bridge::engines::NodePool;
use edgeloop_trainer_bridge::launch::{
    build_launch, contract_env, horovod_command, job_env, master_port, nodes_to_run, torchrun_env,
    AttemptPlan, LaunchError, RankInfo,
};
use edgeloop_trainer_bridge::preflight::{check, gpu_type_matches, ClusterFacts, Refusal};
use edgeloop_trainer_bridge::spec::{
    EngineKind, Framework, JobSpec, LauncherSpec, Precision, Requirement, SpecError, Version,
    VersionOp,
};
use proptest::prelude::*;

const FULL_YAML: &str = r#"
name: mnist-cnn
image: ghcr.io/acme/train:1.2
command: [python, train.py]
args: ["--epochs", "3"]
env: {SEED: "42", PYTHONUNBUFFERED: "1"}
working_dir: src
resources: {nodes: 2, gpus_per_node: 8, cpus: 32, memory_mb: 256000, gpu_type: A100}
launcher: {type: torchrun, master_port: 29600}
nccl: {NCCL_DEBUG: INFO, NCCL_SOCKET_IFNAME: eth0, NCCL_IB_HCA: mlx5}
precision: bf16
datasets: ["s3://bucket/mnist", "hf://datasets/mnist"]
hyperparameters: {lr: 0.001, batch_size: 64, schedule: {warmup: 100}}
checkpoint: {every_steps: 500, every_minutes: 20, keep_last: 5}
restarts: {max_restarts: 5, backoff_seconds: 30, backoff_max_seconds: 900}
requirements: ["torch>=2.1", "cuda >= 12.1"]
engine: slurm
"#;

const MINIMAL_JSON: &str = r#"{"name": "tiny", "command": ["./train"]}"#;

fn minimal() -> JobSpec {
    JobSpec::from_json(MINIMAL_JSON.as_bytes()).unwrap()
}

fn field_of(result: Result<JobSpec, SpecError>) -> String {
    match result {
        Ok(spec) => panic!("accepted: {spec:?}"),
        Err(SpecError::Invalid { field, .. }) => field,
        Err(e @ SpecError::Malformed { .. }) => panic!("no field named: {e}"),
    }
}

/// Replaces (or adds) top-level keys of the minimal spec, then parses.
fn json_with(patch: serde_json::Value) -> Result<JobSpec, SpecError> {
    let mut doc: serde_json::Value = serde_json::from_str(MINIMAL_JSON).unwrap();
    for (k, v) in patch.as_object().unwrap() {
        doc[k] = v.clone();
    }
    JobSpec::from_json(&serde_json::to_vec_pretty(&doc).unwrap())
}

#[test]
fn full_yaml_parses_with_every_field() {
    let spec = JobSpec::from_yaml(FULL_YAML).unwrap();
    assert_eq!(spec.name, "mnist-cnn");
    assert_eq!(spec.resources.nodes, 2);
    assert_eq!(spec.resources.gpu_type.as_deref(), Some("A100"));
    assert_eq!(
        spec.launcher,
        LauncherSpec::Torchrun {
            nproc_per_node: None,
            master_port: 29600
        }
    );
    assert_eq!(spec.launcher.procs_per_node(8), 8);
    assert_eq!(spec.precision, Some(Precision::Bf16));
    assert_eq!(spec.engine, Some(EngineKind::Slurm));
    assert_eq!(spec.checkpoint.every_steps, Some(500));
    assert_eq!(spec.restarts.max_restarts, 5);
    assert_eq!(spec.requirements.len(), 2);
    assert_eq!(spec.requirements[1].framework, Framework::Cuda);
    assert_eq!(spec.requirements[1].to_string(), "cuda>=12.1");
    assert_eq!(spec.hyperparameters["schedule"]["warmup"], 100);
}

#[test]
fn json_and_yaml_round_trip() {
    let spec = JobSpec::from_yaml(FULL_YAML).unwrap();
    let json = serde_json::to_vec(&spec).unwrap();
    assert_eq!(JobSpec::from_json(&json).unwrap(), spec);
    let yaml = serde_yaml::to_string(&spec).unwrap();
    assert_eq!(JobSpec::from_yaml(&yaml).unwrap(), spec);
}

#[test]
fn defaults_are_applied() {
    let spec = minimal();
    assert_eq!(spec.resources.nodes, 1);
    assert_eq!(spec.resources.gpus_per_node, 0);
    assert_eq!(spec.resources.cpus, 1);
    assert_eq!(spec.launcher, LauncherSpec::None {});
    assert_eq!(spec.checkpoint.every_minutes, Some(30));
    assert_eq!(spec.checkpoint.keep_last, 3);
    assert_eq!(spec.restarts.max_restarts, 3);
    assert_eq!(spec.restarts.backoff_seconds, 10);
    assert_eq!(spec.restarts.backoff_max_seconds, 600);
    assert_eq!(spec.restarts.max_preemptions, 10);
    assert_eq!(spec.precision, None);
    // A torchrun block without a port gets torchrun's default.
    let spec = json_with(serde_json::json!({"launcher": {"type": "torchrun"}})).unwrap();
    assert_eq!(
        spec.launcher,
        LauncherSpec::Torchrun {
            nproc_per_node: None,
            master_port: 29500
        }
    );
    assert_eq!(spec.launcher.procs_per_node(0), 1);
    // keep_last defaults inside a present checkpoint section too.
    let spec = json_with(serde_json::json!({"checkpoint": {"every_steps": 100}})).unwrap();
    assert_eq!(spec.checkpoint.keep_last, 3);
    assert_eq!(spec.checkpoint.every_minutes, None);
}

#[test]
fn parse_errors_name_the_field() {
    use serde_json::json;
    let cases: Vec<(serde_json::Value, &str)> = vec![
        (json!({"nmae": "x"}), "nmae"),
        (
            json!({"resources": {"gpu_per_node": 1}}),
            "resources.gpu_per_node",
        ),
        (json!({"resources": {"nodes": "two"}}), "resources.nodes"),
        (json!({"resources": {"nodes": -1}}), "resources.nodes"),
        (
            json!({"resources": {"memory_mb": 1.5}}),
            "resources.memory_mb",
        ),
        (json!({"command": "python"}), "command"),
        (json!({"command": ["python", 3]}), "command[1]"),
        (json!({"env": {"SEED": 42}}), "env.SEED"),
        (json!({"launcher": {"type": "mpi"}}), "launcher.type"),
        (
            json!({"launcher": {"type": "none", "nproc_per_node": 2}}),
            "launcher.nproc_per_node",
        ),
        // Values inside the tagged launcher are buffered by serde: the
        // section is named, and the message says what was wrong.
        (
            json!({"launcher": {"type": "torchrun", "master_port": 70000}}),
            "launcher",
        ),
        (
            json!({"resources": {"gpus_per_node": 4294967296u64}}),
            "resources.gpus_per_node",
        ),
        (json!({"hyperparameters": []}), "hyperparameters"),
        (json!({"requirements": "torch>=2.0"}), "requirements"),
        (
            json!({"launcher": {"type": "torchrun", "nprocs": 2}}),
            "launcher.nprocs",
        ),
        (
            json!({"launcher": {"type": "horovod", "master_port": 1}}),
            "launcher.master_port",
        ),
        (json!({"launcher": {"nproc_per_node": 2}}), "launcher.type"),
        (json!({"precision": "int4"}), "precision"),
        (json!({"engine": "nomad"}), "engine"),
        (
            json!({"checkpoint": {"every_step": 5}}),
            "checkpoint.every_step",
        ),
        (
            json!({"restarts": {"max_restarts": 1e3}}),
            "restarts.max_restarts",
        ),
        (
            json!({"requirements": ["torch>=2.0", "jax>=0.4"]}),
            "requirements[1]",
        ),
        (json!({"requirements": ["torch=>2.0"]}), "requirements[0]"),
        (json!({"datasets": [{"uri": "s3://x"}]}), "datasets[0]"),
    ];
    for (patch, want) in cases {
        let got = field_of(json_with(patch.clone()));
        assert_eq!(got, want, "for {patch}");
    }
    // Missing required fields are named, at the top and below.
    assert_eq!(
        field_of(JobSpec::from_json(br#"{"command": ["x"]}"#)),
        "name"
    );
    assert_eq!(field_of(JobSpec::from_json(br#"{"name": "x"}"#)), "command");
}

#[test]
fn yaml_parse_errors_name_the_field_too() {
    let cases = [
        (
            "name: a\ncommand: [x]\nresources:\n  gpus: 2\n",
            "resources.gpus",
        ),
        (
            "name: a\ncommand: [x]\nresources:\n  nodes: many\n",
            "resources.nodes",
        ),
        (
            "name: a\ncommand: [x]\nnccl:\n  NCCL_DEBUG: 3\n",
            "nccl.NCCL_DEBUG",
        ),
        (
            "name: a\ncommand: [x]\nrequirements:\n- torch>=2.0\n- mxnet>=1.9\n",
            "requirements[1]",
        ),
        ("command: [x]\n", "name"),
    ];
    for (yaml, want) in cases {
        let err = JobSpec::from_yaml(yaml).unwrap_err();
        assert_eq!(err.field(), Some(want), "for {yaml:?}: {err}");
        // The position in the intermediate JSON would mislead; it is gone.
        assert!(!err.to_string().contains("line"), "{err}");
    }
}

#[test]
fn malformed_documents_are_reported_as_such() {
    for bad in [&b"{"[..], b"", b"[1, 2]", b"\"spec\"", b"{\"name\": }"] {
        let err = JobSpec::from_json(bad).unwrap_err();
        assert!(matches!(err, SpecError::Malformed { .. }), "{err:?}");
    }
    for bad in ["name: [", "- a\n- b", "", "a: b: c"] {
        let err = JobSpec::from_yaml(bad).unwrap_err();
        assert!(
            matches!(err, SpecError::Malformed { .. }),
            "{bad:?}: {err:?}"
        );
    }
    // JSON syntax errors keep serde's line and column: they are the author's.
    let err = JobSpec::from_json(b"{\n  \"name\": \"a\",\n  oops\n}").unwrap_err();
    assert!(err.to_string().contains("line 3"), "{err}");
}

#[test]
fn unknown_fields_in_messages_are_explained() {
    let err = json_with(serde_json::json!({"resources": {"gpu_per_node": 1}})).unwrap_err();
    let text = err.to_string();
    assert!(
        text.starts_with("resources.gpu_per_node: unknown field `gpu_per_node`"),
        "{text}"
    );
    assert!(
        text.contains("gpus_per_node"),
        "lists the expected fields: {text}"
    );
}

#[test]
fn validation_names_the_field() {
    use serde_json::json;
    let cases: Vec<(serde_json::Value, &str, &str)> = vec![
        (json!({"name": "Bad_Name"}), "name", "not a valid name"),
        (json!({"name": "-lead"}), "name", "not a valid name"),
        (json!({"name": "a".repeat(64)}), "name", "not a valid name"),
        (json!({"image": "has space"}), "image", "image reference"),
        (json!({"command": []}), "command", "program"),
        (json!({"command": [""]}), "command[0]", "empty"),
        (json!({"command": ["x", "a\u{0}b"]}), "command[1]", "NUL"),
        (json!({"args": ["ok", "\u{0}"]}), "args[1]", "NUL"),
        (
            json!({"env": {"1BAD": "x"}}),
            "env.1BAD",
            "environment variable name",
        ),
        (
            json!({"env": {"A-B": "x"}}),
            "env.A-B",
            "environment variable name",
        ),
        (
            json!({"env": {"NCCL_DEBUG": "INFO"}}),
            "env.NCCL_DEBUG",
            "under `nccl`",
        ),
        (
            json!({"env": {"EDGELOOP_JOB_ID": "x"}}),
            "env.EDGELOOP_JOB_ID",
            "set by the bridge",
        ),
        (json!({"env": {"OK": "a\u{0}"}}), "env.OK", "NUL"),
        (
            json!({"env": {"RANK": "0"}, "launcher": {"type": "torchrun"}}),
            "env.RANK",
            "launcher sets",
        ),
        (json!({"working_dir": ""}), "working_dir", "non-empty"),
        (
            json!({"resources": {"nodes": 0}}),
            "resources.nodes",
            "1..=1024",
        ),
        (
            json!({"resources": {"nodes": 1025}}),
            "resources.nodes",
            "1..=1024",
        ),
        (
            json!({"resources": {"nodes": 2, "min_nodes": 0}}),
            "resources.min_nodes",
            "1..=2",
        ),
        (
            json!({"resources": {"nodes": 2, "min_nodes": 3}}),
            "resources.min_nodes",
            "1..=2",
        ),
        (
            json!({"resources": {"gpus_per_node": 17}}),
            "resources.gpus_per_node",
            "0..=16",
        ),
        (
            json!({"resources": {"cpus": 0}}),
            "resources.cpus",
            "at least 1",
        ),
        (
            json!({"resources": {"memory_mb": 0}}),
            "resources.memory_mb",
            "at least 1",
        ),
        (
            json!({"resources": {"gpu_type": "A100"}}),
            "resources.gpu_type",
            "no GPUs",
        ),
        (
            json!({"resources": {"gpus_per_node": 1, "gpu_type": " "}}),
            "resources.gpu_type",
            "empty",
        ),
        (
            json!({"launcher": {"type": "torchrun", "master_port": 80}}),
            "launcher.master_port",
            "privileged",
        ),
        (
            json!({"launcher": {"type": "torchrun", "nproc_per_node": 0}}),
            "launcher.nproc_per_node",
            "at least 1",
        ),
        (
            json!({"resources": {"gpus_per_node": 4}, "launcher": {"type": "torchrun", "nproc_per_node": 8}}),
            "launcher.nproc_per_node",
            "only 4 GPUs",
        ),
        (
            json!({"resources": {"gpus_per_node": 2}, "launcher": {"type": "horovod", "slots_per_node": 3}}),
            "launcher.slots_per_node",
            "only 2 GPUs",
        ),
        (
            json!({"nccl": {"NCCL_ALGO": "Ring"}}),
            "nccl.NCCL_ALGO",
            "not passed through",
        ),
        (
            json!({"nccl": {"NCCL_IB_": "x"}}),
            "nccl.NCCL_IB_",
            "not passed through",
        ),
        (
            json!({"nccl": {"LD_PRELOAD": "x"}}),
            "nccl.LD_PRELOAD",
            "not passed through",
        ),
        (
            json!({"nccl": {"NCCL_IB_HCA": "\u{0}"}}),
            "nccl.NCCL_IB_HCA",
            "NUL",
        ),
        (
            json!({"datasets": ["ftp://x/y"]}),
            "datasets[0]",
            "not supported",
        ),
        (
            json!({"datasets": ["s3://ok", "/local/path"]}),
            "datasets[1]",
            "not a URI",
        ),
        (json!({"datasets": ["s3://"]}), "datasets[0]", "no location"),
        (
            json!({"datasets": ["edgeloop-artifact://sha256:ab"]}),
            "datasets[0]",
            "names a digest",
        ),
        (
            json!({"datasets": ["https://a b"]}),
            "datasets[0]",
            "whitespace",
        ),
        (
            json!({"hyperparameters": {"": 1}}),
            "hyperparameters",
            "empty name",
        ),
        (
            json!({"checkpoint": {}}),
            "checkpoint.every_steps",
            "every_minutes",
        ),
        (
            json!({"checkpoint": {"every_steps": 0}}),
            "checkpoint.every_steps",
            "at least 1",
        ),
        (
            json!({"checkpoint": {"every_minutes": 0}}),
            "checkpoint.every_minutes",
            "at least 1",
        ),
        (
            json!({"checkpoint": {"every_steps": 5, "keep_last": 0}}),
            "checkpoint.keep_last",
            "at least 1",
        ),
        (
            json!({"restarts": {"max_restarts": 101}}),
            "restarts.max_restarts",
            "more than 100",
        ),
        (
            json!({"restarts": {"max_preemptions": 1001}}),
            "restarts.max_preemptions",
            "more than 1000",
        ),
        (
            json!({"restarts": {"backoff_seconds": 700}}),
            "restarts.backoff_seconds",
            "backoff_max_seconds",
        ),
        (
            json!({"restarts": {"backoff_max_seconds": 100000}}),
            "restarts.backoff_max_seconds",
            "more than a day",
        ),
    ];
    for (patch, want_field, want_text) in cases {
        match json_with(patch.clone()) {
            Err(SpecError::Invalid { field, message }) => {
                assert_eq!(field, want_field, "for {patch}");
                assert!(message.contains(want_text), "for {patch}: {message}");
            }
            other => panic!("for {patch}: {other:?}"),
        }
    }
}

#[test]
fn accepted_edge_values() {
    use serde_json::json;
    for patch in [
        json!({"resources": {"nodes": 1024, "gpus_per_node": 16}}),
        json!({"name": "a"}),
        json!({"name": "a".repeat(63)}),
        json!({"env": {"_X1": "", "lower_case": "ok"}}),
        json!({"env": {"RANK": "0"}}),
        json!({"nccl": {"NCCL_IB_GID_INDEX": "3", "NCCL_DEBUG": "WARN"}}),
        json!({"datasets": ["file:///data", "gs://b/o", "http://h/x", "HTTPS://h/x", "edgeloop-artifact://sha256:abababababababababababababababababababababababababababababababab"]}),
        json!({"restarts": {"max_restarts": 0, "backoff_seconds": 0, "backoff_max_seconds": 0}}),
        json!({"launcher": {"type": "horovod"}, "resources": {"gpus_per_node": 4}}),
        json!({"launcher": {"type": "none"}}),
        json!({"requirements": ["pytorch ~= 2.1", "tensorflow<2.16", "cuda==12.2.1"]}),
    ] {
        if let Err(e) = json_with(patch.clone()) {
            panic!("refused {patch}: {e}");
        }
    }
}

#[test]
fn requirements_parse_into_framework_op_version() {
    let cases = [
        ("torch>=2.0", Framework::Torch, VersionOp::Ge, "2.0"),
        ("PyTorch == 2.1.2", Framework::Torch, VersionOp::Eq, "2.1.2"),
        ("cuda<=12.4", Framework::Cuda, VersionOp::Le, "12.4"),
        (
            "tensorflow>2.13",
            Framework::TensorFlow,
            VersionOp::Gt,
            "2.13",
        ),
        (
            "tensorflow-gpu<2.12",
            Framework::TensorFlow,
            VersionOp::Lt,
            "2.12",
        ),
        ("torch~=2.4", Framework::Torch, VersionOp::Compatible, "2.4"),
    ];
    for (text, framework, op, version) in cases {
        let r = Requirement::parse(text).unwrap();
        assert_eq!(
            (r.framework, r.op, r.version.clone()),
            (framework, op, Version::parse(version).unwrap()),
            "{text}"
        );
    }
    for (bad, says) in [
        ("jax>=0.4", "unknown framework \"jax\""),
        (">=2.0", "names no framework"),
        ("torch", "expected one of"),
        ("torch!=2.0", "expected one of"),
        ("torch>=", "not a version"),
        ("torch>=2.x", "not a version"),
        ("torch>=2.0+cu121", "not a version"),
        ("torch~=2", "two version components"),
    ] {
        let err = Requirement::parse(bad).unwrap_err();
        assert!(err.contains(says), "{bad}: {err}");
    }
}

#[test]
fn requirement_matching_follows_pep_440() {
    let v = |s: &str| Version::parse(s).unwrap();
    let r = |s: &str| Requirement::parse(s).unwrap();
    let table = [
        ("torch~=2.1", "2.1", true),
        ("torch~=2.1", "2.9.1", true),
        ("torch~=2.1", "3.0", false),
        ("torch~=2.1", "2.0.9", false),
        ("torch~=2.1.3", "2.1.5", true),
        ("torch~=2.1.3", "2.2.0", false),
        ("torch==2.0", "2.0.0", true),
        ("torch>2.0", "2.0.1", true),
        ("torch>2.0", "2.0", false),
        ("torch<2.0", "1.13.1", true),
        ("torch<=2.0", "2.0.0", true),
    ];
    for (req, version, want) in table {
        assert_eq!(r(req).matches(&v(version)), want, "{req} vs {version}");
    }
}

// ---- pre-flight -------------------------------------------------------------

fn gpu_spec(gpus: u32, requirements: &[&str]) -> JobSpec {
    json_with(serde_json::json!({
        "resources": {"gpus_per_node": gpus},
        "requirements": requirements,
    }))
    .unwrap()
}

/// A cluster whose every engine has one pool of 8-GPU nodes on `version`.
fn driver(version: &str) -> ClusterFacts {
    let pool = |engine: &str| NodePool {
        engine: engine.into(),
        name: if engine == "local" { "local" } else { "gpu" }.into(),
        gpus_per_node: 8,
        driver_version: Some(version.into()).filter(|v: &String| !v.is_empty()),
        source: "test".into(),
        ..NodePool::default()
    };
    ClusterFacts {
        engines: vec!["local".into()],
        pools: ["local", "slurm", "ray", "kubernetes"].map(pool).to_vec(),
    }
}

/// Changes every pool of `cluster`.
fn each(cluster: &mut ClusterFacts, change: impl Fn(&mut NodePool)) {
    cluster.pools.iter_mut().for_each(change);
}

fn refusals(spec: &JobSpec, cluster: &ClusterFacts) -> Vec<Refusal> {
    check(spec, cluster).err().unwrap_or_default()
}

#[test]
fn the_issues_example_message_is_exact() {
    let got = refusals(&gpu_spec(1, &["cuda>=12.2"]), &driver("470.82"));
    assert_eq!(
        got,
        vec![Refusal {
            field: "requirements[0]".into(),
            reason: "image needs CUDA 12.2, cluster driver 470.82 supports ≤ 11.4".into(),
        }]
    );
}

#[test]
fn an_image_is_refused_where_no_pool_runs_one_naming_the_field() {
    use edgeloop_api::images::ContainerWay;
    let mut spec = gpu_spec(1, &[]);
    spec.image = Some("localhost/trainer:1".into());
    let mut cluster = driver("535.104.05");
    let got = refusals(&spec, &cluster);
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0].field, "image");
    assert!(got[0].reason.contains("--container-runtime"), "{got:?}");
    // A Slurm pool without a way names the ways it could have.
    cluster.engines = vec!["slurm".into()];
    spec.engine = Some(edgeloop_trainer_bridge::spec::EngineKind::Slurm);
    let got = refusals(&spec, &cluster);
    assert_eq!(got[0].field, "image");
    assert!(
        got[0].reason.contains("slurm pool \"gpu\"") && got[0].reason.contains("pyxis"),
        "{got:?}"
    );
    // With a way, the image is no reason to refuse.
    each(&mut cluster, |p| p.containers = vec![ContainerWay::Pyxis]);
    assert!(check(&spec, &cluster).is_ok());
    // Ray runs its jobs in its nodes' image, and says so.
    cluster.engines = vec!["ray".into()];
    spec.engine = Some(edgeloop_trainer_bridge::spec::EngineKind::Ray);
    each(&mut cluster, |p| p.containers = vec![]);
    let got = refusals(&spec, &cluster);
    assert_eq!(got[0].field, "image");
    assert!(
        got[0]
            .reason
            .contains("ray pool \"gpu\" runs no per-job images")
            && got[0].reason.contains("KubeRay"),
        "{got:?}"
    );
}

#[test]
fn gpu_count_refusal_is_exact() {
    let mut cluster = driver("535.104.05");
    each(&mut cluster, |p| p.gpus_per_node = 4);
    let got = refusals(&gpu_spec(8, &[]), &cluster);
    assert_eq!(
        got,
        vec![Refusal {
            field: "resources.gpus_per_node".into(),
            reason: "needs 8 GPUs per node, this machine has 4".into(),
        }]
    );
    each(&mut cluster, |p| p.gpus_per_node = 0);
    let got = refusals(&gpu_spec(1, &[]), &cluster);
    assert_eq!(
        got[0].reason,
        "needs 1 GPUs per node, this machine has no GPUs"
    );
    // Asking for fewer or as many is fine.
    each(&mut cluster, |p| p.gpus_per_node = 8);
    assert!(check(&gpu_spec(8, &[]), &cluster).is_ok());
}

/// (requirements, driver, accepted?) over the CUDA driver table. Drivers are
/// the GA minimums and the version just below, so an off-by-one row shows.
#[test]
fn cuda_requirements_against_drivers() {
    let table: &[(&str, &str, bool)] = &[
        ("cuda>=11.0", "450.51.05", true),
        ("cuda>=11.0", "450.51.04", false),
        ("cuda>=11.1", "455.23", true),
        ("cuda>=11.2", "460.27.03", true),
        ("cuda>=11.2", "455.32", false),
        ("cuda>=11.4", "470.82.01", true),
        ("cuda>=11.5", "470.82.01", false),
        ("cuda>=11.8", "520.61.05", true),
        ("cuda>=11.8", "515.105.01", false),
        ("cuda>=12.0", "525.60.13", true),
        ("cuda>=12.0", "520.61.05", false),
        ("cuda>=12.1", "530.30.02", true),
        ("cuda>=12.2", "535.54.03", true),
        ("cuda>=12.2", "535.104.05", true),
        ("cuda>=12.3", "535.104.05", false),
        ("cuda>=12.3", "545.23.06", true),
        ("cuda>=12.4", "550.54.14", true),
        ("cuda>=12.5", "555.42.02", true),
        ("cuda>=12.6", "560.28.03", true),
        ("cuda>=12.6", "555.42.06", false),
        ("cuda>=12.7", "560.35.03", false), // no 12.7: the next release is 12.8
        ("cuda>=12.8", "570.26", true),
        ("cuda>=12.9", "570.124.06", false),
        ("cuda>=13.0", "580.65.06", true),
        ("cuda>=13.0", "575.51.03", false),
        ("cuda>=14.0", "580.65.06", false), // beyond the table: the bound itself
        ("cuda==12.2.1", "535.54.03", true),
        ("cuda<12.0", "450.51.05", true), // only an upper bound needs nothing
        ("cuda>10.2", "440.33", true),    // 10.2.89 > 10.2
        ("cuda>10.2", "418.39", false),
        ("cuda>10.2", "450.51.05", true),
        ("cuda~=11.6", "510.39.01", true),
        ("cuda>=10.0", "396.26", false), // older than the whole table
    ];
    for &(req, drv, ok) in table {
        let got = check(&gpu_spec(1, &[req]), &driver(drv));
        assert_eq!(got.is_ok(), ok, "{req} on driver {drv}: {got:?}");
    }
}

/// (requirements, driver, accepted?) over the PyTorch wheel table: a torch
/// requirement needs the CUDA of the oldest build of any allowed release.
#[test]
fn torch_requirements_against_drivers() {
    let table: &[(&str, &str, bool)] = &[
        ("torch==1.13", "510.39.01", true), // cu116 at the oldest
        ("torch==1.13", "495.29.05", false),
        ("torch==1.13.1", "515.43.04", true),
        ("torch==2.0", "515.43.04", true),     // cu117
        ("torch==2.0.1", "510.108.03", false), // 11.6 only
        ("torch==2.1", "520.61.05", true),     // cu118
        ("torch==2.4", "515.43.04", false),
        ("torch==2.6", "520.61.05", true),
        ("torch==2.7", "520.61.05", true),
        ("torch==2.8", "555.42.02", false), // cu126 at the oldest
        ("torch==2.8", "560.28.03", true),
        ("torch>=2.8", "560.28.03", true),
        ("torch==2.9", "560.28.03", true),
        ("torch>=2.0", "470.82.01", false), // every release needs ≥ 11.7
        ("torch>=2.0", "515.43.04", true),
        ("torch>=1.10", "470.82.01", true), // 1.10 had cu102
        ("torch>2.7", "520.61.05", true),   // 2.7.1 is allowed, and has cu118
        ("torch>2.7.9", "515.43.04", false),
        ("torch<2.0", "450.51.05", true),
        ("torch~=2.8", "555.42.02", false),
        ("torch>=2.6, torch<2.8", "520.61.05", true),
        ("torch==3.0", "470.82.01", true), // not in the table: not judged
    ];
    for &(req, drv, ok) in table {
        let reqs: Vec<&str> = req.split(", ").collect();
        let got = check(&gpu_spec(1, &reqs), &driver(drv));
        assert_eq!(got.is_ok(), ok, "{req} on driver {drv}: {got:?}");
    }
}

/// TensorFlow's tested build configurations.
#[test]
fn tensorflow_requirements_against_drivers() {
    let table: &[(&str, &str, bool)] = &[
        ("tensorflow==2.10", "460.27.03", true), // 11.2
        ("tensorflow==2.11", "455.32", false),
        ("tensorflow==2.12", "520.61.05", true), // 11.8
        ("tensorflow==2.13", "515.65.01", false),
        ("tensorflow==2.14", "520.61.05", true),
        ("tensorflow==2.15", "535.54.03", true), // 12.2
        ("tensorflow==2.15", "530.30.02", false),
        ("tensorflow==2.16.1", "545.23.06", true), // 12.3
        ("tensorflow==2.17", "535.104.05", false),
        ("tensorflow==2.18", "555.42.02", true), // 12.5
        ("tensorflow==2.18", "550.54.14", false),
        ("tensorflow>=2.13", "520.61.05", true),
        ("tensorflow>=2.15", "520.61.05", false),
        ("tensorflow<2.12", "460.27.03", true),
    ];
    for &(req, drv, ok) in table {
        let got = check(&gpu_spec(1, &[req]), &driver(drv));
        assert_eq!(got.is_ok(), ok, "{req} on driver {drv}: {got:?}");
    }
}

#[test]
fn framework_refusals_explain_the_number() {
    let got = refusals(&gpu_spec(1, &["torch==2.8"]), &driver("535.104.05"));
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].field, "requirements[0]");
    assert_eq!(
        got[0].reason,
        "torch==2.8 needs CUDA 12.6 (its oldest official build), cluster driver 535.104.05 \
         supports ≤ 12.2 (CUDA 12.x minor-version compatibility might start it, but without \
         PTX JIT for newer code; CUDA 12.6 needs driver ≥ 560.28.03)"
    );
    let got = refusals(
        &gpu_spec(1, &["cuda<13", "tensorflow>=2.15"]),
        &driver("470.82.01"),
    );
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].field, "requirements[1]");
    assert_eq!(
        got[0].reason,
        "tensorflow>=2.15 needs CUDA 12.2 (the version it is tested with), cluster driver \
         470.82.01 supports ≤ 11.4"
    );
    // Every reason is reported, not just the first.
    let mut cluster = driver("450.51.05");
    each(&mut cluster, |p| p.gpus_per_node = 2);
    let got = refusals(
        &gpu_spec(4, &["cuda>=11.8", "torch>=2.0", "tensorflow==2.15"]),
        &cluster,
    );
    let fields: Vec<&str> = got.iter().map(|r| r.field.as_str()).collect();
    assert_eq!(
        fields,
        [
            "resources.gpus_per_node",
            "requirements[0]",
            "requirements[1]",
            "requirements[2]"
        ]
    );
    let driver_too_old = refusals(&gpu_spec(1, &["cuda>=10.0"]), &driver("396.26"));
    assert_eq!(
        driver_too_old[0].reason,
        "image needs CUDA 10.0, cluster driver 396.26 is older than every CUDA release this \
         check knows (10.0 needs ≥ 410.48)"
    );
}

#[test]
fn reported_cuda_version_wins_over_the_driver_table() {
    // A driver newer than the table reports what it supports.
    let mut cluster = driver("590.10");
    each(&mut cluster, |p| p.cuda_version = Some("13.1".into()));
    assert!(check(&gpu_spec(1, &["cuda>=13.1"]), &cluster).is_ok());
    let got = refusals(&gpu_spec(1, &["cuda>=13.2"]), &cluster);
    assert_eq!(
        got[0].reason,
        "image needs CUDA 13.2, cluster driver 590.10 reports CUDA ≤ 13.1"
    );
    // Only a CUDA version.
    let mut cluster = driver("");
    each(&mut cluster, |p| p.cuda_version = Some("11.8".into()));
    let got = refusals(&gpu_spec(1, &["torch==2.8"]), &cluster);
    assert_eq!(
        got[0].reason,
        "torch==2.8 needs CUDA 12.6 (its oldest official build), cluster supports CUDA ≤ 11.8"
    );
}

#[test]
fn cuda_is_not_checked_without_gpus_or_facts() {
    // A CPU job needs no driver at all.
    assert!(check(
        &gpu_spec(0, &["cuda>=12.2", "torch==2.8"]),
        &driver("470.82")
    )
    .is_ok());
    // No facts about the driver: nothing to hold the job against.
    let unknown = driver("");
    assert!(check(&gpu_spec(1, &["cuda>=13.0"]), &unknown).is_ok());
}

#[test]
fn gpu_type_and_engine_refusals() {
    let mut spec = json_with(serde_json::json!({
        "resources": {"gpus_per_node": 1, "gpu_type": "A100"},
        "engine": "slurm",
    }))
    .unwrap();
    let mut cluster = driver("535.104.05");
    each(&mut cluster, |p| {
        p.gpu_type = Some("NVIDIA H100 80GB HBM3".into())
    });
    cluster.engines = vec!["local".into(), "ray".into()];
    // An engine the bridge does not drive has no pools to look at.
    assert_eq!(
        refusals(&spec, &cluster),
        vec![Refusal {
            field: "engine".into(),
            reason: "needs the slurm engine, this bridge offers local, ray".into()
        }]
    );
    cluster.engines.push("slurm".into());
    assert_eq!(
        refusals(&spec, &cluster),
        vec![Refusal {
            field: "resources.gpu_type".into(),
            reason: "needs A100 GPUs, slurm pool \"gpu\" has NVIDIA H100 80GB HBM3".into()
        }]
    );
    each(&mut cluster, |p| {
        p.gpu_type = Some("NVIDIA A100-SXM4-80GB".into())
    });
    let landed = check(&spec, &cluster).unwrap().unwrap();
    assert_eq!(
        (landed.engine.as_str(), landed.name.as_str()),
        ("slurm", "gpu")
    );
    // Without a cluster GPU type there is nothing to compare.
    each(&mut cluster, |p| p.gpu_type = None);
    assert!(check(&spec, &cluster).is_ok());
    spec.engine = Some(EngineKind::Kubernetes);
    cluster.engines.clear();
    assert_eq!(
        refusals(&spec, &cluster)[0].reason,
        "needs the kubernetes engine, this bridge offers none"
    );
}

#[test]
fn gpu_type_matching_is_by_whole_words() {
    let table = [
        ("A100", "NVIDIA A100-SXM4-80GB", true),
        ("a100-80gb", "NVIDIA A100-SXM4-80GB", true),
        ("A100 40GB", "NVIDIA A100-SXM4-80GB", false),
        ("A10", "NVIDIA A100-SXM4-80GB", false),
        ("A10", "NVIDIA A10", true),
        ("H100", "NVIDIA H100 80GB HBM3", true),
        ("-", "NVIDIA H100", false),
    ];
    for (want, have, ok) in table {
        assert_eq!(gpu_type_matches(want, have), ok, "{want} vs {have}");
    }
}

// ---- launch -----------------------------------------------------------------

fn contract() -> BTreeMap<String, String> {
    contract_env(
        "job-7",
        2,
        Path::new("/data/jobs/job-7/ckpt"),
        Some(Path::new("/data/jobs/job-7/ckpt/step-500")),
        "http://127.0.0.1:7070/report/job-7",
    )
    .unwrap()
}

#[test]
fn contract_env_has_the_contract() {
    let env = contract();
    let want: BTreeMap<String, String> = [
        ("EDGELOOP_ATTEMPT", "2"),
        ("EDGELOOP_CHECKPOINT_DIR", "/data/jobs/job-7/ckpt"),
        ("EDGELOOP_JOB_ID", "job-7"),
        ("EDGELOOP_REPORT_URL", "http://127.0.0.1:7070/report/job-7"),
        ("EDGELOOP_RESUME_FROM", "/data/jobs/job-7/ckpt/step-500"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    assert_eq!(env, want);
    let first = contract_env("j", 0, Path::new("/c"), None, "u").unwrap();
    assert_eq!(first["EDGELOOP_RESUME_FROM"], "");
}

#[cfg(unix)]
#[test]
fn contract_env_refuses_non_utf8_paths() {
    use std::ffi::OsStr;
    use std::os::unix::ffi::OsStrExt;
    let bad = Path::new(OsStr::from_bytes(b"/data/\xff"));
    assert!(matches!(
        contract_env("j", 0, bad, None, "u"),
        Err(LaunchError::NotUtf8 {
            what: "checkpoint",
            ..
        })
    ));
    assert!(matches!(
        contract_env("j", 0, Path::new("/ok"), Some(bad), "u"),
        Err(LaunchError::NotUtf8 { what: "resume", .. })
    ));
}

#[test]
fn launch_from_the_full_spec() {
    let spec = JobSpec::from_yaml(FULL_YAML).unwrap();
    let contract = contract();
    let plan = AttemptPlan {
        job_id: "job-7",
        attempt: 2,
        job_dir: Path::new("/data/jobs/job-7"),
        log_path: Path::new("/data/jobs/job-7/attempt-2.log"),
        pool: None,
        contract: &contract,
        pinned_image: None,
    };
    let launch = build_launch(&spec, &plan);
    assert_eq!(launch.job_id, "job-7");
    assert_eq!(launch.attempt, 2);
    assert_eq!(launch.name, "mnist-cnn");
    assert_eq!(launch.image.as_deref(), Some("ghcr.io/acme/train:1.2"));
    assert_eq!(launch.command, ["python", "train.py", "--epochs", "3"]);
    assert_eq!(launch.workdir, Path::new("/data/jobs/job-7/src"));
    assert_eq!(
        (
            launch.nodes,
            launch.gpus_per_node,
            launch.cpus_per_node,
            launch.memory_mb
        ),
        (2, 8, 32, 256_000)
    );
    assert_eq!(launch.launcher, Launcher::Torchrun { nproc_per_node: 8 });
    assert_eq!(launch.log_path, Path::new("/data/jobs/job-7/attempt-2.log"));
    assert_eq!(master_port(&launch), 29600);
    let env = &launch.env;
    for (k, v) in [
        ("SEED", "42"),
        ("PYTHONUNBUFFERED", "1"),
        ("NCCL_DEBUG", "INFO"),
        ("NCCL_SOCKET_IFNAME", "eth0"),
        ("NCCL_IB_HCA", "mlx5"),
        ("MASTER_PORT", "29600"),
        ("EDGELOOP_CHECKPOINT_EVERY_STEPS", "500"),
        ("EDGELOOP_CHECKPOINT_EVERY_MINUTES", "20"),
        ("EDGELOOP_PRECISION", "bf16"),
        (
            "EDGELOOP_DATASETS",
            r#"["s3://bucket/mnist","hf://datasets/mnist"]"#,
        ),
        ("EDGELOOP_JOB_ID", "job-7"),
        ("EDGELOOP_ATTEMPT", "2"),
        ("EDGELOOP_RESUME_FROM", "/data/jobs/job-7/ckpt/step-500"),
    ] {
        assert_eq!(env.get(k).map(String::as_str), Some(v), "{k}");
    }
    let hyper: serde_json::Value = serde_json::from_str(&env["EDGELOOP_HYPERPARAMETERS"]).unwrap();
    assert_eq!(hyper["batch_size"], 64);
}

#[test]
fn launchers_and_workdirs_map_over() {
    let contract = contract();
    let plan = AttemptPlan {
        job_id: "j",
        attempt: 0,
        job_dir: Path::new("/jobs/j"),
        log_path: Path::new("/jobs/j/log"),
        pool: None,
        contract: &contract,
        pinned_image: None,
    };
    use serde_json::json;
    let table = [
        (json!({}), Launcher::None, "/jobs/j"),
        (
            json!({"launcher": {"type": "torchrun"}}),
            Launcher::Torchrun { nproc_per_node: 1 },
            "/jobs/j",
        ),
        (
            json!({"launcher": {"type": "torchrun", "nproc_per_node": 2}, "resources": {"gpus_per_node": 4}}),
            Launcher::Torchrun { nproc_per_node: 2 },
            "/jobs/j",
        ),
        (
            json!({"launcher": {"type": "horovod"}, "resources": {"gpus_per_node": 4}}),
            Launcher::Horovod { slots_per_node: 4 },
            "/jobs/j",
        ),
        (
            json!({"working_dir": "/abs/dir"}),
            Launcher::None,
            "/abs/dir",
        ),
        (
            json!({"working_dir": "rel/dir"}),
            Launcher::None,
            "/jobs/j/rel/dir",
        ),
    ];
    for (patch, launcher, workdir) in table {
        let spec = json_with(patch.clone()).unwrap();
        let launch = build_launch(&spec, &plan);
        assert_eq!(launch.launcher, launcher, "{patch}");
        assert_eq!(launch.workdir, Path::new(workdir), "{patch}");
    }
    // No launcher, no MASTER_PORT; the default checkpoint cadence is passed.
    let env = job_env(&minimal(), &contract);
    assert!(!env.contains_key("MASTER_PORT"));
    assert_eq!(env["EDGELOOP_CHECKPOINT_EVERY_MINUTES"], "30");
    assert!(!env.contains_key("EDGELOOP_CHECKPOINT_EVERY_STEPS"));
    assert!(!env.contains_key("EDGELOOP_PRECISION"));
}

#[test]
fn the_contract_wins_over_a_hand_built_env() {
    let mut spec = minimal();
    spec.env.insert("EDGELOOP_JOB_ID".into(), "spoofed".into());
    let env = job_env(&spec, &contract());
    assert_eq!(env["EDGELOOP_JOB_ID"], "job-7");
}

#[test]
fn torchrun_env_table() {
    // (nnodes, nproc, node_rank, local_rank) -> (WORLD_SIZE, RANK)
    let table = [
        (1, 1, 0, 0, 1, 0),
        (1, 8, 0, 7, 8, 7),
        (2, 8, 1, 0, 16, 8),
        (2, 8, 1, 7, 16, 15),
        (4, 2, 3, 1, 8, 7),
        (1024, 16, 1023, 15, 16384, 16383),
    ];
    for (nnodes, nproc, node_rank, local_rank, world, rank) in table {
        let env = torchrun_env(&RankInfo {
            master_addr: "node-0".into(),
            master_port: 29500,
            nnodes,
            nproc_per_node: nproc,
            node_rank,
            local_rank,
        })
        .unwrap();
        let want: BTreeMap<String, String> = [
            ("MASTER_ADDR", "node-0".to_string()),
            ("MASTER_PORT", "29500".to_string()),
            ("WORLD_SIZE", world.to_string()),
            ("RANK", rank.to_string()),
            ("LOCAL_RANK", local_rank.to_string()),
            ("LOCAL_WORLD_SIZE", nproc.to_string()),
            ("NNODES", nnodes.to_string()),
            ("NPROC_PER_NODE", nproc.to_string()),
            ("NODE_RANK", node_rank.to_string()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        assert_eq!(env, want);
    }
    let bad = |nnodes, nproc, node_rank, local_rank, addr: &str| {
        torchrun_env(&RankInfo {
            master_addr: addr.into(),
            master_port: 29500,
            nnodes,
            nproc_per_node: nproc,
            node_rank,
            local_rank,
        })
        .unwrap_err()
    };
    assert!(matches!(bad(2, 2, 2, 0, "a"), LaunchError::Rank(_)));
    assert!(matches!(bad(2, 2, 0, 2, "a"), LaunchError::Rank(_)));
    assert!(matches!(bad(0, 2, 0, 0, "a"), LaunchError::Rank(_)));
    assert!(matches!(bad(1, 1, 0, 0, ""), LaunchError::Rank(_)));
}

#[test]
fn horovod_command_table() {
    let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    let cmd = s(&["python", "train.py", "--lr", "0.1"]);
    assert_eq!(
        horovod_command(&s(&["node-0", "node-1"]), 4, &cmd).unwrap(),
        s(&[
            "horovodrun",
            "-np",
            "8",
            "-H",
            "node-0:4,node-1:4",
            "python",
            "train.py",
            "--lr",
            "0.1"
        ])
    );
    assert_eq!(
        horovod_command(&s(&["10.0.0.5"]), 1, &cmd[..2]).unwrap(),
        s(&[
            "horovodrun",
            "-np",
            "1",
            "-H",
            "10.0.0.5:1",
            "python",
            "train.py"
        ])
    );
    for (hosts, slots, command) in [
        (s(&[]), 1, cmd.clone()),
        (s(&["a"]), 0, cmd.clone()),
        (s(&["a"]), 1, vec![]),
        (s(&["a,b"]), 1, cmd.clone()),
        (s(&["a:2"]), 1, cmd.clone()),
        (s(&["a b"]), 1, cmd.clone()),
        (s(&[""]), 1, cmd.clone()),
    ] {
        assert!(
            matches!(
                horovod_command(&hosts, slots, &command),
                Err(LaunchError::Hosts(_))
            ),
            "{hosts:?} {slots}"
        );
    }
}

// ---- hostile input ----------------------------------------------------------

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn from_json_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        let _ = JobSpec::from_json(&bytes);
    }

    #[test]
    fn from_yaml_never_panics(text in ".{0,256}") {
        let _ = JobSpec::from_yaml(&text);
    }

    /// Structured-looking input reaches the typed layer and the path finder.
    #[test]
    fn json_shaped_input_never_panics(
        text in r#"[\{\}\[\]",: a-z0-9_\\.\-]{0,200}"#,
    ) {
        let _ = JobSpec::from_json(text.as_bytes());
        let _ = JobSpec::from_json(format!("{{\"name\": \"a\", \"command\": [\"x\"], {text}").as_bytes());
        let _ = JobSpec::from_yaml(&text);
    }

    #[test]
    fn yaml_shaped_input_never_panics(
        text in r#"(name|command|resources|nodes|launcher|type|nccl|env|- |: |\n|  |\[|\]|\{|\}|,|torchrun|[a-z0-9]){0,64}"#,
    ) {
        let _ = JobSpec::from_yaml(&text);
    }

    #[test]
    fn requirement_parse_never_panics(text in ".{0,40}") {
        let _ = Requirement::parse(&text);
    }
}

/// Every job spec shown in the docs parses: a copied example must work.
#[test]
fn the_job_specs_in_the_docs_parse() {
    let docs = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs");
    let mut seen = 0;
    for entry in std::fs::read_dir(&docs).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "md") {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        for block in text.split("```json").skip(1) {
            let body = block.split("```").next().unwrap();
            let Ok(value) = serde_json::from_str::<serde_json::Value>(body) else {
                continue;
            };
            // Job specs are the objects with a command; the others are manifests etc.
            if value.get("command").is_none() {
                continue;
            }
            edgeloop_trainer_bridge::spec::JobSpec::from_json(body.as_bytes())
                .unwrap_or_else(|e| panic!("{}: {e}\n{body}", path.display()));
            seen += 1;
        }
    }
    assert!(seen >= 1, "no job spec examples found in docs/");
}

#[test]
fn a_job_lands_in_the_tightest_pool_it_fits() {
    let pool = |name: &str, gpus: u32| NodePool {
        engine: "slurm".into(),
        name: name.into(),
        gpus_per_node: gpus,
        source: "test".into(),
        ..NodePool::default()
    };
    let cluster = ClusterFacts {
        engines: vec!["slurm".into()],
        pools: vec![pool("big", 8), pool("cpu", 0), pool("small", 2)],
    };
    let landed = |gpus: u32| {
        let spec = json_with(serde_json::json!({
            "resources": {"gpus_per_node": gpus},
            "engine": "slurm",
        }))
        .unwrap();
        check(&spec, &cluster).unwrap().unwrap().name
    };
    assert_eq!(landed(0), "cpu");
    assert_eq!(landed(1), "small");
    assert_eq!(landed(4), "big");
}

/// (nodes, min_nodes, available) → the nodes an attempt runs on.
#[test]
fn an_elastic_job_runs_on_the_nodes_there_are_down_to_its_minimum() {
    let table: &[(u32, Option<u32>, Option<u32>, u32)] = &[
        // Not elastic: always the nodes asked for.
        (2, None, Some(1), 2),
        (2, None, None, 2),
        // Elastic, as many or more available: the nodes asked for.
        (4, Some(1), None, 4),
        (4, Some(1), Some(4), 4),
        (4, Some(1), Some(9), 4),
        // Elastic, fewer available: what there is, down to the minimum.
        (4, Some(1), Some(3), 3),
        (4, Some(2), Some(2), 2),
        (4, Some(1), Some(1), 1),
        // Below the minimum: the full size, which then waits or is refused.
        (4, Some(2), Some(1), 4),
        (4, Some(1), Some(0), 4),
        (1, Some(1), Some(0), 1),
    ];
    for &(nodes, min, available, want) in table {
        assert_eq!(
            nodes_to_run(nodes, min, available),
            want,
            "{nodes} nodes, min {min:?}, {available:?} available"
        );
    }
}

/// A pool with fewer nodes than asked takes an elastic job at its size, and
/// refuses it below its minimum, naming `resources.min_nodes`.
#[test]
fn an_elastic_job_fits_a_smaller_pool_and_runs_at_its_size() {
    let pool = NodePool {
        engine: "slurm".into(),
        name: "batch".into(),
        nodes: Some(2),
        source: "test".into(),
        ..NodePool::default()
    };
    let cluster = ClusterFacts {
        engines: vec!["slurm".into()],
        pools: vec![pool],
    };
    let spec = |min: Option<u32>| {
        json_with(serde_json::json!({
            "engine": "slurm",
            "resources": {"nodes": 4, "min_nodes": min},
        }))
        .unwrap()
    };
    let got = refusals(&spec(None), &cluster);
    assert_eq!(got[0].field, "resources.nodes", "{got:?}");
    let got = refusals(&spec(Some(3)), &cluster);
    assert_eq!(
        got,
        vec![Refusal {
            field: "resources.min_nodes".into(),
            reason: "needs 3 nodes, slurm pool \"batch\" has 2".into(),
        }]
    );
    let elastic = spec(Some(1));
    let placed = check(&elastic, &cluster).unwrap();
    let contract = contract();
    let plan = AttemptPlan {
        job_id: "job-8",
        attempt: 3,
        job_dir: Path::new("/data/jobs/job-8"),
        log_path: Path::new("/data/jobs/job-8/attempt-3.log"),
        pool: placed.as_ref(),
        contract: &contract,
        pinned_image: None,
    };
    let launch = build_launch(&elastic, &plan);
    assert_eq!((launch.nodes, launch.min_nodes), (2, Some(1)));
}
