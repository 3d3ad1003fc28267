//! `edgeloop model list | show <name> | versions <name>`: the model
//! registry through the console API (the local `model` subcommands are in
//! `model.rs`).

use std::io::Write;
use std::process::ExitCode;

use edgeloop_api::registry::{ModelVersionView, ModelView};
use edgeloop_models::Digest;
use serde::Serialize;
use serde_json::Value;

use super::api::{block_on, client, segment, Reply, ServerArgs};
use super::table::{bytes, fields, short_digest, text, when, Table};

pub fn list(server: &ServerArgs, out: &mut dyn Write) -> anyhow::Result<ExitCode> {
    block_on(out, async {
        let all: Vec<ModelView> = client(server)?.get("/api/v1/models").await?;
        Reply::typed(&all, server.json, |all| models_table(all))
    })
}

/// `model show`: the two server answers side by side, as they came.
#[derive(Debug, Serialize)]
struct ModelShow {
    model: ModelView,
    versions: Vec<ModelVersionView>,
    aliases: Vec<edgeloop_api::aliases::AliasView>,
}

pub fn show(name: &str, server: &ServerArgs, out: &mut dyn Write) -> anyhow::Result<ExitCode> {
    block_on(out, async {
        let client = client(server)?;
        let name = segment("model name", name)?;
        let model: ModelView = client.get(&format!("/api/v1/models/{name}")).await?;
        let versions: Vec<ModelVersionView> = client
            .get(&format!("/api/v1/models/{name}/versions"))
            .await?;
        let aliases = client
            .get(&format!("/api/v1/models/{name}/aliases"))
            .await?;
        let both = ModelShow {
            model,
            versions,
            aliases,
        };
        Reply::typed(&both, server.json, render_model)
    })
}

pub fn versions(name: &str, server: &ServerArgs, out: &mut dyn Write) -> anyhow::Result<ExitCode> {
    block_on(out, async {
        let name = segment("model name", name)?;
        let versions: Vec<ModelVersionView> = client(server)?
            .get(&format!("/api/v1/models/{name}/versions"))
            .await?;
        Reply::typed(&versions, server.json, |v| versions_table(v))
    })
}

/// A byte count in binary units (`table::bytes` on a typed count).
pub fn size(n: u64) -> String {
    bytes(&Value::from(n))
}

/// A digest shortened to what a person compares by eye.
pub fn short(d: Option<&Digest>) -> String {
    match d {
        Some(d) => short_digest(&Value::from(d.to_string())),
        None => "-".into(),
    }
}

pub fn models_table(all: &[ModelView]) -> String {
    let mut t = Table::new(&["NAME", "TASK", "LABELS", "CREATED", "DESCRIPTION"]);
    for m in all {
        t.row(vec![
            text(&m.name),
            text(&m.task),
            text(&m.labels),
            when(&m.created_at),
            super::table::clip(&m.description, 40),
        ]);
    }
    t.render()
}

fn render_model(both: &ModelShow) -> String {
    let m = &both.model;
    let mut out = fields(&[
        ("name", text(&m.name)),
        ("task", text(&m.task)),
        ("description", text(&m.description)),
        ("labels", text(&m.labels)),
        ("created", when(&m.created_at)),
    ]);
    out.push('\n');
    out.push_str(&versions_table(&both.versions));
    if !both.aliases.is_empty() {
        let mut t = Table::new(&["ALIAS", "VERSION", "MOVED", "BY"]);
        for a in &both.aliases {
            t.row(vec![
                a.alias.to_string(),
                a.version.clone(),
                when(&a.updated_at),
                a.updated_by.clone(),
            ]);
        }
        out.push('\n');
        out.push_str(&t.render());
    }
    out
}

/// One row per version, oldest first (the server's order), with where it
/// came from: parent, trigger, training job, dataset snapshot, checkpoint
/// and quantization method.
pub fn versions_table(versions: &[ModelVersionView]) -> String {
    let mut t = Table::new(&[
        "VERSION",
        "CREATED",
        "SIZE",
        "SIGNED",
        "PARENT",
        "TRIGGER",
        "JOB",
        "DATASET",
        "CHECKPOINT",
        "QUANTIZED",
        "METRICS",
    ]);
    for v in versions {
        let lineage = &v.lineage;
        let quantized = match &lineage.quantization {
            None | Some(Value::Null) => "-".to_string(),
            Some(_) => lineage.quantization_method().unwrap_or("yes").to_string(),
        };
        t.row(vec![
            text(&v.version),
            when(&v.created_at),
            size(v.artifact_size),
            text(&v.manifest_digest.is_some()),
            text(&lineage.parent_version),
            text(&lineage.trigger),
            text(&lineage.job),
            short(lineage.dataset.as_ref()),
            short(lineage.checkpoint.as_ref()),
            quantized,
            metrics(&v.metrics),
        ]);
    }
    let mut out = t.render();
    out.push_str(&variants_table(versions));
    out
}

/// The versions' variants, one row each, after the versions; nothing when
/// no version has any. The method is the one the variant's own gate chose.
pub fn variants_table(versions: &[ModelVersionView]) -> String {
    let mut t = Table::new(&["VERSION", "VARIANT", "FOR", "SIZE", "QUANTIZED", "ARTIFACT"]);
    for v in versions {
        for variant in &v.variants {
            let method = variant.quantization_method().unwrap_or("-");
            t.row(vec![
                text(&v.version),
                text(&variant.name),
                super::device::provider_names(&variant.providers),
                size(variant.artifact_size),
                method.to_string(),
                short(Some(&variant.artifact_digest)),
            ]);
        }
    }
    if t.is_empty() {
        return String::new();
    }
    format!("\nvariants:\n{}", t.render())
}

/// `accuracy=0.981,latency_ms=3.2`: four significant decimals are enough
/// to compare versions by eye; `--json` has the exact numbers.
fn metrics(m: &std::collections::BTreeMap<String, f64>) -> String {
    if m.is_empty() {
        return "-".into();
    }
    m.iter()
        .map(|(k, x)| format!("{k}={}", trim_float(*x)))
        .collect::<Vec<_>>()
        .join(",")
}

fn trim_float(x: f64) -> String {
    let s = format!("{x:.4}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    s.to_string()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn versions_list_their_variants() {
        let v = json!([{
            "model": "digits", "version": "2.0.0", "artifact_size": 2048,
            "artifact_digest": format!("sha256:{}", "2".repeat(64)), "format": "onnx",
            "metrics": {}, "lineage": {}, "created_at": "2026-01-02T03:04:05Z",
            "variants": [{"name": "fp16-gpu", "artifact_size": 4096,
                "artifact_digest": format!("sha256:{}", "4".repeat(64)),
                "manifest_digest": format!("sha256:{}", "5".repeat(64)),
                "providers": ["TensorrtExecutionProvider", "CUDAExecutionProvider"],
                "quantization": {"method": "fp16", "evidence": {}},
                "created_at": "2026-01-02T03:05:00Z"}]
        }]);
        let v: Vec<ModelVersionView> = serde_json::from_value(v).unwrap();
        let t = versions_table(&v);
        let row = t
            .lines()
            .find(|l| l.contains("fp16-gpu"))
            .unwrap_or_else(|| panic!("{t}"));
        for want in ["2.0.0", "Tensorrt,CUDA", "4.0 KiB", "fp16", "444444"] {
            assert!(row.contains(want), "{want}: {t}");
        }
    }

    #[test]
    fn versions_show_their_lineage() {
        let v = json!([{
            "model": "digits", "version": "2.0.0", "artifact_size": 2048,
            "artifact_digest": format!("sha256:{}", "2".repeat(64)), "format": "onnx",
            "manifest_digest": format!("sha256:{}", "1".repeat(64)),
            "metrics": {"accuracy": 0.98126, "loss": 0.5},
            "lineage": {"parent_version": "1.0.0", "trigger": "drift",
                        "job": "mnist-0000abcd",
                        "dataset": format!("sha256:{}", "ab".repeat(32)),
                        "quantization": {"method": "static_entropy", "evidence": {}}},
            "created_at": "2026-01-02T03:04:05Z"
        }, {
            "model": "digits", "version": "1.0.0", "artifact_size": 10,
            "artifact_digest": format!("sha256:{}", "3".repeat(64)), "format": "onnx",
            "metrics": {}, "lineage": {}, "created_at": "2026-01-01T00:00:00Z"
        }]);
        let v: Vec<ModelVersionView> = serde_json::from_value(v).unwrap();
        let t = versions_table(&v);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 3, "{t}");
        for want in [
            "2.0.0",
            "2.0 KiB",
            "yes",
            "1.0.0",
            "drift",
            "mnist-0000abcd",
            "abababababab",
            "static_entropy",
            "accuracy=0.9813,loss=0.5",
        ] {
            assert!(lines[1].contains(want), "{want}: {t}");
        }
        assert!(lines[2].starts_with("1.0.0"), "{t}");
        assert!(lines[2].contains(" no "), "{t}");
        assert_eq!(lines[0].find("TRIGGER"), lines[1].find("drift"), "{t}");
    }
}
