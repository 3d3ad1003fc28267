//! `edgeloop sample list | show | label | export | import`: the labelling
//! queue. Devices send the rows their model was least sure of (hard
//! examples); a person, or a labelling tool, gives them their true class,
//! and labelled samples go into the next retraining snapshot.
//!
//! `export` writes JSON Lines, one sample per line, which labelling tools
//! take in: its id, provenance, the model's prediction and confidence, its
//! inputs as numbers (`values`, row-major, with `shape` and `dtype`), and
//! `"label": null`. `import` reads the same lines back with `label` filled
//! in (lines left `null` are skipped), checks the whole file first, and
//! labels in bulk requests of at most 1000, each all or nothing.

use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use base64::Engine as _;
use clap::{Subcommand, ValueEnum};
use edgeloop_api::samples::{
    parse_sample_id, LabelEntry, LabelState, LabelsSet, SampleKind, SampleView, SetLabel,
    SetLabels, MAX_BULK_LABELS, MAX_LABEL,
};
use serde_json::{json, Value};

use super::api::{block_on, client, segment, CliError, Reply, ServerArgs};
use super::table::{fields, text, when, Table};

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum KindArg {
    HardExample,
    Feedback,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum StateArg {
    Labelled,
    Unlabelled,
}

#[derive(Debug, Subcommand)]
pub enum SampleCommand {
    /// A model's samples (default: the labelling queue, unlabelled hard
    /// examples), oldest report first.
    List {
        model: String,
        #[arg(long, value_enum, default_value_t = KindArg::HardExample)]
        kind: KindArg,
        #[arg(long, value_enum, default_value_t = StateArg::Unlabelled)]
        state: StateArg,
        /// At most this many (1 to 1000).
        #[arg(long, default_value_t = 100)]
        limit: usize,
    },
    /// One sample with its provenance and inputs.
    Show { model: String, id: String },
    /// Gives a sample its true class (a relabel replaces the label).
    Label {
        model: String,
        id: String,
        label: i64,
    },
    /// Writes samples as JSON Lines for a labelling tool (default: the
    /// unlabelled hard examples).
    Export {
        model: String,
        #[arg(long, value_enum, default_value_t = KindArg::HardExample)]
        kind: KindArg,
        #[arg(long, value_enum, default_value_t = StateArg::Unlabelled)]
        state: StateArg,
        #[arg(long, default_value_t = 1000)]
        limit: usize,
        /// The file to write (`-`: stdout).
        #[arg(short = 'o', long = "out")]
        out: PathBuf,
    },
    /// Reads labels back from JSON Lines (`{"id": ..., "label": N}` per
    /// line, as `export` wrote them with `label` filled in).
    Import {
        model: String,
        /// The file to read (`-`: stdin).
        file: PathBuf,
    },
}

fn kind(k: KindArg) -> SampleKind {
    match k {
        KindArg::HardExample => SampleKind::HardExample,
        KindArg::Feedback => SampleKind::Feedback,
    }
}

fn state(s: StateArg) -> LabelState {
    match s {
        StateArg::Labelled => LabelState::Labelled,
        StateArg::Unlabelled => LabelState::Unlabelled,
    }
}

fn as_query<T: serde::Serialize>(v: T) -> Option<String> {
    serde_json::to_value(v)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
}

/// A sample id goes into a URL path: it must parse, and hold only what ids
/// are made of.
fn sample_segment(id: &str) -> Result<&str, CliError> {
    let chars = id
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'+' | b':'));
    if chars && parse_sample_id(id).is_some() {
        Ok(id)
    } else {
        Err(CliError::Usage(format!(
            "{id:?} is not a sample id (<version>:<device>:<sequence>:<index>, as `sample list` shows)"
        )))
    }
}

pub fn run(
    cmd: SampleCommand,
    server: &ServerArgs,
    out: &mut dyn Write,
) -> anyhow::Result<ExitCode> {
    block_on(out, async {
        let client = client(server)?;
        match cmd {
            SampleCommand::List {
                model,
                kind: k,
                state: s,
                limit,
            } => {
                let model = segment("model name", &model)?;
                let all = list(&client, model, k, s, limit).await?;
                Reply::typed(&all, server.json, |all| table(all))
            }
            SampleCommand::Show { model, id } => {
                let (model, id) = (segment("model name", &model)?, sample_segment(&id)?);
                let s: SampleView = client
                    .get(&format!("/api/v1/models/{model}/samples/{id}"))
                    .await?;
                Reply::typed(&s, server.json, render)
            }
            SampleCommand::Label { model, id, label } => {
                let (model, id) = (segment("model name", &model)?, sample_segment(&id)?);
                if !(0..=MAX_LABEL).contains(&label) {
                    return Err(CliError::Usage(format!(
                        "the label is a class index from 0 to {MAX_LABEL}, got {label}"
                    )));
                }
                let s: SampleView = client
                    .post(
                        &format!("/api/v1/models/{model}/samples/{id}/label"),
                        &SetLabel { label },
                    )
                    .await?;
                Reply::typed(&s, server.json, |s| {
                    format!("labelled {} as {}\n", s.id, text(&s.label))
                })
            }
            SampleCommand::Export {
                model,
                kind: k,
                state: s,
                limit,
                out: file,
            } => {
                let model = segment("model name", &model)?;
                let all = list(&client, model, k, s, limit).await?;
                let mut lines = String::new();
                for sample in &all {
                    lines.push_str(&export_line(sample).to_string());
                    lines.push('\n');
                }
                if file == Path::new("-") {
                    return Ok(Reply::ok(lines));
                }
                edgeloop_models::fs::write_atomic(&file, lines.as_bytes(), 0o644)
                    .map_err(|e| CliError::Io(format!("writing {}: {e}", file.display())))?;
                let report = json!({"exported": all.len(), "file": file.display().to_string()});
                Reply::typed(&report, server.json, |_| {
                    format!("exported {} samples to {}\n", all.len(), file.display())
                })
            }
            SampleCommand::Import { model, file } => {
                let model = segment("model name", &model)?;
                let entries = read_labels(&file)?;
                let mut labelled = 0;
                for chunk in entries.chunks(MAX_BULK_LABELS) {
                    let set: LabelsSet = client
                        .post(
                            &format!("/api/v1/models/{model}/samples/labels"),
                            &SetLabels {
                                labels: chunk.to_vec(),
                            },
                        )
                        .await?;
                    labelled += set.labelled;
                }
                let report = json!({"labelled": labelled, "file": file.display().to_string()});
                Reply::typed(&report, server.json, |_| {
                    format!("labelled {labelled} samples from {}\n", file.display())
                })
            }
        }
    })
}

async fn list(
    client: &super::api::Client,
    model: &str,
    k: KindArg,
    s: StateArg,
    limit: usize,
) -> Result<Vec<SampleView>, CliError> {
    if !(1..=1000).contains(&limit) {
        return Err(CliError::Usage(format!(
            "--limit must be 1 to 1000, got {limit}"
        )));
    }
    Ok(client
        .get_query(
            &format!("/api/v1/models/{model}/samples"),
            &[
                ("kind", as_query(kind(k))),
                ("state", as_query(state(s))),
                ("limit", Some(limit.to_string())),
            ],
        )
        .await?)
}

/// One sample as a labelling tool takes it in.
pub fn export_line(s: &SampleView) -> Value {
    let inputs: Vec<Value> = s
        .inputs
        .iter()
        .map(|t| {
            let mut v = json!({"name": t.name, "dtype": t.dtype, "shape": t.shape});
            match decode_values(&t.dtype, &t.data_base64) {
                Some(values) => v["values"] = Value::Array(values),
                None => v["data_base64"] = json!(t.data_base64),
            }
            v
        })
        .collect();
    json!({
        "id": s.id,
        "label": s.label,
        "predicted_class": s.predicted_class,
        "confidence": s.confidence,
        "model": s.model_name,
        "version": s.model_version,
        "device": s.device,
        "request_id": s.request_id,
        "observed_at": s.observed_at.and_then(|t| t.format(&time::format_description::well_known::Rfc3339).ok()),
        "inputs": inputs,
    })
}

/// Little-endian values of a NumPy dtype as JSON numbers; `None` for a
/// dtype without a plain number form (float16) or bytes that do not fit.
fn decode_values(dtype: &str, data: &str) -> Option<Vec<Value>> {
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(data)
        .ok()?;
    fn each<const N: usize>(bytes: &[u8], f: impl Fn([u8; N]) -> Value) -> Option<Vec<Value>> {
        if !bytes.len().is_multiple_of(N) {
            return None;
        }
        bytes
            .chunks_exact(N)
            .map(|c| Some(f(c.try_into().ok()?)))
            .collect()
    }
    match dtype {
        "float32" => each(&bytes, |b| json!(f32::from_le_bytes(b))),
        "float64" => each(&bytes, |b| json!(f64::from_le_bytes(b))),
        "int64" => each(&bytes, |b| json!(i64::from_le_bytes(b))),
        "int32" => each(&bytes, |b| json!(i32::from_le_bytes(b))),
        "int8" => each(&bytes, |b| json!(i8::from_le_bytes(b))),
        "uint8" => each(&bytes, |b: [u8; 1]| json!(b[0])),
        "bool" => each(&bytes, |b: [u8; 1]| json!(b[0] != 0)),
        _ => None,
    }
}

/// The labels of a JSON Lines file, checked whole before anything is sent:
/// every line an object with a sample `id` and a `label` (a class index,
/// or null to skip); blank lines are skipped. 65 naming the line if not.
pub fn read_labels(file: &Path) -> Result<Vec<LabelEntry>, CliError> {
    let reader: Box<dyn BufRead> = if file == Path::new("-") {
        Box::new(std::io::BufReader::new(std::io::stdin()))
    } else {
        Box::new(std::io::BufReader::new(std::fs::File::open(file).map_err(
            |e| CliError::NotFound(format!("reading {}: {e}", file.display())),
        )?))
    };
    let mut entries = vec![];
    for (n, line) in reader.lines().enumerate() {
        let at = || format!("{} line {}", file.display(), n + 1);
        let line = line.map_err(|e| CliError::Io(format!("{}: {e}", at())))?;
        if line.trim().is_empty() {
            continue;
        }
        let v: Value = serde_json::from_str(&line)
            .map_err(|e| CliError::Invalid(format!("{}: not JSON: {e}", at())))?;
        let id = v
            .get("id")
            .and_then(Value::as_str)
            .filter(|id| parse_sample_id(id).is_some())
            .ok_or_else(|| CliError::Invalid(format!("{}: no sample id (`id`)", at())))?;
        let label = match v.get("label") {
            None | Some(Value::Null) => continue,
            Some(l) => l
                .as_i64()
                .filter(|l| (0..=MAX_LABEL).contains(l))
                .ok_or_else(|| {
                    CliError::Invalid(format!(
                        "{}: `label` must be a class index from 0 to {MAX_LABEL}, got {l}",
                        at()
                    ))
                })?,
        };
        entries.push(LabelEntry {
            id: id.to_string(),
            label,
        });
    }
    if entries.is_empty() {
        return Err(CliError::Invalid(format!(
            "{}: no labelled lines (every `label` is null or missing)",
            file.display()
        )));
    }
    Ok(entries)
}

pub fn table(all: &[SampleView]) -> String {
    let mut t = Table::new(&[
        "ID",
        "KIND",
        "VERSION",
        "DEVICE",
        "PREDICTED",
        "CONFIDENCE",
        "LABEL",
        "OBSERVED",
    ]);
    for s in all {
        t.row(vec![
            s.id.clone(),
            as_query(s.kind).unwrap_or_default(),
            s.model_version.clone(),
            s.device.clone(),
            text(&s.predicted_class),
            s.confidence.map_or("-".into(), |c| format!("{c:.3}")),
            text(&s.label),
            when(&s.observed_at),
        ]);
    }
    t.render()
}

pub fn render(s: &SampleView) -> String {
    let inputs: Vec<String> = s
        .inputs
        .iter()
        .map(|t| format!("{} {} {:?}", t.name, t.dtype, t.shape))
        .collect();
    fields(&[
        ("id", s.id.clone()),
        ("kind", as_query(s.kind).unwrap_or_default()),
        ("model", format!("{} {}", s.model_name, s.model_version)),
        ("device", s.device.clone()),
        ("request", s.request_id.clone()),
        ("observed", when(&s.observed_at)),
        ("predicted", text(&s.predicted_class)),
        (
            "confidence",
            s.confidence.map_or("-".into(), |c| format!("{c:.3}")),
        ),
        ("label", text(&s.label)),
        (
            "labelled",
            match (&s.labelled_by, &s.labelled_at) {
                (Some(by), at) => format!("by {by} at {}", when(at)),
                _ => "-".into(),
            },
        ),
        ("inputs", inputs.join("; ")),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn import_checks_the_whole_file_and_names_the_line() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("labels.jsonl");
        let write = |text: &str| std::fs::write(&file, text).unwrap();
        write("{\"id\": \"1:edge-1:3:0\", \"label\": 2}\n\n{\"id\": \"1:edge-1:3:1\", \"label\": null}\n");
        let got = read_labels(&file).unwrap();
        assert_eq!(
            got,
            [LabelEntry {
                id: "1:edge-1:3:0".into(),
                label: 2
            }]
        );
        for (text, says) in [
            (
                "{\"id\": \"1:edge-1:3:0\", \"label\": 2}\nnot json\n",
                "line 2: not JSON",
            ),
            ("{\"label\": 2}\n", "line 1: no sample id"),
            ("{\"id\": \"nope\", \"label\": 2}\n", "line 1: no sample id"),
            (
                "{\"id\": \"1:e:3:0\", \"label\": -1}\n",
                "line 1: `label` must be",
            ),
            (
                "{\"id\": \"1:e:3:0\", \"label\": 1.5}\n",
                "line 1: `label` must be",
            ),
            (
                "{\"id\": \"1:e:3:0\", \"label\": null}\n",
                "no labelled lines",
            ),
        ] {
            write(text);
            let e = read_labels(&file).unwrap_err();
            assert!(matches!(e, CliError::Invalid(_)), "{e}");
            assert!(e.to_string().contains(says), "{text:?}: {e}");
        }
    }

    #[test]
    fn exported_inputs_are_numbers_where_the_dtype_has_them() {
        let b64 = |b: &[u8]| base64::engine::general_purpose::STANDARD.encode(b);
        let floats: Vec<u8> = [1.5f32, -2.0]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        assert_eq!(
            decode_values("float32", &b64(&floats)),
            Some(vec![json!(1.5), json!(-2.0)])
        );
        assert_eq!(
            decode_values("int64", &b64(&7i64.to_le_bytes())),
            Some(vec![json!(7)])
        );
        assert_eq!(
            decode_values("bool", &b64(&[0, 1])),
            Some(vec![json!(false), json!(true)])
        );
        assert_eq!(
            decode_values("float32", &b64(&[1, 2, 3])),
            None,
            "not whole values"
        );
        assert_eq!(decode_values("float16", &b64(&[0, 60])), None);
        assert!(sample_segment("1.0.0+b:edge-1:12:0").is_ok());
        for bad in ["1/2:e:1:0", "1:e:1", "1:e:x:0", "../x:e:1:0"] {
            assert!(sample_segment(bad).is_err(), "{bad}");
        }
    }
}
