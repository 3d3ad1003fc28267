//! The bridge's [`EngineState`] of an attempt, read off its Job (and, for a
//! failed Job, its pods): pure functions of the objects, so the whole mapping
//! is pinned by a table of Job statuses without an API server. Kept apart
//! from the engine, which only fetches the objects, because this is where
//! Kubernetes' many Job conditions become the bridge's five states.
//!
//! Condition `Complete` is success; `Failed` is a failure whose reason is the
//! condition's, with the exit code of the pod that failed first. Otherwise
//! the attempt is running once a pod is ready (or has ended), and pending
//! before (the Job's `active` count also holds unscheduled pods, so it is not
//! used). A pod that can never start (a bad image) keeps the attempt
//! pending; cancelling it ends it.

use k8s_openapi::api::batch::v1::{Job, JobCondition};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use edgeloop_api::images::{PinKind, PinnedImage};
use edgeloop_models::Digest;

use super::CONTAINER_NAME;
use crate::engines::EngineState;

pub(super) fn condition<'a>(job: &'a Job, kind: &str) -> Option<&'a JobCondition> {
    job.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == kind && c.status == "True")
}

/// The trainer container's exit code in a pod, when it ended with one.
fn exit_code_of(pod: &Pod) -> Option<(i32, Option<Time>)> {
    let statuses = pod.status.as_ref()?.container_statuses.as_ref()?;
    let st = statuses.iter().find(|s| s.name == CONTAINER_NAME)?;
    let term = st.state.as_ref()?.terminated.as_ref()?;
    Some((term.exit_code, term.finished_at.clone()))
}

/// The exit code behind a failed Job: the pod the condition's message
/// names, else the code the message gives, else the pod that failed first
/// (the others are often killed because of it).
pub fn failure_exit_code(message: &str, pods: &[Pod]) -> Option<i32> {
    let failed: Vec<(&Pod, i32, Option<_>)> = pods
        .iter()
        .filter_map(|p| exit_code_of(p).map(|(c, t)| (p, c, t)))
        .filter(|(_, c, _)| *c != 0)
        .collect();
    for (pod, code, _) in &failed {
        if let Some(name) = pod.metadata.name.as_deref() {
            if message.contains(&format!("/{name} ")) {
                return Some(*code);
            }
        }
    }
    if let Some(rest) = message.split("exit code ").nth(1) {
        let digits: String = rest
            .chars()
            .take_while(|c| c.is_ascii_digit() || *c == '-')
            .collect();
        if let Ok(code) = digits.parse() {
            return Some(code);
        }
    }
    failed
        .iter()
        .min_by_key(|(_, _, finished)| (finished.is_none(), finished.clone()))
        .map(|(_, code, _)| *code)
}

/// The Job's state; `pods` are its pods (only read for a failed Job).
pub fn map_status(job: &Job, pods: &[Pod]) -> EngineState {
    if condition(job, "Complete").is_some() {
        return EngineState::Succeeded;
    }
    if let Some(c) = condition(job, "Failed") {
        let message = c.message.clone().unwrap_or_default();
        let reason = match (c.reason.as_deref(), message.is_empty()) {
            (Some(r), false) => format!("Kubernetes Job failed ({r}): {message}"),
            (Some(r), true) => format!("Kubernetes Job failed ({r})"),
            (None, false) => format!("Kubernetes Job failed: {message}"),
            (None, true) => "Kubernetes Job failed".to_string(),
        };
        // A pod evicted, preempted or lost with its node fails the Job by
        // the policy's DisruptionTarget rule: the cluster's doing.
        let disrupted = message.contains("condition DisruptionTarget")
            || pods.iter().any(|p| {
                p.status
                    .as_ref()
                    .and_then(|s| s.conditions.as_ref())
                    .is_some_and(|cs| {
                        cs.iter()
                            .any(|c| c.type_ == "DisruptionTarget" && c.status == "True")
                    })
            });
        if disrupted {
            return EngineState::Preempted { reason };
        }
        return EngineState::Failed {
            exit_code: failure_exit_code(&message, pods),
            reason,
        };
    }
    let status = job.status.clone().unwrap_or_default();
    let started = status.ready.unwrap_or(0) > 0
        || status.succeeded.unwrap_or(0) > 0
        || status.failed.unwrap_or(0) > 0
        || condition(job, "FailureTarget").is_some();
    if started {
        EngineState::Running
    } else {
        EngineState::Pending
    }
}

/// The image `reference` resolved to where the trainer ran: the kubelet's
/// `imageID` of the first pod (by name, so node 0's) that has one, as a
/// manifest pin a retry can run on any node (`name@sha256:…`). `None` while
/// no container has started, and for an `imageID` that names no manifest a
/// registry serves (a bare `sha256:` image ID of an image loaded onto the
/// node): a retry then pulls the reference as it is.
pub fn resolved_image(reference: &str, pods: &[Pod]) -> Option<PinnedImage> {
    let mut ids: Vec<(&str, &str)> = pods
        .iter()
        .filter_map(|p| {
            let name = p.metadata.name.as_deref()?;
            let statuses = p.status.as_ref()?.container_statuses.as_ref()?;
            let st = statuses.iter().find(|s| s.name == CONTAINER_NAME)?;
            Some((name, st.image_id.as_str())).filter(|(_, id)| !id.is_empty())
        })
        .collect();
    ids.sort_unstable();
    let (_, image_id) = ids.first()?;
    manifest_of_image_id(image_id).map(|digest| PinnedImage {
        reference: reference.to_string(),
        digest,
        kind: PinKind::Manifest,
    })
}

/// The manifest digest of a kubelet `imageID`: `name@sha256:<hex>`, with
/// the scheme some runtimes put before it (`docker-pullable://`).
fn manifest_of_image_id(image_id: &str) -> Option<Digest> {
    let id = image_id
        .split_once("://")
        .map_or(image_id, |(_, rest)| rest);
    let (name, digest) = id.split_once('@')?;
    if name.is_empty() {
        return None;
    }
    let hex = digest.strip_prefix("sha256:")?;
    let lower_hex = hex.len() == 64 && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
    lower_hex.then(|| hex.parse().ok()).flatten()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use serde_json::{json, Value};

    use super::*;

    fn job_with_status(status: Value) -> Job {
        serde_json::from_value(json!({
            "apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": "j-1"},
            "status": status,
        }))
        .unwrap()
    }

    fn failed_pod(name: &str, code: i32, finished: &str) -> Pod {
        serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name},
            "status": {"phase": "Failed", "containerStatuses": [{
                "name": CONTAINER_NAME, "image": "i", "imageID": "", "ready": false, "restartCount": 0,
                "state": {"terminated": {"exitCode": code, "finishedAt": finished}}
            }]}
        }))
        .unwrap()
    }

    #[test]
    fn status_mapping_table() {
        let pods = vec![
            failed_pod("j-1-1-bbbbb", 143, "2026-01-01T00:00:09Z"),
            failed_pod("j-1-0-aaaaa", 3, "2026-01-01T00:00:05Z"),
        ];
        let cond = |t: &str, reason: &str, message: &str| json!({"conditions": [{"type": t, "status": "True", "reason": reason, "message": message}]});
        let cases: Vec<(Value, &[Pod], EngineState)> = vec![
            (json!({}), &[], EngineState::Pending),
            (json!({"active": 2, "ready": 0}), &[], EngineState::Pending),
            (json!({"active": 2, "ready": 1}), &[], EngineState::Running),
            (json!({"active": 1, "succeeded": 1}), &[], EngineState::Running),
            (
                json!({"active": 1, "conditions": [{"type": "FailureTarget", "status": "True"}]}),
                &[],
                EngineState::Running,
            ),
            (
                json!({"conditions": [{"type": "Suspended", "status": "True"}]}),
                &[],
                EngineState::Pending,
            ),
            (
                json!({"succeeded": 2, "conditions": [
                    {"type": "SuccessCriteriaMet", "status": "True"},
                    {"type": "Complete", "status": "True"}]}),
                &[],
                EngineState::Succeeded,
            ),
            (
                json!({"conditions": [{"type": "Complete", "status": "False"}], "ready": 1}),
                &[],
                EngineState::Running,
            ),
            (
                cond(
                    "Failed",
                    "PodFailurePolicy",
                    "Container trainer for pod ml/j-1-0-aaaaa failed with exit code 3 matching FailJob rule at index 1",
                ),
                &pods,
                EngineState::Failed {
                    exit_code: Some(3),
                    reason: "Kubernetes Job failed (PodFailurePolicy): Container trainer for pod ml/j-1-0-aaaaa failed with exit code 3 matching FailJob rule at index 1".into(),
                },
            ),
            (
                cond("Failed", "BackoffLimitExceeded", "Job has reached the specified backoff limit"),
                &pods,
                EngineState::Failed {
                    exit_code: Some(3),
                    reason: "Kubernetes Job failed (BackoffLimitExceeded): Job has reached the specified backoff limit".into(),
                },
            ),
            (
                cond(
                    "Failed",
                    "PodFailurePolicy",
                    "Pod ml/j-1-0-aaaaa has condition DisruptionTarget matching FailJob rule at index 0",
                ),
                &[],
                EngineState::Preempted {
                    reason: "Kubernetes Job failed (PodFailurePolicy): Pod ml/j-1-0-aaaaa has condition DisruptionTarget matching FailJob rule at index 0".into(),
                },
            ),
            (
                cond(
                    "Failed",
                    "PodFailurePolicy",
                    "Container trainer for pod ml/gone failed with exit code 42 matching FailJob rule at index 1",
                ),
                &[],
                EngineState::Failed {
                    exit_code: Some(42),
                    reason: "Kubernetes Job failed (PodFailurePolicy): Container trainer for pod ml/gone failed with exit code 42 matching FailJob rule at index 1".into(),
                },
            ),
        ];
        for (status, pods, want) in cases {
            let job = job_with_status(status.clone());
            assert_eq!(map_status(&job, pods), want, "{status}");
        }
    }

    #[test]
    fn the_pod_named_in_the_message_wins_over_the_first_to_fail() {
        let pods = vec![
            failed_pod("j-1-0-aaaaa", 137, "2026-01-01T00:00:01Z"),
            failed_pod("j-1-1-bbbbb", 5, "2026-01-01T00:00:09Z"),
        ];
        assert_eq!(
            failure_exit_code(
                "Container trainer for pod ml/j-1-1-bbbbb failed with exit code 5 matching",
                &pods
            ),
            Some(5)
        );
        assert_eq!(failure_exit_code("", &pods), Some(137));
        assert_eq!(failure_exit_code("", &[]), None);
    }

    fn pod_with_image_id(name: &str, image_id: &str) -> Pod {
        serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name},
            "status": {"containerStatuses": [{
                "name": CONTAINER_NAME, "image": "i", "imageID": image_id,
                "ready": true, "restartCount": 0,
            }]},
        }))
        .unwrap()
    }

    /// (imageID, pinned?) for what kubelets with containerd, CRI-O and
    /// dockershim report.
    #[test]
    fn a_started_pods_image_id_pins_the_manifest() {
        let hex = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
        let table: Vec<(String, bool)> = vec![
            (format!("ghcr.io/acme/train@sha256:{hex}"), true),
            (format!("docker.io/library/busybox@sha256:{hex}"), true),
            (format!("docker-pullable://busybox@sha256:{hex}"), true),
            // Nothing a registry serves, or not a digest at all.
            (format!("sha256:{hex}"), false),
            (format!("@sha256:{hex}"), false),
            ("ghcr.io/acme/train@sha256:abc".to_string(), false),
            (
                format!("ghcr.io/acme/train@sha256:{}", hex.to_uppercase()),
                false,
            ),
            (format!("ghcr.io/acme/train@md5:{hex}"), false),
            (String::new(), false),
        ];
        for (image_id, pinned) in &table {
            let pods = [pod_with_image_id("j-1-0", image_id)];
            let got = resolved_image("ghcr.io/acme/train:1", &pods);
            assert_eq!(got.is_some(), *pinned, "{image_id:?}: {got:?}");
            if let Some(pin) = got {
                assert_eq!(pin.kind, PinKind::Manifest);
                assert_eq!(pin.digest.to_string(), hex);
                assert_eq!(pin.runnable(), format!("ghcr.io/acme/train:1@sha256:{hex}"));
            }
        }
        // Node 0's pod decides, whichever order the API lists them in.
        let other = "f".repeat(64);
        let pods = [
            pod_with_image_id("j-1-1", &format!("x@sha256:{other}")),
            pod_with_image_id("j-1-0", &format!("x@sha256:{hex}")),
        ];
        let pin = resolved_image("x:1", &pods).unwrap();
        assert_eq!(pin.digest.to_string(), hex);
        // A pod not started yet has none.
        assert_eq!(
            resolved_image("x:1", &[pod_with_image_id("j-1-0", "")]),
            None
        );
    }
}
