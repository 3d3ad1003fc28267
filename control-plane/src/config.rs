//! Settings for `control-plane serve`. One struct is both the clap flags
//! (each with its `EDGELOOP_*` env var) and the TOML file's shape, so the two
//! cannot drift apart. Precedence: flag > env > file > default.

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context as _;
use serde::Deserialize;

use crate::fleet::cost::Prices;
use edgeloop_registry::s3::S3Location;

#[derive(Debug, Clone, Default, clap::Args, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct ServeSettings {
    /// Where the store, artifacts, PKI and admin token live.
    #[arg(long, env = "EDGELOOP_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
    /// Keep the records in PostgreSQL instead of the embedded store under
    /// --data-dir: postgres://USER:PASSWORD@HOST:PORT/DATABASE (sslmode
    /// disable or prefer; TLS is not supported yet). The tables are made or
    /// migrated at start. Prefer the env var or the file to the flag, which
    /// other users can see in the process list.
    #[arg(long, env = "EDGELOOP_STORE_URL", hide_env_values = true)]
    pub store_url: Option<String>,
    /// Keep artifacts in S3 instead of the data dir: s3://bucket/prefix.
    /// Endpoint, region and credentials come from the AWS environment
    /// (AWS_ENDPOINT_URL, AWS_REGION, AWS_ACCESS_KEY_ID,
    /// AWS_SECRET_ACCESS_KEY; AWS_ALLOW_HTTP=true for a plain-HTTP
    /// endpoint).
    #[arg(long, env = "EDGELOOP_ARTIFACT_URL")]
    pub artifact_url: Option<String>,
    /// gRPC (mTLS) listen address for agents and bridges.
    #[arg(long, env = "EDGELOOP_GRPC_LISTEN")]
    pub grpc_listen: Option<SocketAddr>,
    /// Console REST API listen address. Plain HTTP unless --http-tls:
    /// then anything but a loopback address needs --insecure-http.
    #[arg(long, env = "EDGELOOP_HTTP_LISTEN")]
    pub http_listen: Option<SocketAddr>,
    /// Serve the console API over TLS (rustls), with the control plane's
    /// server certificate (its CA's, for the --server-name names) unless
    /// --http-tls-cert and --http-tls-key give another.
    #[arg(long, env = "EDGELOOP_HTTP_TLS")]
    #[serde(default)]
    pub http_tls: bool,
    /// PEM certificate chain (leaf first) for --http-tls.
    #[arg(long, env = "EDGELOOP_HTTP_TLS_CERT", requires = "http_tls_key")]
    pub http_tls_cert: Option<PathBuf>,
    /// PEM private key for --http-tls-cert.
    #[arg(long, env = "EDGELOOP_HTTP_TLS_KEY", requires = "http_tls_cert")]
    pub http_tls_key: Option<PathBuf>,
    /// Serve the console API's plain HTTP on a non-loopback address anyway
    /// (e.g. behind a TLS-terminating proxy on a private network): its
    /// bearer tokens then cross that network in clear.
    #[arg(long, env = "EDGELOOP_INSECURE_HTTP")]
    #[serde(default)]
    pub insecure_http: bool,
    /// Extra DNS names or IPs for the gRPC server certificate (repeatable;
    /// comma-separated in the env var). localhost and loopback are always in.
    #[arg(
        long = "server-name",
        env = "EDGELOOP_SERVER_NAMES",
        value_delimiter = ','
    )]
    #[serde(default)]
    pub server_names: Option<Vec<String>>,
    /// Seconds between agent heartbeats; a member is offline after three missed.
    #[arg(long, env = "EDGELOOP_HEARTBEAT_INTERVAL_SECS")]
    pub heartbeat_interval_secs: Option<u32>,
    /// Largest artifact accepted, in bytes.
    #[arg(long, env = "EDGELOOP_MAX_ARTIFACT_BYTES")]
    pub max_artifact_bytes: Option<u64>,
    /// Largest JSON request body accepted, in bytes.
    #[arg(long, env = "EDGELOOP_MAX_JSON_BYTES")]
    pub max_json_bytes: Option<usize>,
    /// Lifetime of issued client certificates, in days.
    #[arg(long, env = "EDGELOOP_CERT_LIFETIME_DAYS")]
    pub cert_lifetime_days: Option<u32>,
    /// Seconds to let in-flight requests finish after SIGTERM.
    #[arg(long, env = "EDGELOOP_DRAIN_TIMEOUT_SECS")]
    pub drain_timeout_secs: Option<u64>,
    /// Seconds a job lease lasts without a progress report; after that the
    /// job goes to another bridge, which resumes it from its last checkpoint.
    #[arg(long, env = "EDGELOOP_JOB_LEASE_SECS")]
    pub job_lease_secs: Option<u32>,
    /// Milliseconds between rollout controller ticks (default 1000).
    #[arg(long, env = "EDGELOOP_ROLLOUT_TICK_MS")]
    pub rollout_tick_ms: Option<u64>,
    /// MiB of artifacts kept in memory for device downloads (default 256;
    /// 0 turns the cache off).
    #[arg(long, env = "EDGELOOP_ARTIFACT_CACHE_MIB")]
    pub artifact_cache_mib: Option<u64>,
    /// Samples (hard examples, feedback) kept per model; past it the
    /// oldest are dropped, and counted (default 100000).
    #[arg(long, env = "EDGELOOP_MAX_SAMPLES_PER_MODEL")]
    pub max_samples_per_model: Option<u64>,
    /// Artifact downloads (devices and bridges) sending at once; the rest
    /// wait their turn (default 64).
    #[arg(long, env = "EDGELOOP_MAX_CONCURRENT_DOWNLOADS")]
    pub max_concurrent_downloads: Option<usize>,
    /// Artifact downloads one device or bridge may have open at once; more
    /// get RESOURCE_EXHAUSTED (default 4).
    #[arg(long, env = "EDGELOOP_MAX_DOWNLOADS_PER_MEMBER")]
    pub max_downloads_per_member: Option<usize>,
    /// A download whose reader takes no chunk for this long ends with
    /// DEADLINE_EXCEEDED and gives its turn back (default 60 s).
    #[arg(long, env = "EDGELOOP_DOWNLOAD_SEND_TIMEOUT_SECS")]
    pub download_send_timeout_secs: Option<u64>,
    /// The artifact bytes a second this replica's downloads send together,
    /// shared turn by turn (default: no cap). A rollout otherwise sends as
    /// fast as the cores encrypt, and heartbeats queue behind it.
    #[arg(long, env = "EDGELOOP_MAX_DOWNLOAD_BYTES_PER_SEC")]
    pub max_download_bytes_per_sec: Option<u64>,
    /// Sketches each device may send per model per hour; past it they are
    /// refused and counted (default 3600).
    #[arg(long, env = "EDGELOOP_DEVICE_SKETCHES_PER_MODEL_PER_HOUR")]
    pub device_sketches_per_model_per_hour: Option<u32>,
    /// Samples (hard examples, feedback) each device may send per model
    /// per hour (default 36000).
    #[arg(long, env = "EDGELOOP_DEVICE_SAMPLES_PER_MODEL_PER_HOUR")]
    pub device_samples_per_model_per_hour: Option<u32>,
    /// Telemetry each device may send per hour, in MiB (16 to 4095;
    /// default 1024); a report past it gets RESOURCE_EXHAUSTED and is
    /// retried by the agent later.
    #[arg(long, env = "EDGELOOP_DEVICE_TELEMETRY_MIB_PER_HOUR")]
    pub device_telemetry_mib_per_hour: Option<u32>,
    /// Days the audit log keeps an entry (default 400).
    #[arg(long, env = "EDGELOOP_AUDIT_RETENTION_DAYS")]
    pub audit_retention_days: Option<u32>,
    /// Entries the audit log keeps at most; past it the oldest go
    /// (default 1000000).
    #[arg(long, env = "EDGELOOP_AUDIT_MAX_ENTRIES")]
    pub audit_max_entries: Option<u64>,
    /// Days telemetry reports are kept (default 30; a device's newest always).
    #[arg(long, env = "EDGELOOP_RETENTION_TELEMETRY_DAYS")]
    pub retention_telemetry_days: Option<u32>,
    /// Days drift sketches are kept (default 90).
    #[arg(long, env = "EDGELOOP_RETENTION_SKETCH_DAYS")]
    pub retention_sketch_days: Option<u32>,
    /// Days a bootstrap token is kept once used or expired (default 30).
    #[arg(long, env = "EDGELOOP_RETENTION_TOKEN_DAYS")]
    pub retention_token_days: Option<u32>,
    /// Days an interrupted checkpoint upload nobody writes to is kept
    /// (default 7).
    #[arg(long, env = "EDGELOOP_RETENTION_PARTIAL_UPLOAD_DAYS")]
    pub retention_partial_upload_days: Option<u32>,
    /// Days a finished training job is kept, with its progress history and
    /// checkpoints, unless a model version or an unfinished pipeline names
    /// it (default 90).
    #[arg(long, env = "EDGELOOP_RETENTION_JOB_DAYS")]
    pub retention_job_days: Option<u32>,
    /// Days an ended retraining pipeline, deployment (with its event log)
    /// or device benchmark is kept, except a model's newest pipeline, its
    /// serving and newest deployments, and what an unfinished pipeline
    /// names (default 180).
    #[arg(long, env = "EDGELOOP_RETENTION_HISTORY_DAYS")]
    pub retention_history_days: Option<u32>,
    /// Hours an artifact no record references is kept after it was last
    /// uploaded, before garbage collection deletes it (1 to 8760; default
    /// 24): register what you upload within it.
    #[arg(long, env = "EDGELOOP_RETENTION_ARTIFACT_GRACE_HOURS")]
    pub retention_artifact_grace_hours: Option<u32>,
    /// Prices for the cost report; `[cost]` in the file.
    #[command(flatten)]
    #[serde(default)]
    pub cost: CostSettings,
}

/// Prices and hardware for `GET /api/v1/models/{name}/cost`, in US
/// dollars. Each unset one keeps its default (`fleet::cost::Prices`;
/// sources and dates in `docs/cost.md`).
#[derive(Debug, Clone, Default, clap::Args, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct CostSettings {
    /// One cloud instance an hour, on demand (default 0.085: EC2 c6i.large).
    #[arg(
        long = "cost-cloud-instance-hourly-usd",
        env = "EDGELOOP_COST_CLOUD_INSTANCE_HOURLY_USD"
    )]
    pub cloud_instance_hourly_usd: Option<f64>,
    /// Requests one cloud instance serves at once (default 2, its vCPUs).
    #[arg(
        long = "cost-cloud-instance-concurrency",
        env = "EDGELOOP_COST_CLOUD_INSTANCE_CONCURRENCY"
    )]
    pub cloud_instance_concurrency: Option<u32>,
    /// Busy share instances are sized for at the peak hour (default 0.6).
    #[arg(
        long = "cost-cloud-target-utilization",
        env = "EDGELOOP_COST_CLOUD_TARGET_UTILIZATION"
    )]
    pub cloud_target_utilization: Option<f64>,
    /// How many times faster a request runs in the cloud than measured on
    /// the devices (default 1).
    #[arg(long = "cost-cloud-speedup", env = "EDGELOOP_COST_CLOUD_SPEEDUP")]
    pub cloud_speedup: Option<f64>,
    /// Serverless price per million requests (default 0.20: AWS Lambda).
    #[arg(
        long = "cost-serverless-per-million-requests-usd",
        env = "EDGELOOP_COST_SERVERLESS_PER_MILLION_REQUESTS_USD"
    )]
    pub serverless_per_million_requests_usd: Option<f64>,
    /// Serverless price per GB-second (default 0.0000166667: AWS Lambda x86).
    #[arg(
        long = "cost-serverless-gb-second-usd",
        env = "EDGELOOP_COST_SERVERLESS_GB_SECOND_USD"
    )]
    pub serverless_gb_second_usd: Option<f64>,
    /// Memory of the serverless function in GB (default 2).
    #[arg(
        long = "cost-serverless-memory-gb",
        env = "EDGELOOP_COST_SERVERLESS_MEMORY_GB"
    )]
    pub serverless_memory_gb: Option<f64>,
    /// An edge device's draw when idle, in watts (default 3: Raspberry Pi 5).
    #[arg(long = "cost-edge-idle-watts", env = "EDGELOOP_COST_EDGE_IDLE_WATTS")]
    pub edge_idle_watts: Option<f64>,
    /// An edge device's draw when fully busy, in watts (default 7).
    #[arg(long = "cost-edge-busy-watts", env = "EDGELOOP_COST_EDGE_BUSY_WATTS")]
    pub edge_busy_watts: Option<f64>,
    /// Electricity per kWh (default 0.13: US commercial average, 2024).
    #[arg(
        long = "cost-electricity-usd-per-kwh",
        env = "EDGELOOP_COST_ELECTRICITY_USD_PER_KWH"
    )]
    pub electricity_usd_per_kwh: Option<f64>,
    /// An edge device's price (default 80: Raspberry Pi 5 8 GB).
    #[arg(
        long = "cost-edge-hardware-usd",
        env = "EDGELOOP_COST_EDGE_HARDWARE_USD"
    )]
    pub edge_hardware_usd: Option<f64>,
    /// Months the edge hardware is spread over (default 36).
    #[arg(
        long = "cost-edge-amortization-months",
        env = "EDGELOOP_COST_EDGE_AMORTIZATION_MONTHS"
    )]
    pub edge_amortization_months: Option<u32>,
}

impl CostSettings {
    pub fn or(self, lower: CostSettings) -> CostSettings {
        CostSettings {
            cloud_instance_hourly_usd: self
                .cloud_instance_hourly_usd
                .or(lower.cloud_instance_hourly_usd),
            cloud_instance_concurrency: self
                .cloud_instance_concurrency
                .or(lower.cloud_instance_concurrency),
            cloud_target_utilization: self
                .cloud_target_utilization
                .or(lower.cloud_target_utilization),
            cloud_speedup: self.cloud_speedup.or(lower.cloud_speedup),
            serverless_per_million_requests_usd: self
                .serverless_per_million_requests_usd
                .or(lower.serverless_per_million_requests_usd),
            serverless_gb_second_usd: self
                .serverless_gb_second_usd
                .or(lower.serverless_gb_second_usd),
            serverless_memory_gb: self.serverless_memory_gb.or(lower.serverless_memory_gb),
            edge_idle_watts: self.edge_idle_watts.or(lower.edge_idle_watts),
            edge_busy_watts: self.edge_busy_watts.or(lower.edge_busy_watts),
            electricity_usd_per_kwh: self
                .electricity_usd_per_kwh
                .or(lower.electricity_usd_per_kwh),
            edge_hardware_usd: self.edge_hardware_usd.or(lower.edge_hardware_usd),
            edge_amortization_months: self
                .edge_amortization_months
                .or(lower.edge_amortization_months),
        }
    }

    /// The prices, defaults filled in, checked.
    pub fn prices(&self) -> anyhow::Result<Prices> {
        let d = Prices::default();
        let p = Prices {
            cloud_instance_hourly_usd: self
                .cloud_instance_hourly_usd
                .unwrap_or(d.cloud_instance_hourly_usd),
            cloud_instance_concurrency: self
                .cloud_instance_concurrency
                .unwrap_or(d.cloud_instance_concurrency),
            cloud_target_utilization: self
                .cloud_target_utilization
                .unwrap_or(d.cloud_target_utilization),
            cloud_speedup: self.cloud_speedup.unwrap_or(d.cloud_speedup),
            serverless_per_million_requests_usd: self
                .serverless_per_million_requests_usd
                .unwrap_or(d.serverless_per_million_requests_usd),
            serverless_gb_second_usd: self
                .serverless_gb_second_usd
                .unwrap_or(d.serverless_gb_second_usd),
            serverless_memory_gb: self.serverless_memory_gb.unwrap_or(d.serverless_memory_gb),
            edge_idle_watts: self.edge_idle_watts.unwrap_or(d.edge_idle_watts),
            edge_busy_watts: self.edge_busy_watts.unwrap_or(d.edge_busy_watts),
            electricity_usd_per_kwh: self
                .electricity_usd_per_kwh
                .unwrap_or(d.electricity_usd_per_kwh),
            edge_hardware_usd: self.edge_hardware_usd.unwrap_or(d.edge_hardware_usd),
            edge_amortization_months: self
                .edge_amortization_months
                .unwrap_or(d.edge_amortization_months),
        };
        p.validate()?;
        Ok(p)
    }
}

impl ServeSettings {
    /// Each field from `self` if set, else from `lower`.
    pub fn or(self, lower: ServeSettings) -> ServeSettings {
        ServeSettings {
            data_dir: self.data_dir.or(lower.data_dir),
            store_url: self.store_url.or(lower.store_url),
            artifact_url: self.artifact_url.or(lower.artifact_url),
            grpc_listen: self.grpc_listen.or(lower.grpc_listen),
            http_listen: self.http_listen.or(lower.http_listen),
            insecure_http: self.insecure_http || lower.insecure_http,
            http_tls: self.http_tls || lower.http_tls,
            http_tls_cert: self.http_tls_cert.or(lower.http_tls_cert),
            http_tls_key: self.http_tls_key.or(lower.http_tls_key),
            server_names: self.server_names.or(lower.server_names),
            heartbeat_interval_secs: self
                .heartbeat_interval_secs
                .or(lower.heartbeat_interval_secs),
            max_artifact_bytes: self.max_artifact_bytes.or(lower.max_artifact_bytes),
            max_json_bytes: self.max_json_bytes.or(lower.max_json_bytes),
            cert_lifetime_days: self.cert_lifetime_days.or(lower.cert_lifetime_days),
            drain_timeout_secs: self.drain_timeout_secs.or(lower.drain_timeout_secs),
            job_lease_secs: self.job_lease_secs.or(lower.job_lease_secs),
            rollout_tick_ms: self.rollout_tick_ms.or(lower.rollout_tick_ms),
            artifact_cache_mib: self.artifact_cache_mib.or(lower.artifact_cache_mib),
            max_samples_per_model: self.max_samples_per_model.or(lower.max_samples_per_model),
            max_concurrent_downloads: self
                .max_concurrent_downloads
                .or(lower.max_concurrent_downloads),
            max_downloads_per_member: self
                .max_downloads_per_member
                .or(lower.max_downloads_per_member),
            download_send_timeout_secs: self
                .download_send_timeout_secs
                .or(lower.download_send_timeout_secs),
            max_download_bytes_per_sec: self
                .max_download_bytes_per_sec
                .or(lower.max_download_bytes_per_sec),
            device_sketches_per_model_per_hour: self
                .device_sketches_per_model_per_hour
                .or(lower.device_sketches_per_model_per_hour),
            device_telemetry_mib_per_hour: self
                .device_telemetry_mib_per_hour
                .or(lower.device_telemetry_mib_per_hour),
            device_samples_per_model_per_hour: self
                .device_samples_per_model_per_hour
                .or(lower.device_samples_per_model_per_hour),
            audit_retention_days: self.audit_retention_days.or(lower.audit_retention_days),
            audit_max_entries: self.audit_max_entries.or(lower.audit_max_entries),
            retention_telemetry_days: self
                .retention_telemetry_days
                .or(lower.retention_telemetry_days),
            retention_sketch_days: self.retention_sketch_days.or(lower.retention_sketch_days),
            retention_token_days: self.retention_token_days.or(lower.retention_token_days),
            retention_partial_upload_days: self
                .retention_partial_upload_days
                .or(lower.retention_partial_upload_days),
            retention_job_days: self.retention_job_days.or(lower.retention_job_days),
            retention_history_days: self.retention_history_days.or(lower.retention_history_days),
            retention_artifact_grace_hours: self
                .retention_artifact_grace_hours
                .or(lower.retention_artifact_grace_hours),
            cost: self.cost.or(lower.cost),
        }
    }

    pub fn from_toml_file(path: &Path) -> anyhow::Result<Self> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading config file {}", path.display()))?;
        toml::from_str(&text).with_context(|| format!("parsing config file {}", path.display()))
    }
}

/// The resolved configuration `run` works from.
#[derive(Debug, Clone)]
pub struct Config {
    pub data_dir: PathBuf,
    /// The PostgreSQL store, when not the embedded one in `data_dir`.
    pub store_url: Option<edgeloop_store::PostgresUrl>,
    /// Artifacts in S3; None: in the data dir.
    pub artifact_url: Option<S3Location>,
    pub grpc_listen: SocketAddr,
    pub http_listen: SocketAddr,
    /// The console API over TLS, and with which certificate.
    pub http_tls: HttpTls,
    pub server_names: Vec<String>,
    pub heartbeat_interval: Duration,
    pub max_artifact_bytes: u64,
    pub max_json_bytes: usize,
    pub cert_lifetime: Duration,
    pub drain_timeout: Duration,
    pub job_lease: Duration,
    pub rollout_tick: Duration,
    pub artifact_cache_bytes: u64,
    pub max_concurrent_downloads: usize,
    pub max_downloads_per_member: usize,
    pub download_send_timeout: Duration,
    /// The downloads' shared byte rate; `None`: no cap.
    pub max_download_bytes_per_sec: Option<u64>,
    /// Samples kept per model (retention).
    pub max_samples_per_model: u64,
    /// What each device may send per model per hour.
    pub device_quota: crate::fleet::admission::Quota,
    /// How long and how much of the audit log is kept.
    pub audit_retention: edgeloop_auth::audit::Retention,
    /// How long telemetry, sketches and spent tokens are kept.
    pub retention: crate::retention::Retention,
    /// Prices for the cost report.
    pub cost: Prices,
}

/// How the console API is served.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HttpTls {
    /// Plain HTTP (loopback, or with --insecure-http).
    Off,
    /// TLS with the control plane's own server certificate.
    ServerCertificate,
    /// TLS with this PEM chain and key.
    Files { cert: PathBuf, key: PathBuf },
}

pub const DEFAULT_GRPC_LISTEN: &str = "127.0.0.1:7443";
pub const DEFAULT_HTTP_LISTEN: &str = "127.0.0.1:7080";

impl Config {
    pub fn from_settings(s: ServeSettings) -> anyhow::Result<Config> {
        let data_dir = s.data_dir.context(
            "--data-dir (or EDGELOOP_DATA_DIR, or data-dir in the config file) is required",
        )?;
        let store_url = s
            .store_url
            .as_deref()
            .map(edgeloop_store::PostgresUrl::parse)
            .transpose()?;
        let artifact_url = s
            .artifact_url
            .as_deref()
            .map(str::parse::<S3Location>)
            .transpose()?;
        let grpc_listen = s
            .grpc_listen
            .unwrap_or_else(|| DEFAULT_GRPC_LISTEN.parse().expect("valid default"));
        let http_listen = s
            .http_listen
            .unwrap_or_else(|| DEFAULT_HTTP_LISTEN.parse().expect("valid default"));
        let http_tls = match (s.http_tls, s.http_tls_cert, s.http_tls_key) {
            (false, None, None) => HttpTls::Off,
            (true, None, None) => HttpTls::ServerCertificate,
            (_, Some(cert), Some(key)) => HttpTls::Files { cert, key },
            _ => anyhow::bail!("http-tls-cert and http-tls-key go together"),
        };
        check_http_bind(http_listen, s.insecure_http || http_tls != HttpTls::Off)?;
        let heartbeat = s.heartbeat_interval_secs.unwrap_or(10);
        anyhow::ensure!(
            (1..=3600).contains(&heartbeat),
            "heartbeat-interval-secs must be 1..=3600"
        );
        let cert_days = s.cert_lifetime_days.unwrap_or(365);
        anyhow::ensure!(
            (1..=3650).contains(&cert_days),
            "cert-lifetime-days must be 1..=3650"
        );
        let lease = s.job_lease_secs.unwrap_or(300);
        // Bridges report about twice a second, so a few seconds is enough
        // for a test; a day is already longer than any bridge outage worth waiting for.
        anyhow::ensure!(
            (2..=86_400).contains(&lease),
            "job-lease-secs must be 2..=86400"
        );
        let tick = s.rollout_tick_ms.unwrap_or(1000);
        anyhow::ensure!(
            (10..=60_000).contains(&tick),
            "rollout-tick-ms must be 10..=60000"
        );
        let max_samples = s.max_samples_per_model.unwrap_or(100_000);
        anyhow::ensure!(
            (1..=100_000_000).contains(&max_samples),
            "max-samples-per-model must be 1..=100000000"
        );
        let cache_mib = s.artifact_cache_mib.unwrap_or(256);
        anyhow::ensure!(
            cache_mib <= 1 << 20,
            "artifact-cache-mib must be at most 1048576"
        );
        let downloads = s.max_concurrent_downloads.unwrap_or(64);
        anyhow::ensure!(
            (1..=100_000).contains(&downloads),
            "max-concurrent-downloads must be 1..=100000"
        );
        let per_member = s.max_downloads_per_member.unwrap_or(4);
        anyhow::ensure!(
            (1..=1024).contains(&per_member),
            "max-downloads-per-member must be 1..=1024"
        );
        let send_timeout = s.download_send_timeout_secs.unwrap_or(60);
        anyhow::ensure!(
            (1..=86_400).contains(&send_timeout),
            "download-send-timeout-secs must be 1..=86400"
        );
        // Below 64 KiB/s one default chunk would take seconds.
        if let Some(rate) = s.max_download_bytes_per_sec {
            anyhow::ensure!(
                rate >= 64 * 1024,
                "max-download-bytes-per-sec must be at least 65536 (64 KiB/s)"
            );
        }
        let cost = s.cost.prices()?;
        let default_audit = edgeloop_auth::audit::Retention::default();
        let audit_days = s
            .audit_retention_days
            .map_or(default_audit.max_age.whole_days(), i64::from);
        anyhow::ensure!(
            (1..=36_500).contains(&audit_days),
            "audit-retention-days must be 1..=36500"
        );
        let audit_max = s.audit_max_entries.unwrap_or(default_audit.max_entries);
        anyhow::ensure!(
            (1..=1_000_000_000).contains(&audit_max),
            "audit-max-entries must be 1..=1000000000"
        );
        let dr = crate::retention::Retention::default();
        let days = |flag: &str, v: Option<u32>, default: time::Duration| {
            let d = v.map_or(default.whole_days(), i64::from);
            anyhow::ensure!((1..=36_500).contains(&d), "{flag} must be 1..=36500");
            Ok(time::Duration::days(d))
        };
        let retention = crate::retention::Retention {
            telemetry: days(
                "retention-telemetry-days",
                s.retention_telemetry_days,
                dr.telemetry,
            )?,
            sketches: days(
                "retention-sketch-days",
                s.retention_sketch_days,
                dr.sketches,
            )?,
            tokens: days("retention-token-days", s.retention_token_days, dr.tokens)?,
            partial_uploads: days(
                "retention-partial-upload-days",
                s.retention_partial_upload_days,
                dr.partial_uploads,
            )?,
            jobs: days("retention-job-days", s.retention_job_days, dr.jobs)?,
            history: days(
                "retention-history-days",
                s.retention_history_days,
                dr.history,
            )?,
            artifact_grace: {
                let h = s
                    .retention_artifact_grace_hours
                    .map_or(dr.artifact_grace.whole_hours(), i64::from);
                anyhow::ensure!(
                    (1..=8760).contains(&h),
                    "retention-artifact-grace-hours must be 1..=8760"
                );
                time::Duration::hours(h)
            },
        };
        let dq = crate::fleet::admission::Quota::default();
        let device_quota = crate::fleet::admission::Quota {
            sketches_per_hour: s
                .device_sketches_per_model_per_hour
                .unwrap_or(dq.sketches_per_hour),
            samples_per_hour: s
                .device_samples_per_model_per_hour
                .unwrap_or(dq.samples_per_hour),
            telemetry_bytes_per_hour: match s.device_telemetry_mib_per_hour {
                None => dq.telemetry_bytes_per_hour,
                Some(mib) => {
                    anyhow::ensure!(
                        (16..=4095).contains(&mib),
                        "device-telemetry-mib-per-hour must be 16..=4095 (a report may be 8 MiB)"
                    );
                    mib << 20
                }
            },
        };
        anyhow::ensure!(
            device_quota.sketches_per_hour >= 1 && device_quota.samples_per_hour >= 1,
            "device-sketches-per-model-per-hour and device-samples-per-model-per-hour must be at least 1"
        );
        let mut names = vec![
            "localhost".to_string(),
            "127.0.0.1".to_string(),
            "::1".to_string(),
        ];
        if !grpc_listen.ip().is_unspecified() {
            names.push(grpc_listen.ip().to_string());
        }
        for name in s.server_names.unwrap_or_default() {
            let name = name.trim().to_string();
            if name.is_empty() {
                continue;
            }
            let valid = name.parse::<IpAddr>().is_ok()
                || (name.len() <= 253
                    && name.split('.').all(|l| {
                        !l.is_empty()
                            && l.len() <= 63
                            && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
                    }));
            anyhow::ensure!(
                valid,
                "server name {name:?} is neither an IP address nor a DNS name"
            );
            names.push(name);
        }
        Ok(Config {
            data_dir,
            store_url,
            artifact_url,
            grpc_listen,
            http_listen,
            http_tls,
            server_names: names,
            heartbeat_interval: Duration::from_secs(heartbeat.into()),
            max_artifact_bytes: s.max_artifact_bytes.unwrap_or(4 << 30),
            max_json_bytes: s.max_json_bytes.unwrap_or(1 << 20),
            cert_lifetime: Duration::from_secs(u64::from(cert_days) * 86_400),
            drain_timeout: Duration::from_secs(s.drain_timeout_secs.unwrap_or(30)),
            job_lease: Duration::from_secs(lease.into()),
            rollout_tick: Duration::from_millis(tick),
            artifact_cache_bytes: cache_mib << 20,
            max_samples_per_model: max_samples,
            max_concurrent_downloads: downloads,
            max_downloads_per_member: per_member,
            download_send_timeout: Duration::from_secs(send_timeout),
            max_download_bytes_per_sec: s.max_download_bytes_per_sec,
            device_quota,
            audit_retention: edgeloop_auth::audit::Retention {
                max_age: time::Duration::days(audit_days),
                max_entries: audit_max,
            },
            retention,
            cost,
        })
    }

    /// A member is offline after missing three heartbeats.
    pub fn offline_after(&self) -> Duration {
        self.heartbeat_interval * 3
    }
}

/// Every console call carries a bearer token: over plain HTTP off
/// loopback it crosses the network in clear, so such a bind is refused
/// unless it is TLS or the operator says so (`allowed`).
fn check_http_bind(addr: SocketAddr, allowed: bool) -> anyhow::Result<()> {
    anyhow::ensure!(
        addr.ip().is_loopback() || allowed,
        "--http-listen {addr} is not a loopback address: the console API is plain HTTP, so its \
         bearer tokens would cross the network in clear. Serve it over TLS with --http-tls, bind \
         127.0.0.1 (behind a TLS-terminating proxy for remote use), or pass --insecure-http \
         (EDGELOOP_INSECURE_HTTP=true, insecure-http = true in the file) to accept that"
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plain_http_bind_off_loopback_needs_insecure_http() {
        let settings = |addr: &str, insecure: bool| ServeSettings {
            data_dir: Some("/d".into()),
            http_listen: Some(addr.parse().unwrap()),
            insecure_http: insecure,
            ..Default::default()
        };
        for addr in ["127.0.0.1:7080", "127.0.0.2:7080", "[::1]:7080"] {
            assert!(
                Config::from_settings(settings(addr, false)).is_ok(),
                "{addr}"
            );
        }
        for addr in ["0.0.0.0:7080", "[::]:7080", "10.0.0.5:7080"] {
            let e = Config::from_settings(settings(addr, false)).unwrap_err();
            assert!(e.to_string().contains("--insecure-http"), "{addr}: {e}");
            assert!(
                Config::from_settings(settings(addr, true)).is_ok(),
                "{addr}"
            );
            let tls = ServeSettings {
                http_tls: true,
                ..settings(addr, false)
            };
            assert_eq!(
                Config::from_settings(tls).unwrap().http_tls,
                HttpTls::ServerCertificate,
                "{addr}: TLS needs no --insecure-http"
            );
        }
        // From the file too, and a flag cannot take it back (flags only add).
        let file: ServeSettings = toml::from_str(
            "data-dir = \"/d\"\nhttp-listen = \"0.0.0.0:7080\"\ninsecure-http = true\n",
        )
        .unwrap();
        assert!(Config::from_settings(ServeSettings::default().or(file)).is_ok());
    }

    #[test]
    fn precedence_flag_over_file_over_default() {
        let file: ServeSettings = toml::from_str(
            "data-dir = \"/from/file\"\nhttp-listen = \"127.0.0.1:9000\"\nheartbeat-interval-secs = 5\n",
        )
        .unwrap();
        let flags = ServeSettings {
            data_dir: Some("/from/flag".into()),
            ..Default::default()
        };
        let cfg = Config::from_settings(flags.or(file)).unwrap();
        assert_eq!(cfg.data_dir, PathBuf::from("/from/flag"));
        assert_eq!(cfg.http_listen, "127.0.0.1:9000".parse().unwrap());
        assert_eq!(cfg.heartbeat_interval, Duration::from_secs(5));
        assert_eq!(cfg.grpc_listen, DEFAULT_GRPC_LISTEN.parse().unwrap());
        assert!(
            cfg.store_url.is_none(),
            "sled under the data dir by default"
        );
    }

    #[test]
    fn the_store_url_comes_from_the_file_or_a_flag_and_is_checked() {
        let file: ServeSettings =
            toml::from_str("data-dir = \"/d\"\nstore-url = \"postgres://u:pw@db:5432/edge\"\n")
                .unwrap();
        let cfg = Config::from_settings(ServeSettings::default().or(file.clone())).unwrap();
        assert!(
            !format!("{cfg:?}").contains("pw"),
            "no password in the config's Debug"
        );
        assert_eq!(
            cfg.store_url.unwrap().to_string(),
            "postgres://db:5432/edge"
        );
        let flags = ServeSettings {
            store_url: Some("postgres://u:pw@other/edge".into()),
            ..Default::default()
        };
        let cfg = Config::from_settings(flags.or(file)).unwrap();
        assert_eq!(
            cfg.store_url.unwrap().to_string(),
            "postgres://other:5432/edge"
        );
        for bad in ["/var/lib/edgeloop", "postgres://h/db?sslmode=require"] {
            let s = ServeSettings {
                data_dir: Some("/d".into()),
                store_url: Some(bad.into()),
                ..Default::default()
            };
            let e = Config::from_settings(s).unwrap_err();
            assert!(e.to_string().contains("--store-url"), "{bad}: {e}");
        }
    }

    #[test]
    fn refusals() {
        assert!(toml::from_str::<ServeSettings>("no-such-key = 1").is_err());
        assert!(
            Config::from_settings(ServeSettings::default()).is_err(),
            "data dir required"
        );
        let bad_name = ServeSettings {
            data_dir: Some("/d".into()),
            server_names: Some(vec!["bad name!".into()]),
            ..Default::default()
        };
        assert!(Config::from_settings(bad_name).is_err());
        let bad_hb = ServeSettings {
            data_dir: Some("/d".into()),
            heartbeat_interval_secs: Some(0),
            ..Default::default()
        };
        assert!(Config::from_settings(bad_hb).is_err());
    }

    #[test]
    fn artifact_url_from_flag_env_or_file_checked_naming_the_part() {
        let file: ServeSettings =
            toml::from_str("data-dir = \"/d\"\nartifact-url = \"s3://from-file/p\"\n").unwrap();
        let cfg = Config::from_settings(ServeSettings::default().or(file.clone())).unwrap();
        let loc = cfg.artifact_url.unwrap();
        assert_eq!(
            (loc.bucket.as_str(), loc.prefix.as_str()),
            ("from-file", "p")
        );
        let flags = ServeSettings {
            artifact_url: Some("s3://from-flag".into()),
            ..Default::default()
        };
        let cfg = Config::from_settings(flags.or(file)).unwrap();
        assert_eq!(cfg.artifact_url.unwrap().bucket, "from-flag");
        let local = ServeSettings {
            data_dir: Some("/d".into()),
            ..Default::default()
        };
        assert_eq!(Config::from_settings(local).unwrap().artifact_url, None);
        for (url, part) in [
            ("https://bucket/p", "scheme"),
            ("s3://No_Such", "bucket"),
            ("s3://bucket/a/../b", "prefix"),
        ] {
            let bad = ServeSettings {
                data_dir: Some("/d".into()),
                artifact_url: Some(url.into()),
                ..Default::default()
            };
            let e = Config::from_settings(bad).unwrap_err().to_string();
            assert!(
                e.starts_with(&format!("artifact-url: {part}")),
                "{url}: {e}"
            );
        }
    }

    #[test]
    fn cost_prices_from_the_file_section_with_flags_over_it() {
        let file: ServeSettings = toml::from_str(
            "data-dir = \"/d\"\n[cost]\nelectricity-usd-per-kwh = 0.3\nedge-hardware-usd = 250.0\n",
        )
        .unwrap();
        let flags = ServeSettings {
            cost: CostSettings {
                edge_hardware_usd: Some(500.0),
                ..Default::default()
            },
            ..Default::default()
        };
        let cfg = Config::from_settings(flags.or(file)).unwrap();
        assert_eq!(cfg.cost.electricity_usd_per_kwh, 0.3);
        assert_eq!(cfg.cost.edge_hardware_usd, 500.0);
        assert_eq!(
            cfg.cost.cloud_instance_hourly_usd,
            Prices::default().cloud_instance_hourly_usd
        );
        assert!(toml::from_str::<ServeSettings>("[cost]\nno-such-price = 1").is_err());
        let bad = ServeSettings {
            data_dir: Some("/d".into()),
            cost: CostSettings {
                edge_idle_watts: Some(-1.0),
                ..Default::default()
            },
            ..Default::default()
        };
        let err = Config::from_settings(bad).unwrap_err().to_string();
        assert!(err.contains("cost.edge-idle-watts"), "{err}");
    }
}
