//! The console API client behind the CLI's server commands, and the one
//! place where their failures become exit codes (sysexits.h conventions,
//! so scripts can branch on the kind of failure).

use std::process::ExitCode;

use clap::Args;
use serde_json::Value;

/// Where the console API is and how to authenticate.
#[derive(Debug, Clone, Args)]
pub struct ServerArgs {
    /// The control plane's console API.
    #[arg(
        long,
        env = "EDGELOOP_SERVER",
        default_value = "http://127.0.0.1:7080",
        global = true
    )]
    pub server: String,
    /// The admin token (or `EDGELOOP_TOKEN`, or `--token-file`).
    #[arg(long, env = "EDGELOOP_TOKEN", hide_env_values = true, global = true)]
    pub token: Option<String>,
    /// A file holding the admin token, e.g. `<data-dir>/admin.token`.
    #[arg(long, env = "EDGELOOP_TOKEN_FILE", global = true)]
    pub token_file: Option<std::path::PathBuf>,
    /// Machine-readable output.
    #[arg(long, global = true)]
    pub json: bool,
}

/// Why a server command failed, and its exit code.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    #[error("cannot reach the control plane at {server}: {detail}")]
    Connection { server: String, detail: String },
    #[error("not authorised: {0} (set EDGELOOP_TOKEN or --token-file)")]
    Auth(String),
    #[error("{0}")]
    Invalid(String),
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    Conflict(String),
    #[error("{0}")]
    Server(String),
    #[error("{0}")]
    Usage(String),
}

impl CliError {
    pub fn exit_code(&self) -> ExitCode {
        ExitCode::from(match self {
            CliError::Usage(_) => 64,          // EX_USAGE
            CliError::Invalid(_) => 65,        // EX_DATAERR
            CliError::NotFound(_) => 66,       // EX_NOINPUT
            CliError::Connection { .. } => 69, // EX_UNAVAILABLE
            CliError::Server(_) => 70,         // EX_SOFTWARE
            CliError::Conflict(_) => 75,       // EX_TEMPFAIL
            CliError::Auth(_) => 77,           // EX_NOPERM
        })
    }
}

pub struct Client {
    http: reqwest::Client,
    base: String,
    token: String,
}

impl Client {
    pub fn new(args: &ServerArgs) -> Result<Client, CliError> {
        let token = match (&args.token, &args.token_file) {
            (Some(t), _) => t.trim().to_string(),
            (None, Some(path)) => std::fs::read_to_string(path)
                .map_err(|e| CliError::Usage(format!("reading {}: {e}", path.display())))?
                .trim()
                .to_string(),
            (None, None) => return Err(CliError::Auth("no admin token given".into())),
        };
        let http = reqwest::Client::builder()
            .timeout(std::time::Duration::from_secs(30))
            .build()
            .map_err(|e| CliError::Usage(format!("HTTP client: {e}")))?;
        Ok(Client {
            http,
            base: args.server.trim_end_matches('/').to_string(),
            token,
        })
    }

    pub async fn get(&self, path: &str) -> Result<Value, CliError> {
        self.send(self.http.get(format!("{}{path}", self.base)))
            .await
    }

    pub async fn post(&self, path: &str, body: &Value) -> Result<Value, CliError> {
        self.send(self.http.post(format!("{}{path}", self.base)).json(body))
            .await
    }

    async fn send(&self, req: reqwest::RequestBuilder) -> Result<Value, CliError> {
        let resp = req
            .bearer_auth(&self.token)
            .send()
            .await
            .map_err(|e| CliError::Connection {
                server: self.base.clone(),
                detail: e.to_string(),
            })?;
        let status = resp.status();
        let body: Value = resp.json().await.unwrap_or(Value::Null);
        if status.is_success() {
            return Ok(body);
        }
        let error = &body["error"];
        let message = error["message"].as_str().unwrap_or("(no message)");
        let message = match error["field"].as_str() {
            Some(field) => format!("{field}: {message}"),
            None => message.to_string(),
        };
        Err(match status.as_u16() {
            400 | 413 | 422 => CliError::Invalid(message),
            401 | 403 => CliError::Auth(message),
            404 => CliError::NotFound(message),
            409 => CliError::Conflict(message),
            _ => CliError::Server(format!("{status}: {message}")),
        })
    }
}

/// Runs a server command on a fresh runtime; prints its error and maps it
/// to an exit code.
pub fn block_on<F>(f: F) -> anyhow::Result<ExitCode>
where
    F: std::future::Future<Output = Result<ExitCode, CliError>>,
{
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    match runtime.block_on(f) {
        Ok(code) => Ok(code),
        Err(e) => {
            eprintln!("error: {e}");
            Ok(e.exit_code())
        }
    }
}
