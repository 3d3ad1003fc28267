//! The console API client behind the CLI's server commands, and the one
//! place where their failures become exit codes (sysexits.h conventions,
//! so scripts can branch on the kind of failure).

use std::io::{Read as _, Write};
use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
pub use edgeloop_api::Client;
use edgeloop_api::{ApiError, ErrorKind};
use serde::de::DeserializeOwned;
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
    /// An API token. Visible to every user of the machine in `ps`: prefer
    /// the `EDGELOOP_TOKEN` environment variable or `--token-file`.
    #[arg(long, global = true)]
    pub token: Option<String>,
    /// `EDGELOOP_TOKEN`, read apart from `--token` so that only the flag warns.
    #[arg(skip = env_token())]
    pub env_token: Option<String>,
    /// A file holding the token, e.g. `<data-dir>/admin.token`.
    #[arg(long, env = "EDGELOOP_TOKEN_FILE", global = true)]
    pub token_file: Option<std::path::PathBuf>,
    /// For an `https://` server: trust only the CAs in this PEM file (the
    /// control plane's `<data-dir>/pki/ca.crt`).
    #[arg(
        long,
        env = "EDGELOOP_CA_FILE",
        global = true,
        conflicts_with = "ca_fingerprint"
    )]
    pub ca_file: Option<std::path::PathBuf>,
    /// For an `https://` server: trust only the CA with this sha256 (a
    /// created token's `ca_fingerprint`).
    #[arg(long, env = "EDGELOOP_CA_FINGERPRINT", global = true)]
    pub ca_fingerprint: Option<edgeloop_models::Digest>,
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
    /// A valid token whose role or projects do not cover the call.
    #[error("refused: {0}")]
    Forbidden(String),
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
    /// A local file could not be read or written.
    #[error("{0}")]
    Io(String),
}

impl CliError {
    pub fn exit_code(&self) -> ExitCode {
        ExitCode::from(match self {
            CliError::Usage(_) => 64,                         // EX_USAGE
            CliError::Invalid(_) => 65,                       // EX_DATAERR
            CliError::NotFound(_) => 66,                      // EX_NOINPUT
            CliError::Connection { .. } => 69,                // EX_UNAVAILABLE
            CliError::Server(_) => 70,                        // EX_SOFTWARE
            CliError::Io(_) => 74,                            // EX_IOERR
            CliError::Conflict(_) => 75,                      // EX_TEMPFAIL
            CliError::Auth(_) | CliError::Forbidden(_) => 77, // EX_NOPERM
        })
    }
}

impl From<ApiError> for CliError {
    fn from(e: ApiError) -> CliError {
        let message = e.to_string();
        match e {
            ApiError::Unreachable { server, detail } => CliError::Connection { server, detail },
            ApiError::Status { status, .. } => match e.kind() {
                ErrorKind::Invalid => CliError::Invalid(message),
                ErrorKind::Auth if status == 403 => CliError::Forbidden(message),
                ErrorKind::Auth => CliError::Auth(message),
                ErrorKind::NotFound => CliError::NotFound(message),
                ErrorKind::Conflict => CliError::Conflict(message),
                _ => CliError::Server(format!("{status}: {message}")),
            },
            ApiError::Usage(_) => CliError::Usage(message),
            ApiError::Decode { .. } | ApiError::Timeout { .. } => CliError::Server(message),
            ApiError::Io { .. } => CliError::Io(message),
        }
    }
}

/// `EDGELOOP_TOKEN`, when set and not empty.
pub fn env_token() -> Option<String> {
    std::env::var("EDGELOOP_TOKEN")
        .ok()
        .filter(|t| !t.trim().is_empty())
}

pub const TOKEN_FLAG_WARNING: &str = "warning: --token is visible to every user of this machine \
     (ps, /proc/<pid>/cmdline); set EDGELOOP_TOKEN or use --token-file";

/// The token for `args`: `--token` (with a warning), else `EDGELOOP_TOKEN`,
/// else the file `--token-file` names.
pub fn resolve_token(
    flag: Option<&str>,
    env: Option<&str>,
    file: Option<&Path>,
) -> Result<String, CliError> {
    if let Some(t) = flag {
        eprintln!("{TOKEN_FLAG_WARNING}");
        return Ok(t.trim().to_string());
    }
    if let Some(t) = env {
        return Ok(t.trim().to_string());
    }
    match file {
        Some(path) => {
            let t = std::fs::read_to_string(path)
                .map_err(|e| CliError::Usage(format!("reading {}: {e}", path.display())))?;
            let t = t.trim();
            if t.is_empty() {
                return Err(CliError::Usage(format!("{} is empty", path.display())));
            }
            Ok(t.to_string())
        }
        None => Err(CliError::Auth("no token given".into())),
    }
}

/// The console-API client for `args`: the server and the token.
pub fn client(args: &ServerArgs) -> Result<Client, CliError> {
    let token = resolve_token(
        args.token.as_deref(),
        args.env_token.as_deref(),
        args.token_file.as_deref(),
    )?;
    let trust = match (&args.ca_file, args.ca_fingerprint) {
        (Some(path), _) => edgeloop_api::Trust::CaPem(
            std::fs::read(path)
                .map_err(|e| CliError::Usage(format!("reading {}: {e}", path.display())))?,
        ),
        (None, Some(pin)) => edgeloop_api::Trust::CaFingerprint(pin),
        (None, None) => edgeloop_api::Trust::Default,
    };
    Ok(Client::with_trust(
        &args.server,
        Some(token),
        Duration::from_secs(30),
        &trust,
    )?)
}

/// What a server command prints on stdout, and how it exits. Commands
/// return it rather than print, so tests read the very text a person sees.
pub struct Reply {
    pub stdout: String,
    pub code: ExitCode,
}

impl Reply {
    pub fn ok(stdout: String) -> Reply {
        Reply {
            stdout,
            code: ExitCode::SUCCESS,
        }
    }

    /// `--json`: the view as JSON, pretty-printed (keys sorted, as the
    /// server's JSON always read); else the human text.
    pub fn typed<T: serde::Serialize>(
        view: &T,
        json: bool,
        human: impl FnOnce(&T) -> String,
    ) -> Result<Reply, CliError> {
        if !json {
            return Ok(Reply::ok(human(view)));
        }
        let v = serde_json::to_value(view)
            .map_err(|e| CliError::Server(format!("encoding the answer as JSON: {e}")))?;
        Ok(Reply::ok(format!("{v:#}\n")))
    }

    /// `--json`: the server's JSON, pretty-printed; else the human text.
    pub fn show(v: &Value, json: bool, human: impl FnOnce(&Value) -> String) -> Reply {
        Reply::ok(if json { format!("{v:#}\n") } else { human(v) })
    }
}

/// Runs a server command on a fresh runtime and writes its output to
/// `out`; prints its error and maps it to an exit code.
pub fn block_on<F>(out: &mut dyn Write, f: F) -> anyhow::Result<ExitCode>
where
    F: std::future::Future<Output = Result<Reply, CliError>>,
{
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    match runtime.block_on(f) {
        Ok(reply) => {
            out.write_all(reply.stdout.as_bytes())?;
            out.flush()?;
            Ok(reply.code)
        }
        Err(e) => {
            eprintln!("error: {e}");
            Ok(e.exit_code())
        }
    }
}

/// An id or name goes into a URL path: refuse what would change the path
/// (`/`, `?`, `#`, `%`, `..`) before it is sent. Allows what names, versions
/// and generated ids use.
pub fn segment<'a>(what: &str, id: &'a str) -> Result<&'a str, CliError> {
    let ok = !id.is_empty()
        && id != "."
        && id != ".."
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'+'));
    if ok {
        Ok(id)
    } else {
        Err(CliError::Usage(format!("{id:?} is not a valid {what}")))
    }
}

/// A JSON file a command sends (a retraining policy, triggers); `-` reads
/// stdin. 66 when it cannot be read, 65 when it is not JSON (the server
/// checks the fields, naming the one at fault).
pub fn read_json(file: &Path) -> Result<Value, CliError> {
    let mut raw = String::new();
    let read = if file == Path::new("-") {
        std::io::stdin().read_to_string(&mut raw).map(|_| ())
    } else {
        std::fs::read_to_string(file).map(|s| raw = s)
    };
    read.map_err(|e| CliError::NotFound(format!("reading {}: {e}", file.display())))?;
    serde_json::from_str(&raw)
        .map_err(|e| CliError::Invalid(format!("{} is not JSON: {e}", file.display())))
}

/// Polls `path` once a second until `done` says the record ended; shows
/// `progress` on a spinner while stderr is a terminal, else as a line on
/// stderr each time it changes (logs of scripts and CI keep the story).
/// `--json` keeps stderr quiet. Returns the final record.
pub async fn wait_for<T: DeserializeOwned>(
    client: &Client,
    path: &str,
    json: bool,
    progress: impl Fn(&T) -> String,
    done: impl Fn(&T) -> bool,
) -> Result<T, CliError> {
    let bar = if json {
        indicatif::ProgressBar::hidden()
    } else {
        indicatif::ProgressBar::new_spinner()
    };
    // The ticker is a thread; a bar that draws nothing needs none.
    if !bar.is_hidden() {
        bar.enable_steady_tick(Duration::from_millis(120));
    }
    let mut last = String::new();
    let seen = |record: &T| {
        let line = progress(record);
        if line != last {
            if bar.is_hidden() && !json {
                eprintln!("{line}");
            }
            bar.set_message(line.clone());
            last = line;
        }
    };
    match client
        .wait_for(path, Duration::from_secs(1), None, seen, done)
        .await
    {
        Ok(record) => {
            bar.finish_and_clear();
            Ok(record)
        }
        Err(e) => {
            bar.abandon();
            Err(e.into())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segments_cannot_change_the_path() {
        for good in ["d-00000001", "digits", "1.0.0+build.2", "mnist-1f2e3d4c"] {
            assert!(segment("id", good).is_ok(), "{good}");
        }
        for bad in [
            "",
            ".",
            "..",
            "../tokens",
            "a/b",
            "d?x=1",
            "a#b",
            "%2e%2e",
            "a b",
        ] {
            assert!(segment("id", bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn json_files_fail_with_their_exit_codes() {
        let dir = tempfile::tempdir().unwrap();
        let missing = read_json(&dir.path().join("nope.json")).unwrap_err();
        assert_eq!(missing.exit_code(), ExitCode::from(66), "{missing}");
        let bad = dir.path().join("bad.json");
        std::fs::write(&bad, "job: yaml").unwrap();
        let e = read_json(&bad).unwrap_err();
        assert_eq!(e.exit_code(), ExitCode::from(65), "{e}");
        assert!(e.to_string().contains("is not JSON"), "{e}");
        let good = dir.path().join("good.json");
        std::fs::write(&good, r#"{"job": {}}"#).unwrap();
        assert_eq!(read_json(&good).unwrap(), serde_json::json!({"job": {}}));
    }

    #[test]
    fn every_failure_has_its_exit_code() {
        let cases = [
            (CliError::Usage("u".into()), 64),
            (CliError::Invalid("i".into()), 65),
            (CliError::NotFound("n".into()), 66),
            (
                CliError::Connection {
                    server: "s".into(),
                    detail: "d".into(),
                },
                69,
            ),
            (CliError::Server("s".into()), 70),
            (CliError::Io("f".into()), 74),
            (CliError::Conflict("c".into()), 75),
            (CliError::Auth("a".into()), 77),
        ];
        for (e, code) in cases {
            assert_eq!(e.exit_code(), ExitCode::from(code), "{e}");
        }
    }
}
