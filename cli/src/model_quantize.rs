//! `edgeloop model quantize` and `edgeloop model verify`.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context as _;
use edgeloop_models::dataset::Dataset;
use edgeloop_models::fs::write_atomic;
use edgeloop_models::manifest::{Lineage, PublicKey, SignedManifest};
use edgeloop_models::onnx;
use edgeloop_models::quantize::detect::DetectionSpec;
use edgeloop_models::quantize::gate::{
    CalibrationMethodName, Candidate, GateOptions, GateOutcome, LatencyGate,
};
use edgeloop_models::quantize::task::{state_pairs, StatePair, Task};
use edgeloop_models::runtime::OrtRuntime;

use edgeloop_models::package::{
    load_or_create_key, public_key_path, sign_outcome, Identity, Packaged, ProbeInputs,
};
use edgeloop_models::quantize::gate::{judge_latency_on, run_gate};

use super::api::{client, ServerArgs};
use super::model_benchmark::{models_to_time, time_on_device, Target};

use super::model::{Method, QuantizeArgs, TaskArg};

/// `~/.edgeloop/keys/manifest-signing.key` unless overridden.
fn default_signing_key() -> PathBuf {
    let home = std::env::var_os("EDGELOOP_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".edgeloop")
        });
    home.join("keys").join("manifest-signing.key")
}

fn candidates(method: Method) -> Vec<Candidate> {
    match method {
        Method::Auto => Candidate::default_order(),
        Method::StaticEntropy => vec![Candidate::Static {
            method: CalibrationMethodName::Entropy,
        }],
        Method::StaticPercentile => vec![Candidate::Static {
            method: CalibrationMethodName::Percentile,
        }],
        Method::StaticMinmax => vec![Candidate::Static {
            method: CalibrationMethodName::MinMax,
        }],
        Method::Dynamic => vec![Candidate::Dynamic],
        Method::Fp16 => vec![Candidate::Fp16],
    }
}

/// The task `--task` and `--state` name, `None` for the gate to infer.
fn task(args: &QuantizeArgs, summary: &onnx::Inspection) -> anyhow::Result<Option<Task>> {
    let named = |io: &[onnx::ValueSummary], n: &str| io.iter().any(|v| v.name == n);
    let mut state = vec![];
    for pair in &args.state {
        let (input, output) = pair
            .split_once('=')
            .with_context(|| format!("--state {pair:?}: expected INPUT=OUTPUT"))?;
        anyhow::ensure!(
            named(&summary.inputs, input),
            "--state {pair:?}: the model has no input {input:?}"
        );
        anyhow::ensure!(
            named(&summary.outputs, output),
            "--state {pair:?}: the model has no output {output:?}"
        );
        state.push(StatePair {
            input: input.into(),
            output: output.into(),
        });
    }
    anyhow::ensure!(
        state.is_empty() || matches!(args.task, TaskArg::Auto | TaskArg::Stateful),
        "--state applies to --task stateful"
    );
    Ok(match args.task {
        TaskArg::Auto if state.is_empty() => None,
        TaskArg::Auto | TaskArg::Stateful => {
            if state.is_empty() {
                state = state_pairs(summary);
            }
            anyhow::ensure!(
                !state.is_empty(),
                "--task stateful: no output is named after an input; name the state with --state INPUT=OUTPUT"
            );
            Some(Task::Stateful { state })
        }
        TaskArg::Classification => Some(Task::Classification),
        TaskArg::Detection => Some(Task::Detection(DetectionSpec {
            score_threshold: args.score_threshold,
            ..DetectionSpec::default()
        })),
        TaskArg::Regression => Some(Task::Regression),
    })
}

/// `--feature-names [INPUT=]a,b,c`: names for a tabular input's columns,
/// as many as it has (when its width is fixed), each once.
fn feature_names(
    given: &[String],
    summary: &onnx::Inspection,
) -> anyhow::Result<edgeloop_models::dataset::FeatureNames> {
    let mut out = edgeloop_models::dataset::FeatureNames::new();
    for arg in given {
        let (input, list) = match arg.split_once('=') {
            Some((i, l)) => (i.to_string(), l),
            None => (
                summary
                    .inputs
                    .first()
                    .context("--feature-names: the model has no inputs")?
                    .name
                    .clone(),
                arg.as_str(),
            ),
        };
        let spec = summary
            .inputs
            .iter()
            .find(|v| v.name == input)
            .with_context(|| {
                format!("--feature-names {arg:?}: the model has no input {input:?}")
            })?;
        let names: Vec<String> = list.split(',').map(|n| n.trim().to_string()).collect();
        let mut seen = std::collections::BTreeSet::new();
        for n in &names {
            anyhow::ensure!(
                !n.is_empty() && n.len() <= 128 && !n.chars().any(char::is_control),
                "--feature-names {arg:?}: a name is 1 to 128 printable characters, got {n:?}"
            );
            anyhow::ensure!(
                seen.insert(n),
                "--feature-names {arg:?}: {n:?} is named twice"
            );
        }
        let width = spec
            .shape
            .as_ref()
            .filter(|s| s.len() == 2)
            .and_then(|s| match s[1] {
                onnx::Dim::Fixed(n) => Some(n),
                _ => None,
            });
        if let Some(w) = width {
            anyhow::ensure!(
                names.len() as i64 == w,
                "--feature-names {arg:?}: input {input:?} has {w} columns, {} names given",
                names.len()
            );
        }
        anyhow::ensure!(
            out.insert(input.clone(), names).is_none(),
            "--feature-names: input {input:?} is named twice"
        );
    }
    Ok(out)
}

/// The health probe's inputs beside the model: OUT.probe.npz.
pub fn probe_path(out: &Path) -> PathBuf {
    let mut name = out.as_os_str().to_owned();
    name.push(".probe.npz");
    PathBuf::from(name)
}

pub fn manifest_path(out: &Path) -> PathBuf {
    let mut name = out.as_os_str().to_owned();
    name.push(".manifest.json");
    PathBuf::from(name)
}

pub fn quantize(args: QuantizeArgs) -> anyhow::Result<ExitCode> {
    if let Some(b) = args.budget {
        anyhow::ensure!(
            b >= 0.0 && b.is_finite(),
            "--budget must be a finite number >= 0"
        );
    }
    if let Some(ms) = args.latency_budget_ms {
        anyhow::ensure!(
            ms > 0.0 && ms.is_finite(),
            "--latency-budget-ms must be a finite number > 0"
        );
    }
    anyhow::ensure!(
        args.probe_max_latency_ms > 0.0 && args.probe_max_latency_ms.is_finite(),
        "--probe-max-latency-ms must be a finite number > 0"
    );
    anyhow::ensure!(
        (0.0..=1.0).contains(&args.score_threshold),
        "--score-threshold must be between 0 and 1"
    );
    let mut model =
        onnx::read(&args.model).with_context(|| format!("reading {}", args.model.display()))?;
    let dir = args
        .model
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    onnx::validate(&model, Some(dir))
        .with_context(|| format!("{} is not a valid model", args.model.display()))?;
    // The quantizers work on weights in memory. A model over 2 GiB stays
    // that big once internalized: the gate runs it from a copy written with
    // external data, and only a candidate that fits in one file can ship.
    onnx::internalize_external_data(&mut model, dir)?;
    let summary = onnx::inspect(&model);
    let calibration = Dataset::read(&args.calibration, &summary.inputs, false)?;
    let eval = Dataset::read(&args.eval, &summary.inputs, false)?;
    let task = task(&args, &summary)?;
    let runtime = OrtRuntime::load(args.ort_library.as_deref())?;
    let target = match (&args.benchmark_on, &args.benchmark_selector) {
        (Some(d), _) => Some(Target::Device(d.clone())),
        (None, Some(s)) => Some(Target::Selector(s.clone())),
        (None, None) => None,
    };
    anyhow::ensure!(
        (1..=edgeloop_api::benchmarks::MAX_RUNS).contains(&args.benchmark_runs),
        "--benchmark-runs must be 1 to {}",
        edgeloop_api::benchmarks::MAX_RUNS
    );
    let rule = match (args.latency_budget_ms, args.not_slower_than_float) {
        (Some(max_ms), _) => LatencyGate::Budget { max_ms },
        (None, true) => LatencyGate::NotSlowerThanFloat { tolerance: 0.10 },
        // Timed on the device, latency counts unless the user says how.
        (None, false) if target.is_some() => LatencyGate::NotSlowerThanFloat { tolerance: 0.10 },
        (None, false) => LatencyGate::Report,
    };
    let opts = GateOptions {
        task,
        budget: args.budget,
        percentile: args.percentile,
        candidates: candidates(args.method),
        // With a device to time on, this machine's timings are recorded
        // and the device's decide.
        latency: if target.is_some() {
            LatencyGate::Report
        } else {
            rule
        },
        ..GateOptions::default()
    };
    let name = match &args.name {
        Some(n) => n.clone(),
        None => args
            .model
            .file_stem()
            .map(|s| {
                s.to_string_lossy()
                    .to_lowercase()
                    .replace(['_', '.', ' '], "-")
            })
            .unwrap_or_else(|| "model".into()),
    };
    let key_path = args.signing_key.clone().unwrap_or_else(default_signing_key);
    let key = load_or_create_key(&key_path)?;
    let probe = if args.no_probe {
        None
    } else {
        Some(ProbeInputs::first_call(&eval, args.probe_max_latency_ms)?)
    };
    let feature_names = feature_names(&args.feature_names, &summary)?;
    let identity = Identity {
        feature_names,
        name,
        version: args.version.clone(),
        lineage: Lineage {
            job: args.job.clone(),
            checkpoint: args.checkpoint,
            dataset: args.dataset,
            parent_version: args.parent_version.clone(),
        },
        min_version: args.min_version.clone(),
        rollback: args.rollback,
    };
    let mut outcome = run_gate(&runtime, &model, &calibration, &eval, &opts)?;
    if let Some(target) = &target {
        let server = ServerArgs {
            server: args.server.clone(),
            token: args.token.clone(),
            env_token: args.env_token.clone(),
            ca_file: args.ca_file.clone(),
            ca_fingerprint: args.ca_fingerprint,
            token_file: args.token_file.clone(),
            json: args.json,
        };
        // One call's inputs: the probe's, made even when none ships.
        let inputs = match &probe {
            Some(p) => p.npz.clone(),
            None => ProbeInputs::first_call(&eval, args.probe_max_latency_ms)?.npz,
        };
        let models = models_to_time(&outcome, &model, &identity, &key)?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let view = runtime
            .block_on(async {
                let client = client(&server)?;
                time_on_device(
                    &client,
                    target,
                    models,
                    inputs,
                    args.benchmark_runs,
                    args.benchmark_timeout_s,
                )
                .await
            })
            .map_err(|e| anyhow::anyhow!("timing on the device: {e}"))?;
        judge_latency_on(&mut outcome, &model, &view.timings(), rule, view.timed_on())?;
    }
    let Packaged {
        artifact: bytes,
        manifest: signed,
        outcome,
    } = sign_outcome(&runtime, outcome, &eval, identity, probe.as_ref(), &key)?;
    write_atomic(&args.out, &bytes, 0o644)
        .with_context(|| format!("writing {}", args.out.display()))?;
    let probe_out = probe_path(&args.out);
    if let Some(p) = &probe {
        write_atomic(&probe_out, &p.npz, 0o644)
            .with_context(|| format!("writing {}", probe_out.display()))?;
    }
    let manifest_out = manifest_path(&args.out);
    write_atomic(&manifest_out, signed.to_json_pretty()?.as_bytes(), 0o644)
        .with_context(|| format!("writing {}", manifest_out.display()))?;

    if args.json {
        let mut v = serde_json::to_value(&outcome)?;
        v["out"] = serde_json::Value::String(args.out.display().to_string());
        v["manifest"] = serde_json::Value::String(manifest_out.display().to_string());
        if probe.is_some() {
            v["probe_inputs"] = serde_json::Value::String(probe_out.display().to_string());
        }
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        print!("{}", render_table(&outcome));
        println!(
            "wrote {} ({}) and {}",
            args.out.display(),
            outcome.chosen,
            manifest_out.display()
        );
        if probe.is_some() {
            println!("health probe inputs: {}", probe_out.display());
        }
    }
    Ok(ExitCode::SUCCESS)
}

pub fn render_table(o: &GateOutcome) -> String {
    use std::fmt::Write;
    let metric = o.metric.name;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{:<26} {:>12} {:>9} {:>7} {:>11} {:>11}  verdict",
        metric.name(),
        "value",
        "loss",
        "size",
        "latency ms",
        "quantize ms"
    );
    for m in std::iter::once(&o.float).chain(&o.candidates) {
        let _ = writeln!(
            s,
            "{:<26} {:>12.4} {:>9.4} {:>7.3} {:>11.3} {:>11.1}  {}{}",
            m.name,
            m.metric,
            m.loss,
            m.size_bytes as f64 / o.float.size_bytes.max(1) as f64,
            m.latency_ms,
            m.quantize_ms,
            if m.name == o.chosen { "CHOSEN: " } else { "" },
            m.verdict
        );
    }
    let _ = writeln!(
        s,
        "task {}; size is relative to float ({} bytes); budget {} {}; latency timed on {}",
        o.task.name(),
        o.float.size_bytes,
        o.metric.budget,
        o.metric.unit,
        o.latency.timed_on
    );
    let _ = writeln!(s, "{}", o.reason);
    s
}

pub fn verify(
    model: &Path,
    manifest: &Path,
    public_key: Option<&Path>,
) -> anyhow::Result<ExitCode> {
    let raw = std::fs::read(manifest).with_context(|| format!("reading {}", manifest.display()))?;
    let signed = SignedManifest::from_json(&raw)
        .with_context(|| format!("parsing {}", manifest.display()))?;
    let key_path = public_key
        .map(Path::to_path_buf)
        .unwrap_or_else(|| public_key_path(&default_signing_key()));
    let key = PublicKey::read_from(&key_path)
        .with_context(|| format!("reading public key {}", key_path.display()))?;
    match signed.verify_artifact(&[key], model) {
        Ok(m) => {
            println!(
                "OK: {} {} ({} bytes, sha256 {}) signed by {}",
                m.name, m.version, m.artifact.size, m.artifact.sha256, signed.key_id
            );
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => {
            eprintln!("FAILED: {e}");
            Ok(ExitCode::FAILURE)
        }
    }
}
