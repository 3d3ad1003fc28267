//! Label selectors, as Kubernetes writes them: a device group is a selector
//! (`site=berlin,gpu in (cuda,tensorrt),!retired`), used by
//! `GET /api/v1/devices?selector=...` and by deployments.
//!
//! Besides a device's labels, a selector sees what the device reports, under
//! reserved keys: `edgeloop.io/arch`, `edgeloop.io/os`,
//! `edgeloop.io/agent-version`, `edgeloop.io/provider` (one value per ONNX
//! Runtime execution provider, so `edgeloop.io/provider=CUDAExecutionProvider`
//! means "has CUDA"), and `edgeloop.io/gpu` (one per GPU model).

use std::collections::BTreeMap;

use crate::fleet::members::CapabilitiesRecord;
use edgeloop_errors::Error;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    Eq(String),
    Ne(String),
    In(Vec<String>),
    NotIn(Vec<String>),
    Exists,
    NotExists,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Requirement {
    pub key: String,
    pub op: Op,
}

/// Every requirement must hold; the empty selector matches everything.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Selector {
    pub requirements: Vec<Requirement>,
}

/// A device's facts: label values, and the reserved keys' values (several
/// for providers and GPUs).
pub type Facts = BTreeMap<String, Vec<String>>;

pub fn facts(labels: &BTreeMap<String, String>, caps: &CapabilitiesRecord) -> Facts {
    let mut f: Facts = labels
        .iter()
        .map(|(k, v)| (k.clone(), vec![v.clone()]))
        .collect();
    let mut put = |k: &str, v: &str| {
        if !v.is_empty() {
            f.entry(format!("edgeloop.io/{k}"))
                .or_default()
                .push(v.to_string());
        }
    };
    put("arch", &caps.arch);
    put("os", &caps.os);
    put("agent-version", &caps.agent_version);
    for p in &caps.execution_providers {
        put("provider", p);
    }
    for g in &caps.gpus {
        put("gpu", &gpu_label(&g.model));
    }
    f
}

/// A GPU's name as a selector value: a selector word has no spaces, so
/// `NVIDIA H200` is matched as `edgeloop.io/gpu=NVIDIA-H200` (the form of
/// GPU Feature Discovery's `nvidia.com/gpu.product` label). Anything but
/// letters, digits, `-`, `_` and `.` becomes `-`, runs of them one `-`.
pub fn gpu_label(model: &str) -> String {
    let mut out = String::new();
    for c in model.trim().chars() {
        let c = if c.is_ascii_alphanumeric() || matches!(c, '_' | '.') {
            c
        } else {
            '-'
        };
        if !(c == '-' && out.ends_with('-')) {
            out.push(c);
        }
    }
    out.trim_matches('-').chars().take(253).collect()
}

const MAX_LEN: usize = 4096;

fn valid_word(w: &str) -> bool {
    !w.is_empty()
        && w.len() <= 253
        && w.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'/'))
}

fn bad(reason: impl Into<String>) -> Error {
    Error::bad_field("selector", reason)
}

/// Splits on commas outside parentheses.
fn split_requirements(s: &str) -> Result<Vec<&str>, Error> {
    let (mut depth, mut start, mut out) = (0i32, 0usize, vec![]);
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => {
                depth -= 1;
                if depth < 0 {
                    return Err(bad(format!("unbalanced ')' at byte {i}")));
                }
            }
            ',' if depth == 0 => {
                out.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    if depth != 0 {
        return Err(bad("unbalanced '('"));
    }
    out.push(&s[start..]);
    Ok(out)
}

fn set(values: &str, req: &str) -> Result<Vec<String>, Error> {
    let inner = values
        .trim()
        .strip_prefix('(')
        .and_then(|v| v.strip_suffix(')'))
        .ok_or_else(|| bad(format!("{req:?}: expected a set like (a,b)")))?;
    let vals: Vec<String> = inner.split(',').map(|v| v.trim().to_string()).collect();
    if let Some(v) = vals.iter().find(|v| !valid_word(v)) {
        return Err(bad(format!("{req:?}: {v:?} is not a valid value")));
    }
    Ok(vals)
}

impl std::str::FromStr for Selector {
    type Err = Error;

    fn from_str(s: &str) -> Result<Selector, Error> {
        if s.len() > MAX_LEN {
            return Err(bad(format!("longer than {MAX_LEN} bytes")));
        }
        if s.trim().is_empty() {
            return Ok(Selector::default());
        }
        let mut requirements = vec![];
        for raw in split_requirements(s)? {
            let req = raw.trim();
            let key_of = |k: &str| -> Result<String, Error> {
                let k = k.trim();
                if valid_word(k) {
                    Ok(k.to_string())
                } else {
                    Err(bad(format!("{req:?}: {k:?} is not a valid key")))
                }
            };
            let value_of = |v: &str| -> Result<String, Error> {
                let v = v.trim();
                if valid_word(v) {
                    Ok(v.to_string())
                } else {
                    Err(bad(format!("{req:?}: {v:?} is not a valid value")))
                }
            };
            let r = if let Some(k) = req.strip_prefix('!') {
                Requirement {
                    key: key_of(k)?,
                    op: Op::NotExists,
                }
            } else if let Some((k, v)) = req.split_once("!=") {
                Requirement {
                    key: key_of(k)?,
                    op: Op::Ne(value_of(v)?),
                }
            } else if let Some((k, v)) = req.split_once("==").or_else(|| req.split_once('=')) {
                Requirement {
                    key: key_of(k)?,
                    op: Op::Eq(value_of(v)?),
                }
            } else if let Some((k, v)) = req.split_once(" notin ") {
                Requirement {
                    key: key_of(k)?,
                    op: Op::NotIn(set(v, req)?),
                }
            } else if let Some((k, v)) = req.split_once(" in ") {
                Requirement {
                    key: key_of(k)?,
                    op: Op::In(set(v, req)?),
                }
            } else {
                Requirement {
                    key: key_of(req)?,
                    op: Op::Exists,
                }
            };
            requirements.push(r);
        }
        Ok(Selector { requirements })
    }
}

impl Selector {
    pub fn matches(&self, facts: &Facts) -> bool {
        self.requirements.iter().all(|r| {
            let values = facts.get(&r.key);
            let any =
                |want: &dyn Fn(&str) -> bool| values.is_some_and(|vs| vs.iter().any(|v| want(v)));
            match &r.op {
                Op::Eq(v) => any(&|x| x == v),
                Op::Ne(v) => !any(&|x| x == v),
                Op::In(set) => any(&|x| set.iter().any(|s| s == x)),
                Op::NotIn(set) => !any(&|x| set.iter().any(|s| s == x)),
                Op::Exists => values.is_some(),
                Op::NotExists => values.is_none(),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::fleet::members::GpuRecord;

    fn device() -> Facts {
        let labels = BTreeMap::from([
            ("site".to_string(), "berlin".to_string()),
            ("tier".to_string(), "canary".to_string()),
        ]);
        let caps = CapabilitiesRecord {
            arch: "aarch64".into(),
            execution_providers: vec![
                "CUDAExecutionProvider".into(),
                "CPUExecutionProvider".into(),
            ],
            gpus: vec![
                GpuRecord {
                    model: "Orin".into(),
                    ..Default::default()
                },
                GpuRecord {
                    model: "NVIDIA Jetson AGX Orin (64GB)".into(),
                    ..Default::default()
                },
            ],
            ..Default::default()
        };
        facts(&labels, &caps)
    }

    #[test]
    fn gpu_names_become_selector_words() {
        for (model, label) in [
            ("NVIDIA H200", "NVIDIA-H200"),
            ("NVIDIA A100-SXM4-80GB", "NVIDIA-A100-SXM4-80GB"),
            (
                "  NVIDIA Jetson AGX Orin (64GB) ",
                "NVIDIA-Jetson-AGX-Orin-64GB",
            ),
            ("Orin", "Orin"),
            ("()", ""),
        ] {
            assert_eq!(gpu_label(model), label, "{model}");
        }
    }

    #[test]
    fn selectors_match_labels_and_reported_capabilities() {
        let table = [
            ("", true),
            ("site=berlin", true),
            ("site==berlin", true),
            ("site=paris", false),
            ("site!=paris", true),
            ("missing!=x", true),
            ("site in (paris, berlin)", true),
            ("site notin (paris,berlin)", false),
            ("missing notin (a)", true),
            ("tier", true),
            ("!tier", false),
            ("!retired", true),
            ("site=berlin,tier=canary", true),
            ("site=berlin,tier=stable", false),
            ("edgeloop.io/provider=CUDAExecutionProvider", true),
            ("edgeloop.io/provider=TensorrtExecutionProvider", false),
            (
                "edgeloop.io/arch in (x86_64,aarch64),edgeloop.io/gpu=Orin",
                true,
            ),
            ("edgeloop.io/os", false),
            ("edgeloop.io/gpu=NVIDIA-Jetson-AGX-Orin-64GB", true),
            ("edgeloop.io/gpu=NVIDIA-H200", false),
        ];
        for (s, want) in table {
            let sel: Selector = s.parse().unwrap_or_else(|e| panic!("{s}: {e}"));
            assert_eq!(sel.matches(&device()), want, "{s}");
        }
    }

    #[test]
    fn bad_selectors_name_the_field() {
        for s in [
            "site=",
            "=berlin",
            "site in berlin",
            "site in (a,,b)",
            "site in (a",
            "a)",
            "si te=x",
            "site=ber lin",
            ",",
            "!",
        ] {
            match s.parse::<Selector>() {
                Err(Error::BadRequest { field: Some(f), .. }) => assert_eq!(f, "selector", "{s}"),
                other => panic!("{s}: {other:?}"),
            }
        }
        assert!("x".repeat(MAX_LEN + 1).parse::<Selector>().is_err());
    }

    proptest::proptest! {
        #[test]
        fn any_text_parses_or_is_a_400(s in ".{0,200}") {
            match s.parse::<Selector>() {
                Ok(sel) => { let _ = sel.matches(&device()); }
                Err(Error::BadRequest { .. }) => {}
                Err(e) => panic!("{e:?}"),
            }
        }
    }
}
