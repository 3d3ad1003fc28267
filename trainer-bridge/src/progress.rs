//! The bridge's progress endpoint, `EDGELOOP_REPORT_URL`: a trainer POSTs
//! `{"step": 1200, "metrics": {"loss": 0.12, "throughput": 5400}}` there as
//! often as it likes. The newest report per job goes to the control plane
//! with the next poll, and every report becomes TensorBoard scalars in
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

    fn record(&self, job: &str, report: Report) -> std::io::Result<()> {
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
    if report.metrics.len() > 256 {
        return bad("at most 256 metrics".into());
    }
    if let Some((k, _)) = report.metrics.iter().find(|(_, v)| !v.is_finite()) {
        return bad(format!("metrics.{k} must be a finite number"));
    }
    match hub.record(&job, report) {
        Ok(()) => (StatusCode::ACCEPTED, Json(serde_json::json!({"ok": true}))),
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            Json(serde_json::json!({"error": e.to_string()})),
        ),
    }
}
