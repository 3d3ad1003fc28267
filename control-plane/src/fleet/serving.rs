//! What each device serves, for the console API: its assignments joined
//! with its last status report per model, and when its last telemetry
//! report arrived. Reads only. A page of devices costs two batched reads
//! (the assignment sets, then their status records) and one read per
//! device (its last telemetry report, the highest key under its prefix).

use edgeloop_api::fleet::{ServingView, TelemetrySeen};

use super::assignments::AssignmentRecord;
use super::telemetry::{status_key, AssignmentStatusRecord};
use crate::db::Db;
use edgeloop_errors::Result;

/// For each of `devices`, in order: its models and its last report.
pub fn serving_of(
    store: &Db,
    devices: &[&str],
) -> Result<Vec<(Vec<ServingView>, Option<TelemetrySeen>)>> {
    let sets = store.fleet.assignments.get_many(devices)?;
    let assigned: Vec<(&str, AssignmentRecord)> = devices
        .iter()
        .zip(sets)
        .flat_map(|(d, set)| {
            set.unwrap_or_default()
                .assignments
                .into_iter()
                .map(move |a| (*d, a))
        })
        .collect();
    let keys: Vec<String> = assigned
        .iter()
        .map(|(d, a)| status_key(d, &a.model_name))
        .collect();
    let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
    let statuses = store.fleet.assignment_status.get_many(&keys)?;
    let mut models = assigned.into_iter().zip(statuses).peekable();
    let mut out = Vec::with_capacity(devices.len());
    for d in devices {
        let mut serving = Vec::new();
        while let Some(((_, a), status)) = models.next_if(|((device, _), _)| device == d) {
            serving.push(view(a, status));
        }
        let seen = store
            .fleet
            .telemetry
            .last_with_prefix(&format!("{d}/"))?
            .map(|(_, r)| TelemetrySeen {
                received_at: r.received_at,
                lag_seconds: r.recorded_at.map(|t| (r.received_at - t).as_seconds_f64()),
            });
        out.push((serving, seen));
    }
    Ok(out)
}

/// One assigned model and the device's last report on it. A report on
/// another version (the one before, while this downloads) gives what
/// serves but not this assignment's state. Pure.
pub fn view(a: AssignmentRecord, status: Option<AssignmentStatusRecord>) -> ServingView {
    let current = status
        .as_ref()
        .filter(|s| s.model_version == a.model_version);
    ServingView {
        state: current.map(|s| s.state),
        execution_provider: current
            .map(|s| s.execution_provider.clone())
            .unwrap_or_default(),
        reported_at: status.as_ref().map(|s| s.at),
        serving_version: status.and_then(|s| s.running_version),
        model: a.model_name,
        assigned_version: a.model_version,
        variant: a.variant,
    }
}

#[cfg(test)]
mod tests {
    use edgeloop_api::fleet::AssignmentState;
    use edgeloop_models::Digest;
    use time::macros::datetime;

    use super::*;

    fn assigned(version: &str, variant: Option<&str>) -> AssignmentRecord {
        AssignmentRecord {
            model_name: "m".into(),
            model_version: version.into(),
            artifact_digest: Digest::of(b"a"),
            artifact_size: 1,
            manifest_digest: None,
            deployment_id: "d".into(),
            activation_timeout_seconds: 60,
            probe_inputs_digest: None,
            deployment_seq: 1,
            variant: variant.map(str::to_string),
        }
    }

    fn reported(
        version: &str,
        state: AssignmentState,
        running: Option<&str>,
    ) -> AssignmentStatusRecord {
        AssignmentStatusRecord {
            device: "e".into(),
            generation: 1,
            model_name: "m".into(),
            model_version: version.into(),
            state,
            reason: String::new(),
            execution_provider: "CUDAExecutionProvider".into(),
            at: datetime!(2026-12-04 10:00 UTC),
            running_version: running.map(str::to_string),
        }
    }

    #[test]
    fn a_devices_model_joins_its_assignment_and_its_last_report() {
        use AssignmentState as S;
        // (assigned, report, want: state, serving, provider)
        let cases = [
            // Nothing reported yet.
            (assigned("2", None), None, (None, None, "")),
            // Active on the assigned version.
            (
                assigned("2", Some("fp16-gpu")),
                Some(reported("2", S::Active, Some("2"))),
                (Some(S::Active), Some("2"), "CUDAExecutionProvider"),
            ),
            // v2 assigned, the last report is still v1's: v1 serves, v2's
            // state is unknown.
            (
                assigned("2", None),
                Some(reported("1", S::Active, Some("1"))),
                (None, Some("1"), ""),
            ),
            // v2 failed to activate: v1 still serves.
            (
                assigned("2", None),
                Some(reported("2", S::Failed, Some("1"))),
                (Some(S::Failed), Some("1"), "CUDAExecutionProvider"),
            ),
        ];
        for (a, status, (state, serving, provider)) in cases {
            let variant = a.variant.clone();
            let v = view(a, status);
            assert_eq!(
                (
                    v.state,
                    v.serving_version.as_deref(),
                    v.execution_provider.as_str()
                ),
                (state, serving, provider)
            );
            assert_eq!((v.model.as_str(), v.assigned_version.as_str()), ("m", "2"));
            assert_eq!(v.variant, variant);
        }
    }
}
