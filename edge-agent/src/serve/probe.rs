//! The checks a version passes before it may serve: its session's inputs
//! and outputs against the manifest's signature, and the health probe's
//! outputs (shape, finiteness, latency). Pure functions over what the
//! session reported and returned.

use std::time::Duration;

use edgeloop_models::manifest::{DimSpec, IoSignature, TensorSpec};
use edgeloop_models::runtime::IoInfo;
use edgeloop_models::tensor::Tensor;

fn show_dims(dims: &[Option<i64>]) -> String {
    let d: Vec<String> = dims
        .iter()
        .map(|d| d.map_or_else(|| "?".to_string(), |d| d.to_string()))
        .collect();
    format!("[{}]", d.join(", "))
}

fn spec_dims(spec: &TensorSpec) -> Vec<Option<i64>> {
    spec.shape
        .iter()
        .map(|d| match d {
            DimSpec::Fixed(n) => Some(*n),
            DimSpec::Symbolic(_) => None,
        })
        .collect()
}

/// The session must have exactly the manifest's inputs and outputs, with
/// the same dtypes, ranks, and fixed dimensions (symbolic in one where the
/// other is fixed counts as a difference: the manifest describes this file).
pub fn check_signature(
    signature: &IoSignature,
    inputs: &[IoInfo],
    outputs: &[IoInfo],
) -> Result<(), String> {
    compare("input", &signature.inputs, inputs)?;
    compare("output", &signature.outputs, outputs)
}

fn compare(kind: &str, specs: &[TensorSpec], actual: &[IoInfo]) -> Result<(), String> {
    for spec in specs {
        let Some(io) = actual.iter().find(|io| io.name == spec.name) else {
            return Err(format!(
                "the manifest's {kind} `{}` is not in the model",
                spec.name
            ));
        };
        let dtype = io.dtype.map_or("an unsupported type", |d| d.numpy_name());
        if dtype != spec.dtype {
            return Err(format!(
                "{kind} `{}`: the manifest says {}, the model has {dtype}",
                spec.name, spec.dtype
            ));
        }
        let want = spec_dims(spec);
        if want != io.shape {
            return Err(format!(
                "{kind} `{}`: the manifest says shape {}, the model has {}",
                spec.name,
                show_dims(&want),
                show_dims(&io.shape)
            ));
        }
    }
    if let Some(extra) = actual
        .iter()
        .find(|io| !specs.iter().any(|s| s.name == io.name))
    {
        return Err(format!(
            "the model's {kind} `{}` is not in the manifest",
            extra.name
        ));
    }
    Ok(())
}

/// What a probe output must look like: its name, its dimensions (`None`
/// where any size is fine), and whether its dynamic axis 0 is the batch.
pub type ExpectedOutput = (String, Vec<Option<i64>>, bool);

/// What each probe output must look like (in model order). Axis 0 of an
/// output is the batch when it is dynamic and, where the manifest names
/// dims, named like the first input's axis 0: silero-vad's `stateN` is
/// `[AddstateN_dim_0, batch, 128]`, its batch on axis 1 and 2 on axis 0.
pub fn expected_outputs(
    signature: Option<&IoSignature>,
    outputs: &[IoInfo],
) -> Vec<ExpectedOutput> {
    match signature {
        Some(sig) => {
            let batch_name = sig.inputs.first().and_then(|i| match i.shape.first() {
                Some(DimSpec::Symbolic(n)) if n != "?" => Some(n.as_str()),
                _ => None,
            });
            sig.outputs
                .iter()
                .map(|s| {
                    let batch_first = match (s.shape.first(), batch_name) {
                        (Some(DimSpec::Symbolic(n)), Some(b)) => n == b || n == "?",
                        _ => true,
                    };
                    (s.name.clone(), spec_dims(s), batch_first)
                })
                .collect()
        }
        None => outputs
            .iter()
            .map(|o| (o.name.clone(), o.shape.clone(), true))
            .collect(),
    }
}

/// Checks the probe's outputs: every expected output present with the
/// expected rank and fixed dimensions, a dynamic first dimension equal to
/// `batch` (the probe's batch, when the model's first input dimension is
/// dynamic), no NaN or infinity, and the run no slower than `max_latency`.
pub fn check_probe(
    expected: &[ExpectedOutput],
    outputs: &[(String, Tensor)],
    batch: Option<usize>,
    latency: Duration,
    max_latency: Duration,
) -> Result<(), String> {
    for (name, dims, batch_first) in expected {
        let Some((_, tensor)) = outputs.iter().find(|(n, _)| n == name) else {
            return Err(format!("output `{name}` is missing"));
        };
        let shape = tensor.shape();
        let fits = shape.len() == dims.len()
            && dims
                .iter()
                .zip(shape)
                .enumerate()
                .all(|(axis, (want, &got))| match want {
                    Some(n) => u64::try_from(*n).ok() == u64::try_from(got).ok(),
                    None if axis == 0 && *batch_first => batch.is_none_or(|b| b == got),
                    None => true,
                });
        if !fits {
            let batch = batch
                .filter(|_| *batch_first)
                .map_or_else(String::new, |b| format!(" with batch {b}"));
            return Err(format!(
                "output `{name}` has shape {shape:?}, expected {}{batch}",
                show_dims(dims)
            ));
        }
        if let Some(index) = first_non_finite(tensor) {
            return Err(format!(
                "output `{name}` is not finite (NaN or infinity at flat index {index})"
            ));
        }
    }
    if latency > max_latency {
        return Err(format!(
            "the probe took {latency:?}, over its limit of {max_latency:?}"
        ));
    }
    Ok(())
}

fn first_non_finite(tensor: &Tensor) -> Option<usize> {
    match tensor {
        Tensor::F32(a) => a.iter().position(|v| !v.is_finite()),
        Tensor::F64(a) => a.iter().position(|v| !v.is_finite()),
        Tensor::F16(a) => a.iter().position(|v| !v.is_finite()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use edgeloop_models::tensor::DType;
    use ndarray::ArrayD;

    fn io(name: &str, dims: &[Option<i64>]) -> IoInfo {
        IoInfo {
            name: name.into(),
            dtype: Some(DType::F32),
            shape: dims.to_vec(),
        }
    }

    fn spec(name: &str, dtype: &str, dims: Vec<DimSpec>) -> TensorSpec {
        TensorSpec {
            name: name.into(),
            dtype: dtype.into(),
            shape: dims,
        }
    }

    #[test]
    fn signature_table() {
        let n = || DimSpec::Symbolic("N".into());
        let model_in = [io("x", &[None, Some(4)])];
        let model_out = [io("y", &[None, Some(2)])];
        let sig = |inputs, outputs| IoSignature { inputs, outputs };
        let ok = sig(
            vec![spec("x", "float32", vec![n(), DimSpec::Fixed(4)])],
            vec![spec("y", "float32", vec![n(), DimSpec::Fixed(2)])],
        );
        assert_eq!(check_signature(&ok, &model_in, &model_out), Ok(()));
        let y = || vec![spec("y", "float32", vec![n(), DimSpec::Fixed(2)])];
        let cases = [
            (
                sig(
                    vec![spec("z", "float32", vec![n(), DimSpec::Fixed(4)])],
                    y(),
                ),
                "input `z` is not in the model",
            ),
            (
                sig(vec![spec("x", "int64", vec![n(), DimSpec::Fixed(4)])], y()),
                "says int64, the model has float32",
            ),
            (
                sig(
                    vec![spec("x", "float32", vec![n(), DimSpec::Fixed(5)])],
                    y(),
                ),
                "says shape [?, 5], the model has [?, 4]",
            ),
            (sig(vec![], y()), "input `x` is not in the manifest"),
        ];
        for (sig, want) in cases {
            let err = check_signature(&sig, &model_in, &model_out).unwrap_err();
            assert!(err.contains(want), "{err} lacks {want}");
        }
    }

    #[test]
    fn probe_table() {
        let expected = vec![("y".to_string(), vec![None, Some(2)], true)];
        let t = |shape: &[usize], v: f32| {
            vec![(
                "y".to_string(),
                Tensor::F32(ArrayD::from_elem(shape.to_vec(), v)),
            )]
        };
        let ms = Duration::from_millis;
        assert_eq!(
            check_probe(&expected, &t(&[3, 2], 0.5), Some(3), ms(1), ms(5)),
            Ok(())
        );
        let cases = [
            (t(&[3, 2], f32::NAN), Some(3), ms(1), "not finite"),
            (t(&[3, 2], f32::INFINITY), Some(3), ms(1), "not finite"),
            (t(&[3, 3], 0.5), Some(3), ms(1), "expected [?, 2]"),
            (t(&[2, 2], 0.5), Some(3), ms(1), "with batch 3"),
            (t(&[3, 2], 0.5), Some(3), ms(6), "over its limit"),
            (vec![], Some(3), ms(1), "`y` is missing"),
        ];
        for (outputs, batch, latency, want) in cases {
            let err = check_probe(&expected, &outputs, batch, latency, ms(5)).unwrap_err();
            assert!(err.contains(want), "{err} lacks {want}");
        }
        // An output whose axis 0 is not the batch takes any size there.
        let state = vec![("y".to_string(), vec![None, Some(2)], false)];
        assert_eq!(
            check_probe(&state, &t(&[2, 2], 0.5), Some(1), ms(1), ms(5)),
            Ok(())
        );
    }

    #[test]
    fn only_outputs_named_like_the_batch_take_the_batch_on_axis_0() {
        let sym = |n: &str| DimSpec::Symbolic(n.into());
        let sig = IoSignature {
            inputs: vec![spec(
                "input",
                "float32",
                vec![sym("batch"), sym("sequence")],
            )],
            outputs: vec![
                spec("output", "float32", vec![sym("batch"), DimSpec::Fixed(1)]),
                spec(
                    "stateN",
                    "float32",
                    vec![sym("AddstateN_dim_0"), sym("batch"), DimSpec::Fixed(128)],
                ),
                spec("legacy", "float32", vec![sym("?")]),
            ],
        };
        let flags: Vec<bool> = expected_outputs(Some(&sig), &[])
            .into_iter()
            .map(|e| e.2)
            .collect();
        assert_eq!(flags, vec![true, false, true]);
    }
}
