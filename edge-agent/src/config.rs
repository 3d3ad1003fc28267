//! The agent's settings: flags > `EDGELOOP_*` env vars > a TOML file
//! (kebab-case keys), resolved once into [`AgentConfig`].

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use edgeloop_client_core::{MemberConfig, MemberSettings};
use edgeloop_models::manifest::PublicKey;
use serde::Deserialize;

#[derive(Debug, Clone, Default, clap::Args, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct AgentSettings {
    /// Local state: identity (key 0600), model slots, telemetry buffer.
    #[arg(long, env = "EDGELOOP_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
    /// gRPC URL of the control plane, e.g. https://cp.example:7443
    #[arg(long, env = "EDGELOOP_CONTROL_PLANE")]
    pub control_plane: Option<String>,
    /// One-time bootstrap token; needed only for the first start.
    #[arg(long, env = "EDGELOOP_BOOTSTRAP_TOKEN")]
    pub bootstrap_token: Option<String>,

    /// Where the Open Inference Protocol v2 REST API listens.
    #[arg(long, env = "EDGELOOP_INFERENCE_LISTEN")]
    pub inference_listen: Option<SocketAddr>,
    /// Where the Open Inference Protocol v2 gRPC service
    /// (`inference.GRPCInferenceService`) listens.
    #[arg(long, env = "EDGELOOP_GRPC_INFERENCE_LISTEN")]
    pub grpc_inference_listen: Option<SocketAddr>,
    /// The ONNX Runtime library (else `ORT_DYLIB_PATH`, else the default
    /// location `scripts/fetch-onnxruntime.sh` fills).
    #[arg(long, env = "EDGELOOP_ORT_LIBRARY")]
    pub ort_library: Option<PathBuf>,
    /// Execution providers in priority order: `tensorrt`, `cuda`, `cpu`
    /// (comma separated). Unavailable GPU providers fall back to the CPU with a warning.
    #[arg(long, env = "EDGELOOP_PROVIDERS", value_delimiter = ',')]
    pub providers: Option<Vec<String>>,
    /// CUDA memory arena limit per session, in MiB.
    #[arg(long, env = "EDGELOOP_CUDA_MEM_LIMIT_MB")]
    pub cuda_mem_limit_mb: Option<u64>,
    /// Let TensorRT build fp16 kernels (faster, within fp16's precision).
    #[arg(long, env = "EDGELOOP_TRT_FP16")]
    pub trt_fp16: Option<bool>,
    /// Session workers per model (ort's `Session::run` takes `&mut self`).
    #[arg(long, env = "EDGELOOP_WORKERS_PER_MODEL")]
    pub workers_per_model: Option<usize>,
    /// Largest batch the dynamic batcher forms (1 turns batching off).
    #[arg(long, env = "EDGELOOP_MAX_BATCH_SIZE")]
    pub max_batch_size: Option<usize>,
    /// Longest a request waits for others to batch with, in microseconds.
    #[arg(long, env = "EDGELOOP_MAX_QUEUE_DELAY_US")]
    pub max_queue_delay_us: Option<u64>,
    /// Requests queued per model before new ones get 503 + Retry-After
    /// (gRPC: RESOURCE_EXHAUSTED).
    #[arg(long, env = "EDGELOOP_QUEUE_CAPACITY")]
    pub queue_capacity: Option<usize>,
    /// Largest inference request body (HTTP) or message (gRPC), in bytes.
    #[arg(long, env = "EDGELOOP_MAX_REQUEST_BYTES")]
    pub max_request_bytes: Option<usize>,
    /// Model downloads running at once.
    #[arg(long, env = "EDGELOOP_DOWNLOAD_CONCURRENCY")]
    pub download_concurrency: Option<usize>,
    /// Ed25519 public keys (64 hex characters each, comma separated) whose
    /// manifest signatures this device accepts.
    #[arg(long, env = "EDGELOOP_TRUSTED_KEYS", value_delimiter = ',')]
    pub trusted_keys: Option<Vec<String>>,
    /// Accept model versions without a signed manifest (development only).
    #[arg(long, env = "EDGELOOP_ALLOW_UNSIGNED")]
    pub allow_unsigned: Option<bool>,
    /// Seconds between telemetry batches.
    #[arg(long, env = "EDGELOOP_TELEMETRY_INTERVAL_SECS")]
    pub telemetry_interval_secs: Option<u64>,
    /// Telemetry batches kept while offline; past this the oldest are dropped (and counted).
    #[arg(long, env = "EDGELOOP_TELEMETRY_MAX_BATCHES")]
    pub telemetry_max_batches: Option<u64>,
    /// A file holding the bearer token the inference and feedback APIs
    /// require (REST `Authorization: Bearer`, gRPC `authorization`
    /// metadata); health routes stay open. Without it the APIs are open,
    /// and may listen only on loopback unless --insecure-api.
    #[arg(long, env = "EDGELOOP_API_TOKEN_FILE")]
    pub api_token_file: Option<PathBuf>,
    /// Let the inference APIs listen off loopback without a token or
    /// client certificates: anyone who reaches the port may then run the
    /// models and send labels.
    #[arg(long, env = "EDGELOOP_INSECURE_API")]
    pub insecure_api: Option<bool>,
    /// Serve the inference APIs (REST and gRPC) over TLS with this PEM
    /// certificate chain, leaf first (with --api-tls-key).
    #[arg(long, env = "EDGELOOP_API_TLS_CERT", requires = "api_tls_key")]
    pub api_tls_cert: Option<PathBuf>,
    /// The private key (PEM) of --api-tls-cert.
    #[arg(long, env = "EDGELOOP_API_TLS_KEY", requires = "api_tls_cert")]
    pub api_tls_key: Option<PathBuf>,
    /// mTLS: CA certificates (PEM); a caller whose client certificate
    /// chains to one of them may call the APIs without the bearer token (an
    /// alternative to --api-token-file, or beside it). Needs --api-tls-cert.
    #[arg(long, env = "EDGELOOP_API_CLIENT_CA")]
    pub api_client_ca: Option<PathBuf>,
    /// Feedback labels accepted per model per minute (default 6000); past
    /// it, 429.
    #[arg(long, env = "EDGELOOP_FEEDBACK_LABELS_PER_MINUTE")]
    pub feedback_labels_per_minute: Option<u32>,
}

impl AgentSettings {
    /// Each field from `self` if set, else from `lower`.
    pub fn or(self, lower: AgentSettings) -> AgentSettings {
        AgentSettings {
            data_dir: self.data_dir.or(lower.data_dir),
            control_plane: self.control_plane.or(lower.control_plane),
            bootstrap_token: self.bootstrap_token.or(lower.bootstrap_token),
            inference_listen: self.inference_listen.or(lower.inference_listen),
            grpc_inference_listen: self.grpc_inference_listen.or(lower.grpc_inference_listen),
            ort_library: self.ort_library.or(lower.ort_library),
            providers: self.providers.or(lower.providers),
            cuda_mem_limit_mb: self.cuda_mem_limit_mb.or(lower.cuda_mem_limit_mb),
            trt_fp16: self.trt_fp16.or(lower.trt_fp16),
            workers_per_model: self.workers_per_model.or(lower.workers_per_model),
            max_batch_size: self.max_batch_size.or(lower.max_batch_size),
            max_queue_delay_us: self.max_queue_delay_us.or(lower.max_queue_delay_us),
            queue_capacity: self.queue_capacity.or(lower.queue_capacity),
            max_request_bytes: self.max_request_bytes.or(lower.max_request_bytes),
            download_concurrency: self.download_concurrency.or(lower.download_concurrency),
            trusted_keys: self.trusted_keys.or(lower.trusted_keys),
            allow_unsigned: self.allow_unsigned.or(lower.allow_unsigned),
            telemetry_interval_secs: self
                .telemetry_interval_secs
                .or(lower.telemetry_interval_secs),
            telemetry_max_batches: self.telemetry_max_batches.or(lower.telemetry_max_batches),
            api_token_file: self.api_token_file.or(lower.api_token_file),
            insecure_api: self.insecure_api.or(lower.insecure_api),
            api_tls_cert: self.api_tls_cert.or(lower.api_tls_cert),
            api_tls_key: self.api_tls_key.or(lower.api_tls_key),
            api_client_ca: self.api_client_ca.or(lower.api_client_ca),
            feedback_labels_per_minute: self
                .feedback_labels_per_minute
                .or(lower.feedback_labels_per_minute),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Provider {
    TensorRt,
    Cuda,
    Cpu,
}

/// How inference is served.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    /// The REST API.
    pub listen: SocketAddr,
    /// The gRPC service.
    pub grpc_listen: SocketAddr,
    pub ort_library: Option<PathBuf>,
    pub providers: Vec<Provider>,
    pub cuda_mem_limit_bytes: Option<usize>,
    /// TensorRT: where built engines are kept between loads and restarts
    /// (`<data dir>/trt-cache`; see `serve::loader::trt_cache_dir`).
    pub trt_cache: Option<PathBuf>,
    pub trt_fp16: bool,
    pub workers_per_model: usize,
    pub max_batch_size: usize,
    pub max_queue_delay: Duration,
    pub queue_capacity: usize,
    pub max_request_bytes: usize,
}

/// How models are synced.
#[derive(Debug, Clone)]
pub struct SyncConfig {
    pub download_concurrency: usize,
    pub trusted_keys: Vec<PublicKey>,
    pub allow_unsigned: bool,
}

#[derive(Debug, Clone)]
pub struct TelemetryConfig {
    pub interval: Duration,
    pub max_batches: u64,
}

/// Who may call the device's inference and feedback APIs: anyone when
/// neither a token nor client CAs are set; else a caller with the token,
/// or (mTLS) with a client certificate from those CAs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiAccess {
    /// sha256 of the bearer token that admits a caller.
    pub token_hash: Option<edgeloop_models::Digest>,
    /// TLS on both APIs (`None`: plain TCP); with client CAs, a verified
    /// client certificate admits a caller (mTLS).
    pub tls: Option<ApiTls>,
    /// Feedback labels per model per minute.
    pub feedback_labels_per_minute: u32,
}

/// TLS on the inference APIs: the server's identity, and the CAs whose
/// client certificates admit a caller (mTLS). Read once, at start.
#[derive(Clone, PartialEq, Eq)]
pub struct ApiTls {
    pub cert_pem: Vec<u8>,
    pub key_pem: Vec<u8>,
    pub client_ca_pem: Option<Vec<u8>>,
}

impl std::fmt::Debug for ApiTls {
    // The key stays out of logs.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiTls")
            .field("client_ca", &self.client_ca_pem.is_some())
            .finish_non_exhaustive()
    }
}

impl ApiAccess {
    /// Whether a verified client certificate admits a caller.
    pub fn mtls(&self) -> bool {
        self.tls.as_ref().is_some_and(|t| t.client_ca_pem.is_some())
    }

    /// Whether calls need a credential at all.
    pub fn is_open(&self) -> bool {
        self.token_hash.is_none() && !self.mtls()
    }
}

#[derive(Debug, Clone)]
pub struct AgentConfig {
    pub member: MemberConfig,
    pub serve: ServeConfig,
    pub sync: SyncConfig,
    pub telemetry: TelemetryConfig,
    pub api: ApiAccess,
}

pub const DEFAULT_INFERENCE_LISTEN: &str = "127.0.0.1:8000";
/// Triton's gRPC port beside its HTTP one, so clients' defaults find it.
pub const DEFAULT_GRPC_INFERENCE_LISTEN: &str = "127.0.0.1:8001";

fn parse_provider(s: &str) -> anyhow::Result<Provider> {
    match s.trim().to_ascii_lowercase().as_str() {
        "tensorrt" | "trt" if cfg!(feature = "tensorrt") => Ok(Provider::TensorRt),
        "cuda" if cfg!(feature = "cuda") => Ok(Provider::Cuda),
        p @ ("tensorrt" | "trt" | "cuda") => {
            anyhow::bail!("providers: this agent was built without the {p:?} cargo feature")
        }
        "cpu" => Ok(Provider::Cpu),
        other => anyhow::bail!(
            "providers: unknown execution provider {other:?}; expected tensorrt, cuda or cpu"
        ),
    }
}

/// Open inference APIs run the device's models and take labels that reach
/// training: off loopback they need a token, or the operator's explicit
/// --insecure-api.
fn check_api_bind(
    api: &ApiAccess,
    insecure_api: bool,
    addrs: [SocketAddr; 2],
) -> anyhow::Result<()> {
    for addr in addrs {
        anyhow::ensure!(
            addr.ip().is_loopback() || !api.is_open() || insecure_api,
            "{addr} is not a loopback address, and the inference API has no token or client \
             CA: anyone who reaches it could run the models and send labels that reach \
             training. Give --api-token-file or --api-client-ca (mTLS), or pass --insecure-api \
             to accept that"
        );
    }
    Ok(())
}

fn in_range<T: PartialOrd + std::fmt::Display + Copy>(
    field: &str,
    v: T,
    lo: T,
    hi: T,
) -> anyhow::Result<T> {
    anyhow::ensure!(v >= lo && v <= hi, "{field} must be {lo}..={hi}, got {v}");
    Ok(v)
}

impl AgentConfig {
    /// The defaults around a member identity (what tests and embedders
    /// start from): inference (REST and gRPC) on ephemeral loopback ports,
    /// CPU only.
    pub fn new(member: MemberConfig, trusted_keys: Vec<PublicKey>) -> AgentConfig {
        let mut c = AgentConfig::from_settings(AgentSettings {
            data_dir: Some(member.data_dir.clone()),
            control_plane: Some(member.control_plane.clone()),
            allow_unsigned: Some(true),
            inference_listen: Some(SocketAddr::from(([127, 0, 0, 1], 0))),
            grpc_inference_listen: Some(SocketAddr::from(([127, 0, 0, 1], 0))),
            ..Default::default()
        })
        .expect("the defaults are valid");
        c.member = member;
        c.sync.trusted_keys = trusted_keys;
        c.sync.allow_unsigned = false;
        c
    }

    pub fn from_settings(s: AgentSettings) -> anyhow::Result<AgentConfig> {
        let member = MemberConfig::from_settings(MemberSettings {
            data_dir: s.data_dir,
            control_plane: s.control_plane,
            bootstrap_token: s.bootstrap_token,
        })?;
        let mut providers = s
            .providers
            .unwrap_or_else(|| vec!["cpu".into()])
            .iter()
            .map(|p| parse_provider(p))
            .collect::<anyhow::Result<Vec<_>>>()?;
        // The CPU is always the last resort.
        if !providers.contains(&Provider::Cpu) {
            providers.push(Provider::Cpu);
        }
        let trusted_keys = s
            .trusted_keys
            .unwrap_or_default()
            .iter()
            .filter(|k| !k.trim().is_empty())
            .map(|k| {
                PublicKey::from_hex(k.trim())
                    .with_context(|| format!("trusted-keys: {k:?} is not an ed25519 public key"))
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        let allow_unsigned = s.allow_unsigned.unwrap_or(false);
        anyhow::ensure!(
            allow_unsigned || !trusted_keys.is_empty(),
            "trusted-keys is required (the keys whose manifest signatures this device accepts), \
             unless allow-unsigned is set for development"
        );
        let trt_cache = member.data_dir.join("trt-cache");
        let token_hash = match &s.api_token_file {
            None => None,
            Some(path) => {
                let raw = std::fs::read_to_string(path)
                    .with_context(|| format!("api-token-file: reading {}", path.display()))?;
                let token = raw.trim();
                anyhow::ensure!(
                    token.len() >= 16,
                    "api-token-file {}: the token must be at least 16 characters",
                    path.display()
                );
                Some(edgeloop_models::Digest::of(token.as_bytes()))
            }
        };
        let read = |flag: &str, path: &PathBuf| {
            std::fs::read(path).with_context(|| format!("{flag}: reading {}", path.display()))
        };
        let tls = match (&s.api_tls_cert, &s.api_tls_key) {
            (Some(cert), Some(key)) => Some(ApiTls {
                cert_pem: read("api-tls-cert", cert)?,
                key_pem: read("api-tls-key", key)?,
                client_ca_pem: s
                    .api_client_ca
                    .as_ref()
                    .map(|p| read("api-client-ca", p))
                    .transpose()?,
            }),
            (None, None) => {
                anyhow::ensure!(
                    s.api_client_ca.is_none(),
                    "api-client-ca needs api-tls-cert and api-tls-key: client certificates are \
                     only asked for over TLS"
                );
                None
            }
            _ => anyhow::bail!("api-tls-cert and api-tls-key go together"),
        };
        if let Some(tls) = &tls {
            // Refused here, at start, not at the first connection.
            edgeloop_client_core::https::server_config(
                &tls.cert_pem,
                &tls.key_pem,
                tls.client_ca_pem.as_deref(),
            )
            .context("api-tls-cert, api-tls-key, api-client-ca")?;
        }
        let api = ApiAccess {
            token_hash,
            tls,
            feedback_labels_per_minute: in_range(
                "feedback-labels-per-minute",
                s.feedback_labels_per_minute.unwrap_or(6_000),
                1,
                10_000_000,
            )?,
        };
        let listen = s
            .inference_listen
            .unwrap_or_else(|| DEFAULT_INFERENCE_LISTEN.parse().expect("valid default"));
        let grpc_listen = s.grpc_inference_listen.unwrap_or_else(|| {
            DEFAULT_GRPC_INFERENCE_LISTEN
                .parse()
                .expect("valid default")
        });
        check_api_bind(&api, s.insecure_api.unwrap_or(false), [listen, grpc_listen])?;
        Ok(AgentConfig {
            api,
            member,
            serve: ServeConfig {
                listen,
                grpc_listen,
                ort_library: s.ort_library,
                providers,
                cuda_mem_limit_bytes: s
                    .cuda_mem_limit_mb
                    .map(|mb| usize::try_from(mb.saturating_mul(1 << 20)).unwrap_or(usize::MAX)),
                trt_cache: Some(trt_cache),
                trt_fp16: s.trt_fp16.unwrap_or(false),
                workers_per_model: in_range(
                    "workers-per-model",
                    s.workers_per_model.unwrap_or(2),
                    1,
                    64,
                )?,
                max_batch_size: in_range(
                    "max-batch-size",
                    s.max_batch_size.unwrap_or(16),
                    1,
                    4096,
                )?,
                max_queue_delay: Duration::from_micros(in_range(
                    "max-queue-delay-us",
                    s.max_queue_delay_us.unwrap_or(500),
                    0,
                    1_000_000,
                )?),
                queue_capacity: in_range(
                    "queue-capacity",
                    s.queue_capacity.unwrap_or(1024),
                    1,
                    1 << 20,
                )?,
                max_request_bytes: in_range(
                    "max-request-bytes",
                    s.max_request_bytes.unwrap_or(16 << 20),
                    1024,
                    1 << 30,
                )?,
            },
            sync: SyncConfig {
                download_concurrency: in_range(
                    "download-concurrency",
                    s.download_concurrency.unwrap_or(2),
                    1,
                    16,
                )?,
                trusted_keys,
                allow_unsigned,
            },
            telemetry: TelemetryConfig {
                interval: Duration::from_secs(in_range(
                    "telemetry-interval-secs",
                    s.telemetry_interval_secs.unwrap_or(30),
                    1,
                    86_400,
                )?),
                max_batches: in_range(
                    "telemetry-max-batches",
                    s.telemetry_max_batches.unwrap_or(10_000),
                    1,
                    10_000_000,
                )?,
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn base() -> AgentSettings {
        AgentSettings {
            data_dir: Some("/tmp/x".into()),
            control_plane: Some("https://127.0.0.1:7443".into()),
            allow_unsigned: Some(true),
            ..Default::default()
        }
    }

    #[test]
    fn defaults_and_validation() {
        let c = AgentConfig::from_settings(base()).unwrap();
        assert_eq!(c.serve.providers, vec![Provider::Cpu]);
        assert_eq!(c.serve.listen.to_string(), DEFAULT_INFERENCE_LISTEN);
        assert_eq!(
            c.serve.grpc_listen.to_string(),
            DEFAULT_GRPC_INFERENCE_LISTEN
        );

        let gpu = AgentConfig::from_settings(AgentSettings {
            providers: Some(vec!["TensorRT".into(), "cuda".into()]),
            ..base()
        })
        .unwrap();
        assert_eq!(
            gpu.serve.providers,
            vec![Provider::TensorRt, Provider::Cuda, Provider::Cpu]
        );

        let cases: Vec<(AgentSettings, &str)> = vec![
            (
                AgentSettings {
                    providers: Some(vec!["rocm".into()]),
                    ..base()
                },
                "providers",
            ),
            (
                AgentSettings {
                    max_batch_size: Some(0),
                    ..base()
                },
                "max-batch-size",
            ),
            (
                AgentSettings {
                    trusted_keys: Some(vec!["abc".into()]),
                    ..base()
                },
                "trusted-keys",
            ),
            (
                AgentSettings {
                    allow_unsigned: None,
                    ..base()
                },
                "trusted-keys is required",
            ),
        ];
        for (s, field) in cases {
            let err = format!("{:#}", AgentConfig::from_settings(s).unwrap_err());
            assert!(err.contains(field), "{field}: {err}");
        }
    }

    /// The gRPC address like every setting: flag > env > file (kebab-case
    /// key), resolved into `ServeConfig::grpc_listen`.
    #[test]
    fn grpc_listen_from_flag_env_and_file() {
        use clap::Parser as _;
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            settings: AgentSettings,
        }
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("agent.toml");
        std::fs::write(&file, "grpc-inference-listen = \"127.0.0.5:9001\"\n").unwrap();
        let from_file: AgentSettings =
            edgeloop_client_core::member::settings_file(Some(&file)).unwrap();
        let resolve = |args: &[&str]| {
            let flags = Cli::try_parse_from(args).unwrap().settings;
            let s = AgentSettings {
                ..flags.or(from_file.clone())
            };
            AgentConfig::from_settings(s.or(base()))
                .unwrap()
                .serve
                .grpc_listen
                .to_string()
        };
        // The only test that touches this variable.
        std::env::remove_var("EDGELOOP_GRPC_INFERENCE_LISTEN");
        assert_eq!(resolve(&["x"]), "127.0.0.5:9001");
        std::env::set_var("EDGELOOP_GRPC_INFERENCE_LISTEN", "127.0.0.1:9002");
        assert_eq!(resolve(&["x"]), "127.0.0.1:9002");
        assert_eq!(
            resolve(&["x", "--grpc-inference-listen", "127.0.0.1:9003"]),
            "127.0.0.1:9003"
        );
        std::env::remove_var("EDGELOOP_GRPC_INFERENCE_LISTEN");
    }

    #[test]
    fn flags_beat_the_file() {
        let flags = AgentSettings {
            max_batch_size: Some(4),
            ..Default::default()
        };
        let file = AgentSettings {
            max_batch_size: Some(8),
            queue_capacity: Some(10),
            ..Default::default()
        };
        let merged = flags.or(file);
        assert_eq!(merged.max_batch_size, Some(4));
        assert_eq!(merged.queue_capacity, Some(10));
    }

    #[test]
    fn an_open_inference_api_listens_only_on_loopback() {
        let at = |addr: &str| AgentSettings {
            inference_listen: Some(addr.parse().unwrap()),
            ..base()
        };
        assert!(AgentConfig::from_settings(at("127.0.0.1:8000")).is_ok());
        let e = AgentConfig::from_settings(at("0.0.0.0:8000")).unwrap_err();
        assert!(e.to_string().contains("--api-token-file"), "{e}");
        let grpc = AgentSettings {
            grpc_inference_listen: Some("10.0.0.2:8001".parse().unwrap()),
            ..base()
        };
        assert!(AgentConfig::from_settings(grpc).is_err());
        let insecure = AgentSettings {
            insecure_api: Some(true),
            ..at("0.0.0.0:8000")
        };
        assert!(AgentConfig::from_settings(insecure).is_ok());
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("token");
        std::fs::write(&file, "short\n").unwrap();
        let with_token = |f: &std::path::Path| AgentSettings {
            api_token_file: Some(f.to_path_buf()),
            ..at("0.0.0.0:8000")
        };
        assert!(
            AgentConfig::from_settings(with_token(&file)).is_err(),
            "too short"
        );
        std::fs::write(&file, "a-long-enough-device-token\n").unwrap();
        let c = AgentConfig::from_settings(with_token(&file)).unwrap();
        assert_eq!(
            c.api.token_hash,
            Some(edgeloop_models::Digest::of(b"a-long-enough-device-token"))
        );
    }

    #[test]
    fn tls_flags_are_read_at_start_and_mtls_may_listen_off_loopback() {
        let dir = tempfile::tempdir().unwrap();
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec!["localhost".to_string()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        let file = |name: &str, body: &str| {
            let p = dir.path().join(name);
            std::fs::write(&p, body).unwrap();
            p
        };
        let (cert, key, ca) = (
            file("cert.pem", &cert.pem()),
            file("key.pem", &key.serialize_pem()),
            file("ca.pem", &cert_pem_of_ca()),
        );
        let junk = file("junk.pem", "not pem");
        let tls =
            |cert: Option<&PathBuf>, key: Option<&PathBuf>, ca: Option<&PathBuf>| AgentSettings {
                inference_listen: Some("0.0.0.0:8000".parse().unwrap()),
                api_tls_cert: cert.cloned(),
                api_tls_key: key.cloned(),
                api_client_ca: ca.cloned(),
                ..base()
            };
        // mTLS authenticates callers: it may listen off loopback.
        let c = AgentConfig::from_settings(tls(Some(&cert), Some(&key), Some(&ca))).unwrap();
        assert!(c.api.mtls() && !c.api.is_open());
        // TLS alone authenticates nobody: still refused off loopback.
        let e = AgentConfig::from_settings(tls(Some(&cert), Some(&key), None)).unwrap_err();
        assert!(e.to_string().contains("--api-client-ca"), "{e}");
        let refusals = [
            (
                tls(None, None, Some(&ca)),
                "api-client-ca needs api-tls-cert",
            ),
            (tls(Some(&cert), None, Some(&ca)), "go together"),
            (tls(Some(&junk), Some(&key), Some(&ca)), "api-tls-cert"),
            (tls(Some(&cert), Some(&key), Some(&junk)), "api-client-ca"),
            (
                tls(Some(&dir.path().join("absent")), Some(&key), Some(&ca)),
                "api-tls-cert: reading",
            ),
        ];
        for (settings, want) in refusals {
            let e = AgentConfig::from_settings(settings).unwrap_err();
            assert!(format!("{e:#}").contains(want), "{want}: {e:#}");
        }
    }

    fn cert_pem_of_ca() -> String {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params.self_signed(&key).unwrap().pem()
    }
}
