//! The retraining pipeline as one state machine (issue #7): a pure
//! `advance(pipeline, event, now) -> (pipeline, actions)`. Every step's
//! start, end, outcome and outputs are in the pipeline's history, so a
//! persisted pipeline resumes after a control-plane restart by re-issuing
//! the action of its current step (each step's executor is idempotent per
//! `(pipeline, step, attempt)`). The executors come with the pipeline task.

use edgeloop_api::aliases::AliasName;
pub use edgeloop_api::pipelines::QuantizedVariant;
use edgeloop_models::Digest;
use serde::{Deserialize, Serialize};

/// The steps and how a step's run ended are part of the console API
/// (pipelines show them).
pub use edgeloop_api::pipelines::{Signing, Step, StepOutcome};
pub use edgeloop_api::UnixSeconds;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum PipelineState {
    Running {
        step: Step,
        attempt: u32,
        started_at: UnixSeconds,
    },
    Succeeded,
    /// Ended on purpose, e.g. the new version did not beat the serving one.
    Stopped {
        step: Step,
        reason: String,
    },
    Failed {
        step: Step,
        reason: String,
    },
    Cancelled {
        step: Step,
    },
    /// Offline signing: the quantize step's manifests wait for a signature
    /// from a key kept elsewhere. Nothing runs and no timeout applies; a
    /// signature or a cancel moves it on.
    AwaitingSignature {
        since: UnixSeconds,
    },
}

impl PipelineState {
    pub fn is_terminal(&self) -> bool {
        !matches!(
            self,
            PipelineState::Running { .. } | PipelineState::AwaitingSignature { .. }
        )
    }
}

/// What a finished step handed on.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "output", rename_all = "snake_case")]
pub enum Output {
    /// The snapshot; `rows` train, `eval_rows` (the newest labelled edge
    /// samples) evaluate; `edge_rows` of all came from devices.
    Dataset {
        digest: Digest,
        rows: u64,
        #[serde(default)]
        eval_rows: u64,
        #[serde(default)]
        edge_rows: u64,
        /// Labelled hard examples among the edge rows.
        #[serde(default)]
        hard_examples: u64,
    },
    Job {
        id: String,
        checkpoint: Digest,
    },
    Onnx {
        digest: Digest,
    },
    /// Offline signing: the gate's choice and its manifest (JSON of the
    /// manifest itself), not signed yet; variants' manifests likewise.
    Unsigned {
        digest: Digest,
        method: String,
        manifest: Digest,
        version: String,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        variants: Vec<QuantizedVariant>,
    },
    /// The gate's choice, its signed manifest, and the version it names.
    Quantized {
        digest: Digest,
        method: String,
        manifest: Digest,
        version: String,
        /// The policy's variants, each through its own gate.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        variants: Vec<QuantizedVariant>,
    },
    Version {
        version: String,
    },
    /// Accuracy on the recent labelled eval set, new and serving, and the
    /// version compared against (by the alias that named it, if one did).
    Comparison {
        new: f64,
        serving: f64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        serving_version: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        serving_alias: Option<AliasName>,
    },
    Deployment {
        id: String,
    },
    Reference,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StepRecord {
    pub step: Step,
    pub attempt: u32,
    pub started_at: UnixSeconds,
    pub ended_at: Option<UnixSeconds>,
    /// `succeeded`, `cancelled`, or why it did not succeed (stored as
    /// that one string).
    pub outcome: Option<StepOutcome>,
    pub output: Option<Output>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Pipeline {
    pub id: String,
    pub model: String,
    /// The trigger and reasons that started it.
    pub trigger: String,
    pub state: PipelineState,
    pub history: Vec<StepRecord>,
    pub max_attempts: u32,
    pub step_timeout_seconds: i64,
    /// Accuracy points the new version must gain over the serving one.
    pub min_gain_points: f64,
    /// Triggers that fired while it ran, folded into it (never a second
    /// retrain of the same model at once).
    #[serde(default)]
    pub coalesced: Vec<Coalesced>,
    /// Who signs, fixed when it started (the policy may change meanwhile).
    #[serde(default, skip_serializing_if = "Signing::is_control_plane")]
    pub signing: Signing,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Coalesced {
    pub trigger: String,
    pub at: UnixSeconds,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Event {
    Succeeded(Output),
    Failed {
        reason: String,
        retryable: bool,
    },
    Cancel,
    /// Time passes: a step past its timeout fails (retryably).
    Tick,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Action {
    /// Run this step; idempotent per `(pipeline, step, attempt)`.
    Run { step: Step, attempt: u32 },
    /// Stop whatever the step started (a job, a deployment).
    Abort { step: Step },
}

impl Pipeline {
    pub fn new(
        id: String,
        model: String,
        trigger: String,
        now: UnixSeconds,
    ) -> (Pipeline, Vec<Action>) {
        let first = Step::BuildDataset;
        (
            Pipeline {
                id,
                model,
                trigger,
                state: PipelineState::Running {
                    step: first,
                    attempt: 1,
                    started_at: now,
                },
                history: vec![StepRecord {
                    step: first,
                    attempt: 1,
                    started_at: now,
                    ended_at: None,
                    outcome: None,
                    output: None,
                }],
                max_attempts: 3,
                step_timeout_seconds: 6 * 3600,
                min_gain_points: 0.0,
                coalesced: vec![],
                signing: Signing::ControlPlane,
            },
            vec![Action::Run {
                step: first,
                attempt: 1,
            }],
        )
    }

    /// The action to re-issue after a restart: the current step's run.
    pub fn resume(&self) -> Vec<Action> {
        match self.state {
            PipelineState::Running { step, attempt, .. } => vec![Action::Run { step, attempt }],
            _ => vec![],
        }
    }

    /// The signed models to register: the sign step's output, or the
    /// quantize step's when the control plane signed.
    pub fn signed_models(&self) -> Option<&Output> {
        [Step::Sign, Step::Quantize]
            .into_iter()
            .filter_map(|s| self.output_of(s))
            .find(|o| matches!(o, Output::Quantized { .. }))
    }

    /// The output of the last successful run of `step`.
    pub fn output_of(&self, step: Step) -> Option<&Output> {
        self.history
            .iter()
            .rev()
            .find(|r| r.step == step && r.output.is_some())
            .and_then(|r| r.output.as_ref())
    }
}

fn close(p: &mut Pipeline, now: UnixSeconds, outcome: StepOutcome, output: Option<Output>) {
    if let Some(last) = p.history.last_mut() {
        if last.ended_at.is_none() {
            last.ended_at = Some(now);
            last.outcome = Some(outcome);
            last.output = output;
        }
    }
}

fn start(p: &mut Pipeline, step: Step, attempt: u32, now: UnixSeconds) -> Vec<Action> {
    p.state = PipelineState::Running {
        step,
        attempt,
        started_at: now,
    };
    p.history.push(StepRecord {
        step,
        attempt,
        started_at: now,
        ended_at: None,
        outcome: None,
        output: None,
    });
    vec![Action::Run { step, attempt }]
}

/// Waiting for a signature: the signed models move it on to register, a
/// cancel ends it; time passing and anything else change nothing.
fn awaiting_signature(mut p: Pipeline, event: Event, now: UnixSeconds) -> (Pipeline, Vec<Action>) {
    match event {
        Event::Cancel => {
            close(&mut p, now, StepOutcome::Cancelled, None);
            p.state = PipelineState::Cancelled { step: Step::Sign };
            (p, vec![])
        }
        Event::Succeeded(output @ Output::Quantized { .. }) => {
            close(&mut p, now, StepOutcome::Succeeded, Some(output));
            let actions = start(&mut p, Step::Register, 1, now);
            (p, actions)
        }
        _ => (p, vec![]),
    }
}

/// One event. Pure; a terminal pipeline ignores everything.
pub fn advance(p: &Pipeline, event: Event, now: UnixSeconds) -> (Pipeline, Vec<Action>) {
    let mut p = p.clone();
    if let PipelineState::AwaitingSignature { .. } = p.state {
        return awaiting_signature(p, event, now);
    }
    let PipelineState::Running {
        step,
        attempt,
        started_at,
    } = p.state
    else {
        return (p, vec![]);
    };
    let failure = match event {
        Event::Cancel => {
            close(&mut p, now, StepOutcome::Cancelled, None);
            p.state = PipelineState::Cancelled { step };
            return (p, vec![Action::Abort { step }]);
        }
        Event::Tick if now - started_at >= p.step_timeout_seconds => {
            Some((format!("timed out after {}s", now - started_at), true))
        }
        Event::Tick => None,
        Event::Failed { reason, retryable } => Some((reason, retryable)),
        Event::Succeeded(output) => {
            if let (Step::Compare, Output::Comparison { new, serving, .. }) = (step, &output) {
                let gain = (new - serving) * 100.0;
                if gain <= p.min_gain_points {
                    let reason = format!(
                        "the new version ({:.2} %) does not beat the serving one ({:.2} %) by more than {} points on recent data",
                        new * 100.0,
                        serving * 100.0,
                        p.min_gain_points
                    );
                    close(
                        &mut p,
                        now,
                        StepOutcome::Ended(reason.clone()),
                        Some(output),
                    );
                    p.state = PipelineState::Stopped { step, reason };
                    return (p, vec![]);
                }
            }
            // Unsigned manifests wait for a person; signed ones skip the
            // sign step.
            let next = match (step, &output) {
                (Step::Quantize, Output::Unsigned { .. }) => {
                    close(&mut p, now, StepOutcome::Succeeded, Some(output));
                    p.state = PipelineState::AwaitingSignature { since: now };
                    p.history.push(StepRecord {
                        step: Step::Sign,
                        attempt: 1,
                        started_at: now,
                        ended_at: None,
                        outcome: None,
                        output: None,
                    });
                    return (p, vec![]);
                }
                (Step::Quantize, _) => Some(Step::Register),
                _ => step.next(),
            };
            close(&mut p, now, StepOutcome::Succeeded, Some(output));
            return match next {
                Some(next) => {
                    let actions = start(&mut p, next, 1, now);
                    (p, actions)
                }
                None => {
                    p.state = PipelineState::Succeeded;
                    (p, vec![])
                }
            };
        }
    };
    let Some((reason, retryable)) = failure else {
        return (p, vec![]);
    };
    close(&mut p, now, StepOutcome::Ended(reason.clone()), None);
    if retryable && attempt < p.max_attempts {
        let mut actions = vec![Action::Abort { step }];
        actions.extend(start(&mut p, step, attempt + 1, now));
        return (p, actions);
    }
    let reason = if retryable {
        format!("{reason} (attempt {attempt} of {})", p.max_attempts)
    } else {
        reason
    };
    p.state = PipelineState::Failed { step, reason };
    (p, vec![Action::Abort { step }])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(c: char) -> Digest {
        c.to_string().repeat(64).parse().unwrap()
    }

    fn ok(step: Step) -> Output {
        match step {
            Step::BuildDataset => Output::Dataset {
                digest: d('d'),
                rows: 100,
                eval_rows: 30,
                edge_rows: 50,
                hard_examples: 5,
            },
            Step::Train => Output::Job {
                id: "j".into(),
                checkpoint: d('c'),
            },
            Step::Export => Output::Onnx { digest: d('0') },
            Step::Quantize | Step::Sign => Output::Quantized {
                digest: d('a'),
                method: "int8-static".into(),
                manifest: d('b'),
                version: "2".into(),
                variants: Vec::new(),
            },
            Step::Register => Output::Version {
                version: "2".into(),
            },
            Step::Compare => Output::Comparison {
                new: 0.93,
                serving: 0.90,
                serving_version: Some("1".into()),
                serving_alias: None,
            },
            Step::Deploy => Output::Deployment { id: "d-1".into() },
            Step::ResetReference => Output::Reference,
        }
    }

    /// The steps a pipeline signed by the control plane runs: all but the
    /// sign step.
    fn signed_here() -> Vec<Step> {
        Step::ALL.into_iter().filter(|s| *s != Step::Sign).collect()
    }

    fn current(p: &Pipeline) -> Option<(Step, u32)> {
        match p.state {
            PipelineState::Running { step, attempt, .. } => Some((step, attempt)),
            _ => None,
        }
    }

    #[test]
    fn the_happy_path_runs_every_step_once_and_records_it() {
        let (mut p, actions) = Pipeline::new("p".into(), "m".into(), "drift".into(), 0);
        assert_eq!(
            actions,
            vec![Action::Run {
                step: Step::BuildDataset,
                attempt: 1
            }]
        );
        let steps = signed_here();
        for (i, step) in steps.iter().copied().enumerate() {
            assert_eq!(current(&p), Some((step, 1)));
            let (next, actions) = advance(&p, Event::Succeeded(ok(step)), 10 * (i as i64 + 1));
            p = next;
            match steps.get(i + 1).copied() {
                Some(n) => assert_eq!(
                    actions,
                    vec![Action::Run {
                        step: n,
                        attempt: 1
                    }]
                ),
                None => assert!(actions.is_empty()),
            }
        }
        assert_eq!(p.state, PipelineState::Succeeded);
        assert_eq!(p.history.len(), 8);
        assert!(p
            .history
            .iter()
            .all(|r| r.outcome == Some(StepOutcome::Succeeded) && r.ended_at.is_some()));
        assert_eq!(
            p.output_of(Step::Register),
            Some(&Output::Version {
                version: "2".into()
            })
        );
        // Terminal: nothing moves it any more.
        assert_eq!(advance(&p, Event::Cancel, 999), (p.clone(), vec![]));
    }

    #[test]
    fn failures_retry_then_fail_timeouts_count_and_cancel_aborts() {
        let (p, _) = Pipeline::new("p".into(), "m".into(), "manual".into(), 0);
        let (p, _) = advance(&p, Event::Succeeded(ok(Step::BuildDataset)), 1);
        // A retryable failure runs the step again, up to max_attempts.
        let fail = || Event::Failed {
            reason: "node lost".into(),
            retryable: true,
        };
        let (p, a) = advance(&p, fail(), 2);
        assert_eq!(current(&p), Some((Step::Train, 2)));
        assert_eq!(
            a,
            vec![
                Action::Abort { step: Step::Train },
                Action::Run {
                    step: Step::Train,
                    attempt: 2
                }
            ]
        );
        // A timeout is a retryable failure; a tick before it is nothing.
        let (same, a) = advance(&p, Event::Tick, 2 + p.step_timeout_seconds - 1);
        assert_eq!((same.clone(), a), (p.clone(), vec![]));
        let (p, _) = advance(&p, Event::Tick, 2 + p.step_timeout_seconds);
        assert_eq!(current(&p), Some((Step::Train, 3)));
        let (p, a) = advance(&p, fail(), 3 + p.step_timeout_seconds);
        assert_eq!(a, vec![Action::Abort { step: Step::Train }]);
        assert_eq!(
            p.state,
            PipelineState::Failed {
                step: Step::Train,
                reason: "node lost (attempt 3 of 3)".into()
            }
        );
        assert_eq!(p.history.len(), 4, "every attempt is in the history");
        assert!(p.history[2]
            .outcome
            .as_ref()
            .unwrap()
            .as_str()
            .starts_with("timed out"));

        // A failure that a retry would only repeat ends at once.
        let (q, _) = Pipeline::new("q".into(), "m".into(), "manual".into(), 0);
        let (q, _) = advance(
            &q,
            Event::Failed {
                reason: "no labelled data".into(),
                retryable: false,
            },
            1,
        );
        assert_eq!(
            q.state,
            PipelineState::Failed {
                step: Step::BuildDataset,
                reason: "no labelled data".into()
            }
        );

        // Cancel aborts the running step.
        let (r, _) = Pipeline::new("r".into(), "m".into(), "manual".into(), 0);
        let (r, a) = advance(&r, Event::Cancel, 5);
        assert_eq!(
            r.state,
            PipelineState::Cancelled {
                step: Step::BuildDataset
            }
        );
        assert_eq!(
            a,
            vec![Action::Abort {
                step: Step::BuildDataset
            }]
        );
    }

    #[test]
    fn a_version_that_does_not_beat_the_serving_one_stops_before_deploy() {
        let (mut p, _) = Pipeline::new("p".into(), "m".into(), "drift".into(), 0);
        p.min_gain_points = 0.5;
        for step in &signed_here()[..5] {
            p = advance(&p, Event::Succeeded(ok(*step)), 1).0;
        }
        let (stopped, actions) = advance(
            &p,
            Event::Succeeded(Output::Comparison {
                new: 0.912,
                serving: 0.910,
                serving_version: Some("1".into()),
                serving_alias: None,
            }),
            2,
        );
        assert!(actions.is_empty(), "no deploy");
        match &stopped.state {
            PipelineState::Stopped { step, reason } => {
                assert_eq!(*step, Step::Compare);
                assert!(
                    reason.contains("91.20 %") && reason.contains("91.00 %"),
                    "{reason}"
                );
            }
            other => panic!("{other:?}"),
        }
        // A real gain goes on to deploy.
        let (on, actions) = advance(
            &p,
            Event::Succeeded(Output::Comparison {
                new: 0.93,
                serving: 0.91,
                serving_version: None,
                serving_alias: None,
            }),
            2,
        );
        assert_eq!(current(&on), Some((Step::Deploy, 1)));
        assert_eq!(
            actions,
            vec![Action::Run {
                step: Step::Deploy,
                attempt: 1
            }]
        );
    }

    #[test]
    fn a_persisted_pipeline_resumes_its_current_step() {
        let (p, _) = Pipeline::new("p".into(), "m".into(), "drift".into(), 0);
        let (p, _) = advance(&p, Event::Succeeded(ok(Step::BuildDataset)), 1);
        let stored = serde_json::to_string(&p).unwrap();
        let back: Pipeline = serde_json::from_str(&stored).unwrap();
        assert_eq!(back, p);
        assert_eq!(
            back.resume(),
            vec![Action::Run {
                step: Step::Train,
                attempt: 1
            }]
        );
        let (done, _) = advance(&back, Event::Cancel, 2);
        assert!(done.resume().is_empty());
    }

    fn unsigned() -> Output {
        Output::Unsigned {
            digest: d('a'),
            method: "int8-static".into(),
            manifest: d('e'),
            version: "2".into(),
            variants: Vec::new(),
        }
    }

    /// A pipeline at its quantize step, for the offline-signing tables.
    fn at_quantize() -> Pipeline {
        let (mut p, _) = Pipeline::new("p".into(), "m".into(), "drift".into(), 0);
        for step in [Step::BuildDataset, Step::Train, Step::Export] {
            p = advance(&p, Event::Succeeded(ok(step)), 1).0;
        }
        assert_eq!(current(&p), Some((Step::Quantize, 1)));
        p
    }

    #[test]
    fn unsigned_manifests_wait_for_a_signature_without_a_timeout() {
        let (waiting, actions) = advance(&at_quantize(), Event::Succeeded(unsigned()), 100);
        assert!(actions.is_empty(), "nothing runs while a person signs");
        assert_eq!(
            waiting.state,
            PipelineState::AwaitingSignature { since: 100 }
        );
        assert!(!waiting.state.is_terminal());
        assert!(waiting.resume().is_empty(), "a restart re-runs nothing");
        let quantize = &waiting.history[waiting.history.len() - 2];
        assert_eq!(
            (quantize.step, quantize.outcome.clone()),
            (Step::Quantize, Some(StepOutcome::Succeeded))
        );
        let sign = waiting.history.last().unwrap();
        assert_eq!((sign.step, sign.ended_at), (Step::Sign, None));
        // Nothing to register yet: only signed models are.
        assert_eq!(waiting.signed_models(), None);

        // Time, failures and outputs of the wrong kind change nothing.
        let ignored = [
            Event::Tick,
            Event::Failed {
                reason: "x".into(),
                retryable: false,
            },
            Event::Succeeded(unsigned()),
            Event::Succeeded(ok(Step::Register)),
        ];
        for event in ignored {
            let later = 100 + 10 * waiting.step_timeout_seconds;
            assert_eq!(
                advance(&waiting, event.clone(), later),
                (waiting.clone(), vec![]),
                "{event:?}"
            );
        }

        // The signed models go on to register, and are what it reads.
        let (signed, actions) = advance(&waiting, Event::Succeeded(ok(Step::Sign)), 200);
        assert_eq!(current(&signed), Some((Step::Register, 1)));
        assert_eq!(
            actions,
            vec![Action::Run {
                step: Step::Register,
                attempt: 1
            }]
        );
        let sign = &signed.history[signed.history.len() - 2];
        assert_eq!(
            (sign.step, sign.ended_at, sign.outcome.clone()),
            (Step::Sign, Some(200), Some(StepOutcome::Succeeded))
        );
        assert_eq!(signed.signed_models(), Some(&ok(Step::Sign)));

        // A cancel while waiting ends it at the sign step.
        let (cancelled, actions) = advance(&waiting, Event::Cancel, 300);
        assert!(actions.is_empty());
        assert_eq!(
            cancelled.state,
            PipelineState::Cancelled { step: Step::Sign }
        );
        assert_eq!(
            cancelled.history.last().unwrap().outcome,
            Some(StepOutcome::Cancelled)
        );

        // Persisted and read back, it still waits.
        let back: Pipeline =
            serde_json::from_str(&serde_json::to_string(&waiting).unwrap()).unwrap();
        assert_eq!(back, waiting);
    }

    #[test]
    fn a_pipeline_the_control_plane_signs_skips_the_sign_step() {
        let (p, actions) = advance(&at_quantize(), Event::Succeeded(ok(Step::Quantize)), 5);
        assert_eq!(current(&p), Some((Step::Register, 1)));
        assert_eq!(
            actions,
            vec![Action::Run {
                step: Step::Register,
                attempt: 1
            }]
        );
        assert!(p.history.iter().all(|r| r.step != Step::Sign));
        assert_eq!(p.signed_models(), Some(&ok(Step::Quantize)));
        // A record from before signing modes reads as the control plane's.
        let mut old = serde_json::to_value(&p).unwrap();
        old.as_object_mut().unwrap().remove("signing");
        let back: Pipeline = serde_json::from_value(old).unwrap();
        assert_eq!(back.signing, Signing::ControlPlane);
    }
}
