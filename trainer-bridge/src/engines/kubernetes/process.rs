//! The trainer container's program words and environment, per launcher:
//! the one place that knows how a multi-process job is started inside an
//! Indexed Job's pods, and how a launch's words survive Kubernetes' `$(VAR)`
//! expansion. Kept apart from the object builders because this is where the
//! rank arithmetic and the escaping live, and both are easy to get subtly
//! wrong.
//!
//! Launchers:
//! - [`Launcher::None`]: the command runs as given in every pod.
//! - [`Launcher::Torchrun`]: the environment of [`crate::launch::torchrun_env`]
//!   with `MASTER_ADDR=<name>-0.<name>`, the spec's `MASTER_PORT`, and
//!   `NODE_RANK` taken from the pod's completion index through the downward
//!   API (the `batch.kubernetes.io/job-completion-index` annotation, the same
//!   value Kubernetes puts in `JOB_COMPLETION_INDEX`). With one process per
//!   node the command is run directly with `RANK = NODE_RANK` and
//!   `LOCAL_RANK = 0`, so no torchrun is needed in the image. With more, one
//!   container cannot host several ranks without an agent, so the command is
//!   run under `torchrun --nnodes --nproc-per-node --node-rank --master-addr
//!   --master-port --no-python` (torchrun must be in the image), which sets
//!   `RANK`/`LOCAL_RANK` per worker.
//! - [`Launcher::Horovod`]: on one node, `horovodrun -np N -H localhost:N`
//!   (horovodrun in the image). Across nodes Horovod needs MPI or SSH between
//!   the pods (what the MPI Operator's MPIJob sets up); this engine does not,
//!   so multi-node Horovod is refused.
//!
//! NCCL settings arrive in `Launch::env` like every other variable; they are
//! in the one container of the pod template, so every pod (rank) of the Job,
//! and every torchrun worker in it, has them.
//!
//! Kubernetes expands `$(VAR)` in `command`, `args` and `env` values; every
//! `$` of the launch is written as `$$` ([`escape_expansion`]) so the words
//! reach the process exactly as given.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{EnvVar, EnvVarSource, ObjectFieldSelector};

use crate::engines::{EngineError, Launch, Launcher};
use crate::launch::{self, RankInfo};

/// Set by the Job controller on each pod of an Indexed Job.
pub const INDEX_ANNOTATION: &str = "batch.kubernetes.io/job-completion-index";

/// Writes every `$` as `$$`, which Kubernetes' `$(VAR)` expansion turns back
/// into one `$`: the text comes out unchanged whatever it holds.
pub fn escape_expansion(s: &str) -> String {
    s.replace('$', "$$")
}

/// Kubernetes' `$(VAR)` expansion (k8s.io/kubernetes
/// third_party/forked/golang/expansion): `$$` is `$`, `$(NAME)` a
/// defined variable's value, anything else stays. The inverse of
/// [`escape_expansion`]; the engine's tests and the fake API server of the
/// integration tests use it to run a pod's words as Kubernetes would.
pub fn expand_like_kubernetes(input: &str, env: &BTreeMap<String, String>) -> String {
    let b = input.as_bytes();
    let mut out = String::new();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'$' && i + 1 < b.len() {
            if b[i + 1] == b'$' {
                out.push('$');
                i += 2;
                continue;
            }
            if b[i + 1] == b'(' {
                if let Some(end) = input[i + 2..].find(')') {
                    let name = &input[i + 2..i + 2 + end];
                    match env.get(name) {
                        Some(v) => out.push_str(v),
                        None => out.push_str(&format!("$({name})")),
                    }
                    i += 2 + end + 1;
                    continue;
                }
            }
            out.push('$');
            i += 1;
            continue;
        }
        let Some(c) = input[i..].chars().next() else {
            break;
        };
        out.push(c);
        i += c.len_utf8();
    }
    out
}

fn is_env_name(name: &str) -> bool {
    let mut bytes = name.bytes();
    matches!(bytes.next(), Some(b) if b.is_ascii_alphabetic() || b == b'_')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

fn field_env(name: &str, field_path: &str) -> EnvVar {
    EnvVar {
        name: name.to_string(),
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector {
                field_path: field_path.to_string(),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The pod's completion index, through the downward API.
fn index_field_path() -> String {
    format!("metadata.annotations['{INDEX_ANNOTATION}']")
}

/// The program words and the environment of the trainer container.
pub(super) fn process(
    launch: &Launch,
    name: &str,
) -> Result<(Vec<String>, Vec<EnvVar>), EngineError> {
    if launch.command.is_empty() {
        return Err(EngineError::Refused("the job has no command".to_string()));
    }
    if launch.command.iter().any(|w| w.contains('\0')) {
        return Err(EngineError::Refused(
            "the command contains a NUL byte".to_string(),
        ));
    }
    let nodes = launch.nodes.max(1);
    let mut plain = launch.env.clone();
    let mut from_index: Vec<&str> = Vec::new();
    // Escaped once here; the words added below are ours and hold no `$`
    // except where Kubernetes is meant to expand.
    let mut words: Vec<String> = launch.command.iter().map(|w| escape_expansion(w)).collect();
    match launch.launcher {
        Launcher::None => {}
        Launcher::Torchrun { nproc_per_node } => {
            if nproc_per_node == 0 {
                return Err(EngineError::Refused(
                    "torchrun with nproc_per_node = 0".to_string(),
                ));
            }
            let master_addr = format!("{name}-0.{name}");
            let master_port = launch::master_port(launch);
            // Node 0's values; NODE_RANK (and RANK) are per pod, below.
            let env = launch::torchrun_env(&RankInfo {
                master_addr: master_addr.clone(),
                master_port,
                nnodes: nodes,
                nproc_per_node,
                node_rank: 0,
                local_rank: 0,
            })
            .map_err(|e| EngineError::Refused(e.to_string()))?;
            plain.extend(env);
            plain.remove("NODE_RANK");
            plain.remove("RANK");
            from_index.push("NODE_RANK");
            if nproc_per_node == 1 {
                from_index.push("RANK");
            } else {
                // torchrun gives each worker its RANK and LOCAL_RANK.
                plain.remove("LOCAL_RANK");
                let mut run = vec![
                    "torchrun".to_string(),
                    format!("--nnodes={nodes}"),
                    format!("--nproc-per-node={nproc_per_node}"),
                    // Kubernetes fills in the pod's own rank.
                    "--node-rank=$(NODE_RANK)".to_string(),
                    format!("--master-addr={master_addr}"),
                    format!("--master-port={master_port}"),
                    "--no-python".to_string(),
                ];
                run.append(&mut words);
                words = run;
            }
        }
        Launcher::Horovod { slots_per_node } => {
            if nodes > 1 {
                return Err(EngineError::Refused(format!(
                    "Horovod across {nodes} nodes needs MPI or SSH between the pods (the MPI \
                     Operator's MPIJob sets that up); the kubernetes engine runs Indexed Jobs \
                     and only starts Horovod on one node"
                )));
            }
            words = launch::horovod_command(&["localhost".to_string()], slots_per_node, &words)
                .map_err(|e| EngineError::Refused(e.to_string()))?;
        }
    }
    let mut env = Vec::with_capacity(plain.len() + from_index.len());
    for (k, v) in &plain {
        if !is_env_name(k) {
            return Err(EngineError::Refused(format!(
                "{k:?} is not a valid environment variable name"
            )));
        }
        if v.contains('\0') {
            return Err(EngineError::Refused(format!(
                "the value of {k} contains a NUL byte"
            )));
        }
        env.push(EnvVar {
            name: k.clone(),
            value: Some(escape_expansion(v)),
            ..Default::default()
        });
    }
    for k in from_index {
        env.push(field_env(k, &index_field_path()));
    }
    Ok((words, env))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::engines::kubernetes::build_job;
    use crate::engines::kubernetes::test_fixtures::{
        container, env_of, job_of, launch, settings, CKPT, JOB_ID,
    };
    use crate::launch::CHECKPOINT_DIR;

    #[test]
    fn torchrun_one_process_per_node_gets_the_rank_env_from_the_completion_index() {
        let (_, job) = job_of(&launch());
        let env = env_of(&job);
        let index = format!("field:metadata.annotations['{INDEX_ANNOTATION}']");
        let expect = [
            ("MASTER_ADDR", "train-1a2b3c4d-2-0.train-1a2b3c4d-2"),
            ("MASTER_PORT", "29511"),
            ("WORLD_SIZE", "2"),
            ("NNODES", "2"),
            ("NPROC_PER_NODE", "1"),
            ("LOCAL_RANK", "0"),
            ("LOCAL_WORLD_SIZE", "1"),
            ("NODE_RANK", index.as_str()),
            ("RANK", index.as_str()),
            ("EDGELOOP_JOB_ID", JOB_ID),
            (CHECKPOINT_DIR, CKPT),
        ];
        for (k, v) in expect {
            assert_eq!(env.get(k).map(String::as_str), Some(v), "{k}: {env:?}");
        }
        let names: Vec<&str> = container(&job)
            .env
            .iter()
            .flatten()
            .map(|e| e.name.as_str())
            .collect();
        let mut unique = names.clone();
        unique.sort();
        unique.dedup();
        assert_eq!(unique.len(), names.len(), "no variable twice: {names:?}");
        let c = container(&job);
        assert_eq!(c.command.as_deref(), Some(&["python".to_string()][..]));
    }

    #[test]
    fn torchrun_several_processes_per_node_runs_under_torchrun() {
        let mut l = launch();
        l.launcher = Launcher::Torchrun { nproc_per_node: 4 };
        let (_, job) = job_of(&l);
        let env = env_of(&job);
        assert_eq!(env["WORLD_SIZE"], "8");
        assert_eq!(env["NPROC_PER_NODE"], "4");
        assert!(env["NODE_RANK"].starts_with("field:"));
        assert!(
            !env.contains_key("RANK") && !env.contains_key("LOCAL_RANK"),
            "{env:?}"
        );
        let c = container(&job);
        let mut words = c.command.clone().unwrap();
        words.extend(c.args.clone().unwrap());
        assert_eq!(
            words[..8],
            [
                "torchrun",
                "--nnodes=2",
                "--nproc-per-node=4",
                "--node-rank=$(NODE_RANK)",
                "--master-addr=train-1a2b3c4d-2-0.train-1a2b3c4d-2",
                "--master-port=29511",
                "--no-python",
                "python",
            ]
        );
        // What the kubelet makes of it in pod 1.
        let mut pod_env: BTreeMap<String, String> = env.clone();
        pod_env.insert("NODE_RANK".into(), "1".into());
        let run: Vec<String> = words
            .iter()
            .map(|w| expand_like_kubernetes(w, &pod_env))
            .collect();
        assert_eq!(run[3], "--node-rank=1");
        assert_eq!(run[8..], ["train.py", "--lr", "$(HOME) $$ $"]);
    }

    #[test]
    fn launcher_none_and_horovod() {
        let mut l = launch();
        l.launcher = Launcher::None;
        let (_, job) = job_of(&l);
        let env = env_of(&job);
        assert!(!env.contains_key("MASTER_ADDR") && !env.contains_key("NODE_RANK"));
        assert_eq!(env["MASTER_PORT"], "29511", "the launch's own env stays");

        l.launcher = Launcher::Horovod { slots_per_node: 2 };
        l.nodes = 1;
        let (_, job) = job_of(&l);
        let c = container(&job);
        let mut words = c.command.clone().unwrap();
        words.extend(c.args.clone().unwrap());
        assert_eq!(words[..5], ["horovodrun", "-np", "2", "-H", "localhost:2"]);
        assert_eq!(words[5], "python");

        l.nodes = 3;
        match build_job(&l, &settings()) {
            Err(EngineError::Refused(m)) => assert!(m.contains("MPI"), "{m}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn every_word_and_value_survives_kubernetes_expansion() {
        let words = [
            "$(HOME)",
            "$$",
            "$",
            "a$",
            "$$(X)",
            "$(",
            "$(NODE_RANK)",
            "${PATH}",
            "`x` 'y' \"z\"",
            "ünï $(WORLD_SIZE)",
        ];
        let mut l = launch();
        l.command = words.iter().map(|w| w.to_string()).collect();
        for w in words {
            l.env.insert(format!("V{}", l.env.len()), w.to_string());
        }
        let (_, job) = job_of(&l);
        let c = container(&job);
        // What the kubelet has when it expands: every variable defined.
        let mut defined = BTreeMap::new();
        for e in c.env.iter().flatten() {
            defined.insert(e.name.clone(), "EXPANDED".to_string());
        }
        defined.insert("HOME".into(), "EXPANDED".into());
        let mut run = c.command.clone().unwrap();
        run.extend(c.args.clone().unwrap_or_default());
        let run: Vec<String> = run
            .iter()
            .map(|w| expand_like_kubernetes(w, &defined))
            .collect();
        assert_eq!(run, words);
        for e in c.env.iter().flatten() {
            if let (Some(v), Some(given)) = (&e.value, l.env.get(&e.name)) {
                assert_eq!(&expand_like_kubernetes(v, &defined), given, "{}", e.name);
            }
        }
    }
}
