//! The bridge's progress endpoint, `EDGELOOP_REPORT_URL`: a trainer POSTs
//! `{"step": 1200, "metrics": {"loss": 0.12, "throughput": 5400}}` there as
//! often as it likes, or prints the same object as one line on stdout
//! ([`StdoutReports`]; for nodes that cannot reach the bridge's loopback
//! endpoint). The newest report per job goes to the control plane with the
//! next poll, and every report becomes TensorBoard scalars in
//! `<job dir>/tensorboard/`.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};

use axum::extract::{DefaultBodyLimit, Path, State};
use axum::http::StatusCode;
use axum::routing::post;
use axum::{Json, Router};
use serde::Deserialize;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::tensorboard::EventWriter;

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Report {
    pub step: u64,
    #[serde(default)]
    pub metrics: BTreeMap<String, f64>,
}

pub struct ProgressHub {
    base_url: String,
    jobs_dir: PathBuf,
    latest: Mutex<HashMap<String, Report>>,
    writers: Mutex<HashMap<String, EventWriter>>,
}

fn valid_job(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 128
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

impl ProgressHub {
    /// Binds `listen` and serves until `shutdown`. `jobs_dir` is where each
    /// job's directory (and its tensorboard/ folder) lives.
    pub async fn start(
        listen: std::net::SocketAddr,
        jobs_dir: PathBuf,
        shutdown: CancellationToken,
    ) -> std::io::Result<Arc<Self>> {
        let listener = TcpListener::bind(listen).await?;
        let hub = Arc::new(Self {
            base_url: format!("http://{}", listener.local_addr()?),
            jobs_dir,
            latest: Mutex::new(HashMap::new()),
            writers: Mutex::new(HashMap::new()),
        });
        let app = Router::new()
            .route("/v1/jobs/{job}/progress", post(receive))
            .layer(DefaultBodyLimit::max(64 * 1024))
            .with_state(hub.clone());
        tokio::spawn(async move {
            let _ = axum::serve(listener, app)
                .with_graceful_shutdown(shutdown.cancelled_owned())
                .await;
        });
        Ok(hub)
    }

    /// The `EDGELOOP_REPORT_URL` for a job.
    pub fn url_for(&self, job: &str) -> String {
        format!("{}/v1/jobs/{job}/progress", self.base_url)
    }

    /// The newest report for a job, if any.
    pub fn latest(&self, job: &str) -> Option<Report> {
        self.latest
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(job)
            .cloned()
    }

    pub fn forget(&self, job: &str) {
        self.latest
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(job);
        self.writers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(job);
    }

    /// Records a report that did not come through the endpoint (a JSON line
    /// on the job's stdout).
    pub fn record(&self, job: &str, report: Report) -> std::io::Result<()> {
        {
            let mut writers = self.writers.lock().unwrap_or_else(PoisonError::into_inner);
            if !writers.contains_key(job) {
                writers.insert(
                    job.to_string(),
                    EventWriter::create(&self.jobs_dir.join(job).join("tensorboard"))?,
                );
            }
            if let Some(w) = writers.get(job) {
                w.scalars(report.step, &report.metrics)?;
            }
        }
        self.latest
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(job.to_string(), report);
        Ok(())
    }
}

async fn receive(
    State(hub): State<Arc<ProgressHub>>,
    Path(job): Path<String>,
    body: axum::body::Bytes,
) -> (StatusCode, Json<serde_json::Value>) {
    let bad = |m: String| {
        (
            StatusCode::BAD_REQUEST,
            Json(serde_json::json!({"error": m})),
        )
    };
    if !valid_job(&job) || !hub.jobs_dir.join(&job).is_dir() {
        return (
            StatusCode::NOT_FOUND,
            Json(serde_json::json!({"error": format!("no job {job:?} runs on this bridge")})),
        );
    }
    let report: Report = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => {
            return bad(format!(
                "expected {{\"step\": N, \"metrics\": {{...}}}}: {e}"
            ))
        }
    };
    if let Err(e) = check(&report) {
        return bad(e);
    }
    match hub.record(&job, report) {
        Ok(()) => (StatusCode::ACCEPTED, Json(serde_json::json!({"ok": true}))),
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            Json(serde_json::json!({"error": e.to_string()})),
        ),
    }
}

/// What a report must satisfy, however it arrived.
fn check(report: &Report) -> Result<(), String> {
    if report.metrics.len() > 256 {
        return Err("at most 256 metrics".into());
    }
    if let Some((k, _)) = report.metrics.iter().find(|(_, v)| !v.is_finite()) {
        return Err(format!("metrics.{k} must be a finite number"));
    }
    Ok(())
}

/// A progress line on stdout: a JSON object with an integer `step` and a
/// `metrics` object of numbers. Other keys are allowed (trainers log more
/// than this), and any other line is ordinary output.
pub fn parse_line(line: &[u8]) -> Option<Report> {
    let trimmed = line.trim_ascii();
    if !trimmed.starts_with(b"{") {
        return None;
    }
    #[derive(Deserialize)]
    struct Line {
        step: u64,
        metrics: BTreeMap<String, f64>,
    }
    let l: Line = serde_json::from_slice(trimmed).ok()?;
    let report = Report {
        step: l.step,
        metrics: l.metrics,
    };
    check(&report).ok().map(|()| report)
}

/// Follows a job's output for progress lines, by offset, so each poll reads
/// only what is new. Memory stays bounded: at most [`Self::MAX_READ`] per
/// poll, and a line longer than [`Self::MAX_LINE`] is skipped, not buffered.
#[derive(Debug, Default)]
pub struct StdoutReports {
    offset: u64,
    partial: Vec<u8>,
    /// Inside an over-long line: drop bytes until its end.
    skipping: bool,
}

impl StdoutReports {
    pub const MAX_READ: u64 = 1 << 20;
    pub const MAX_LINE: usize = 64 * 1024;

    /// New reports in the file at `path` (the engine writes the job's
    /// output there). A missing file has none yet.
    pub fn poll_file(&mut self, path: &std::path::Path) -> Vec<Report> {
        use std::io::{Read, Seek, SeekFrom};
        let Ok(mut f) = std::fs::File::open(path) else {
            return vec![];
        };
        let len = f.metadata().map_or(0, |m| m.len());
        if len < self.offset {
            // Truncated or replaced: start over.
            *self = Self::default();
        }
        if f.seek(SeekFrom::Start(self.offset)).is_err() {
            return vec![];
        }
        let mut buf = Vec::new();
        let n = f.take(Self::MAX_READ).read_to_end(&mut buf).unwrap_or(0);
        self.offset += n as u64;
        self.feed(&buf[..n])
    }

    /// New reports in `whole`, the job's entire output so far (engines that
    /// serve logs rather than write a file, like Ray).
    pub fn poll_text(&mut self, whole: &[u8]) -> Vec<Report> {
        if (whole.len() as u64) < self.offset {
            *self = Self::default();
        }
        let from = usize::try_from(self.offset)
            .unwrap_or(usize::MAX)
            .min(whole.len());
        let to = whole
            .len()
            .min(from.saturating_add(Self::MAX_READ as usize));
        self.offset = to as u64;
        self.feed(&whole[from..to])
    }

    fn feed(&mut self, mut bytes: &[u8]) -> Vec<Report> {
        let mut out = Vec::new();
        while let Some(nl) = bytes.iter().position(|&b| b == b'\n') {
            let (head, rest) = (&bytes[..nl], &bytes[nl + 1..]);
            if self.skipping {
                self.skipping = false;
            } else if self.partial.len() + head.len() <= Self::MAX_LINE {
                self.partial.extend_from_slice(head);
                out.extend(parse_line(&self.partial));
            }
            self.partial.clear();
            bytes = rest;
        }
        if !self.skipping {
            if self.partial.len() + bytes.len() > Self::MAX_LINE {
                self.partial.clear();
                self.skipping = true;
            } else {
                self.partial.extend_from_slice(bytes);
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn progress_lines_are_found_among_ordinary_output() {
        let cases: &[(&str, Option<u64>)] = &[
            (r#"{"step": 12, "metrics": {"loss": 0.5}}"#, Some(12)),
            (r#"  {"step": 3, "metrics": {}, "epoch": 1}  "#, Some(3)),
            (r#"{"step": -1, "metrics": {}}"#, None),
            (r#"{"step": 1}"#, None),
            (r#"{"step": 1, "metrics": {"loss": "low"}}"#, None),
            ("epoch 1 loss 0.5", None),
            ("{not json", None),
            ("", None),
        ];
        for (line, want) in cases {
            assert_eq!(parse_line(line.as_bytes()).map(|r| r.step), *want, "{line}");
        }
        let many: BTreeMap<String, f64> = (0..300).map(|i| (format!("m{i}"), 1.0)).collect();
        let line = serde_json::json!({"step": 1, "metrics": many}).to_string();
        assert_eq!(parse_line(line.as_bytes()), None, "more than 256 metrics");
    }

    #[test]
    fn lines_split_across_reads_are_joined_and_long_lines_skipped() {
        let mut r = StdoutReports::default();
        let text = b"hello\n{\"step\": 1, \"metrics\": {\"loss\": 1.0}}\n{\"step\": 2, \"met";
        let got = r.poll_text(text);
        assert_eq!(got.iter().map(|r| r.step).collect::<Vec<_>>(), vec![1]);
        let mut more = text.to_vec();
        more.extend_from_slice(b"rics\": {}}\n");
        assert_eq!(
            r.poll_text(&more)
                .iter()
                .map(|r| r.step)
                .collect::<Vec<_>>(),
            vec![2]
        );

        // A line over the limit is dropped whole, and the next one still counts.
        let mut huge = more.clone();
        huge.extend(std::iter::repeat_n(b'x', StdoutReports::MAX_LINE + 10));
        assert!(r.poll_text(&huge).is_empty());
        huge.extend_from_slice(
            b"{\"step\": 9, \"metrics\": {}}\n{\"step\": 10, \"metrics\": {}}\n",
        );
        assert_eq!(
            r.poll_text(&huge)
                .iter()
                .map(|r| r.step)
                .collect::<Vec<_>>(),
            vec![10]
        );
    }

    #[test]
    fn a_file_is_followed_by_offset() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out.log");
        let mut r = StdoutReports::default();
        assert!(r.poll_file(&path).is_empty(), "no file yet");
        std::fs::write(&path, "{\"step\": 1, \"metrics\": {}}\n").unwrap();
        assert_eq!(r.poll_file(&path).len(), 1);
        assert!(r.poll_file(&path).is_empty(), "nothing new");
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap();
        std::io::Write::write_all(&mut f, b"{\"step\": 2, \"metrics\": {}}\n").unwrap();
        assert_eq!(r.poll_file(&path)[0].step, 2);
    }
}
