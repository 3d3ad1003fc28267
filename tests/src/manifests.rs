//! Manifests for tests: unsigned `Manifest` values that callers sign with
//! a throwaway key, after changing the fields their test is about.

use edgeloop_models::manifest::{
    ArtifactRef, DimSpec, HealthProbe, IoSignature, Lineage, Manifest, TensorSpec, SCHEMA_VERSION,
};
use edgeloop_models::Digest;

/// A float32 tensor of shape `[batch, n]`.
pub fn batch_spec(name: &str, n: i64) -> TensorSpec {
    TensorSpec {
        name: name.into(),
        dtype: "float32".into(),
        shape: vec![DimSpec::Symbolic("batch".into()), DimSpec::Fixed(n)],
    }
}

/// A manifest for `model` with one input and one output, `[batch, n]`
/// each, and no probe, quantization or reference statistics.
pub fn manifest(
    name: &str,
    version: &str,
    model: &[u8],
    input: (&str, i64),
    output: (&str, i64),
) -> Manifest {
    Manifest {
        schema: SCHEMA_VERSION,
        name: name.into(),
        version: version.into(),
        artifact: ArtifactRef {
            sha256: Digest::of(model),
            size: model.len() as u64,
            format: "onnx".into(),
        },
        signature: IoSignature {
            inputs: vec![batch_spec(input.0, input.1)],
            outputs: vec![batch_spec(output.0, output.1)],
        },
        quantization: None,
        reference_stats: None,
        lineage: Lineage::default(),
        health_probe: None,
        created_at: "2026-11-30T00:00:00Z".into(),
        min_version: None,
        rollback: false,
    }
}

/// The MNIST MLP (`input` × 784 → `logits` × 10) with a health probe on
/// the sample inputs `probe`.
pub fn mnist_manifest(
    name: &str,
    version: &str,
    model: &[u8],
    probe: Digest,
    max_latency_ms: f64,
) -> Manifest {
    Manifest {
        health_probe: Some(HealthProbe {
            sample_inputs: probe,
            max_latency_ms,
        }),
        ..manifest(name, version, model, ("input", 784), ("logits", 10))
    }
}
