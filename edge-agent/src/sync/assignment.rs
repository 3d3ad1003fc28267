//! Assignments as the agent uses them: parsed from the wire once, with
//! digests and the model name checked (the name becomes a directory name).

use edgeloop_models::names::{is_valid_name, NAME_RULE};
use edgeloop_models::Digest;
use edgeloop_proto::agent::v1 as pb;
use serde::{Deserialize, Serialize};

use super::failure::Failure;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Assignment {
    pub model: String,
    pub version: String,
    pub artifact: Digest,
    pub artifact_size: u64,
    pub manifest: Option<Digest>,
    pub probe_inputs: Option<Digest>,
    pub deployment_id: String,
    /// 0: the agent's default.
    pub timeout_seconds: u32,
}

/// What makes two assignments install the same thing: the deployment id
/// and timeout do not change the files.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Content {
    pub version: String,
    pub artifact: Digest,
    pub artifact_size: u64,
    pub manifest: Option<Digest>,
    pub probe_inputs: Option<Digest>,
}

impl Assignment {
    /// Parses one wire assignment. An `Err` with `Some(model)` is reportable
    /// as a failure of that model; `None` means not even the name is usable.
    pub fn from_proto(a: &pb::Assignment) -> Result<Assignment, (Option<String>, Failure)> {
        if !is_valid_name(&a.model_name) {
            return Err((
                None,
                Failure::InvalidAssignment(format!("model name {:?}: {NAME_RULE}", a.model_name)),
            ));
        }
        let model = Some(a.model_name.clone());
        let digest = |field: &str, v: &str| -> Result<Digest, (Option<String>, Failure)> {
            v.parse().map_err(|e| {
                (
                    model.clone(),
                    Failure::InvalidAssignment(format!("{field}: {e}")),
                )
            })
        };
        let optional = |field: &str, v: &str| {
            if v.is_empty() {
                Ok(None)
            } else {
                digest(field, v).map(Some)
            }
        };
        if a.model_version.is_empty() || a.model_version.len() > 64 {
            return Err((
                model.clone(),
                Failure::InvalidAssignment("model_version must be 1-64 characters".into()),
            ));
        }
        Ok(Assignment {
            model: a.model_name.clone(),
            version: a.model_version.clone(),
            artifact: digest("artifact_digest", &a.artifact_digest)?,
            artifact_size: a.artifact_size,
            manifest: optional("manifest_digest", &a.manifest_digest)?,
            probe_inputs: optional("probe_inputs_digest", &a.probe_inputs_digest)?,
            deployment_id: a.deployment_id.clone(),
            timeout_seconds: a.activation_timeout_seconds,
        })
    }

    pub fn content(&self) -> Content {
        Content {
            version: self.version.clone(),
            artifact: self.artifact,
            artifact_size: self.artifact_size,
            manifest: self.manifest,
            probe_inputs: self.probe_inputs,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wire() -> pb::Assignment {
        pb::Assignment {
            model_name: "digits".into(),
            model_version: "3".into(),
            artifact_digest: Digest::of(b"m").to_string(),
            artifact_size: 1,
            manifest_digest: String::new(),
            deployment_id: "d".into(),
            activation_timeout_seconds: 5,
            probe_inputs_digest: String::new(),
        }
    }

    #[test]
    fn parses_and_refuses_with_the_field() {
        let a = Assignment::from_proto(&wire()).unwrap();
        assert_eq!((a.manifest, a.probe_inputs), (None, None));
        let cases: Vec<(pb::Assignment, Option<&str>, &str)> = vec![
            (
                pb::Assignment {
                    model_name: "../etc".into(),
                    ..wire()
                },
                None,
                "model name",
            ),
            (
                pb::Assignment {
                    artifact_digest: "x".into(),
                    ..wire()
                },
                Some("digits"),
                "artifact_digest",
            ),
            (
                pb::Assignment {
                    manifest_digest: "nope".into(),
                    ..wire()
                },
                Some("digits"),
                "manifest_digest",
            ),
            (
                pb::Assignment {
                    model_version: String::new(),
                    ..wire()
                },
                Some("digits"),
                "model_version",
            ),
        ];
        for (a, model, field) in cases {
            let (m, f) = Assignment::from_proto(&a).unwrap_err();
            assert_eq!(m.as_deref(), model, "{field}");
            assert!(f.to_string().contains(field), "{field}: {f}");
        }
    }
}
