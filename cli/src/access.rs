//! `edgeloop api-token create|list|revoke` and `edgeloop audit`: who may
//! call the console API, and what they did (admin only).

use std::io::Write;
use std::process::ExitCode;

use clap::{Args, Subcommand};
use edgeloop_api::access::{
    ApiTokenState, ApiTokenView, AuditEntry, AuditResult, CreateApiToken, CreatedApiToken, Role,
};

use super::api::{block_on, client, segment, CliError, Reply, ServerArgs};
use super::table::{fields, text, when, Cell, Table};

impl Cell for Role {
    fn cell(&self) -> String {
        self.as_str().into()
    }
}

impl Cell for ApiTokenState {
    fn cell(&self) -> String {
        match self {
            ApiTokenState::Active => "active",
            ApiTokenState::Expired => "expired",
            ApiTokenState::Revoked => "revoked",
        }
        .into()
    }
}

impl Cell for AuditResult {
    fn cell(&self) -> String {
        self.as_str().into()
    }
}

#[derive(Debug, Subcommand)]
pub enum ApiTokenCommand {
    /// Creates a token and prints its secret, once.
    Create {
        /// Who or what holds it, e.g. `ci-vision`.
        name: String,
        /// admin, deployer, trainer or viewer.
        #[arg(long)]
        role: Role,
        /// Limit it to these projects (repeatable; comma-separated).
        #[arg(long = "project", value_delimiter = ',')]
        projects: Vec<String>,
        /// Lifetime in seconds (no expiry when absent).
        #[arg(long)]
        expires_in_seconds: Option<u64>,
    },
    /// Every token, never a secret.
    List,
    /// Revokes a token at once.
    Revoke { id: String },
}

pub fn run_tokens(
    cmd: ApiTokenCommand,
    server: &ServerArgs,
    out: &mut dyn Write,
) -> anyhow::Result<ExitCode> {
    block_on(out, async {
        let client = client(server)?;
        match cmd {
            ApiTokenCommand::Create {
                name,
                role,
                projects,
                expires_in_seconds,
            } => {
                let req = CreateApiToken {
                    name,
                    role,
                    projects: (!projects.is_empty()).then_some(projects),
                    expires_in_seconds,
                };
                let created: CreatedApiToken = client.post("/api/v1/api-tokens", &req).await?;
                Reply::typed(&created, server.json, |c| {
                    format!(
                        "{}\ntoken:    {}\n(shown once: only its hash is stored)\n",
                        render(&c.view),
                        c.token
                    )
                })
            }
            ApiTokenCommand::List => {
                let all: Vec<ApiTokenView> = client.get("/api/v1/api-tokens").await?;
                Reply::typed(&all, server.json, |all| table(all))
            }
            ApiTokenCommand::Revoke { id } => {
                let id = segment("token id", &id)?;
                let v: ApiTokenView = client.delete(&format!("/api/v1/api-tokens/{id}")).await?;
                Reply::typed(&v, server.json, render)
            }
        }
    })
}

fn projects(v: &ApiTokenView) -> String {
    v.projects
        .as_ref()
        .map_or_else(|| "*".into(), |p| p.join(","))
}

pub fn table(all: &[ApiTokenView]) -> String {
    let mut t = Table::new(&[
        "ID", "NAME", "ROLE", "PROJECTS", "STATE", "CREATED", "EXPIRES", "BY",
    ]);
    for v in all {
        t.row(vec![
            text(&v.id),
            text(&v.name),
            text(&v.role),
            projects(v),
            text(&v.state),
            when(&v.created_at),
            when(&v.expires_at),
            text(&v.created_by),
        ]);
    }
    t.render()
}

pub fn render(v: &ApiTokenView) -> String {
    let mut pairs = vec![
        ("id", text(&v.id)),
        ("name", text(&v.name)),
        ("role", text(&v.role)),
        ("projects", projects(v)),
        ("state", text(&v.state)),
        ("created", when(&v.created_at)),
        ("expires", when(&v.expires_at)),
    ];
    if v.revoked_at.is_some() {
        pairs.push(("revoked", when(&v.revoked_at)));
    }
    fields(&pairs)
}

#[derive(Debug, Args)]
pub struct AuditArgs {
    /// Only this token's calls (`k-<n>`, or `admin`).
    #[arg(long)]
    pub token_id: Option<String>,
    /// Entries older than this sequence (the next page).
    #[arg(long)]
    pub before: Option<u64>,
    /// At most this many (1 to 1000).
    #[arg(long, default_value_t = 50)]
    pub limit: usize,
    #[command(flatten)]
    pub server: ServerArgs,
}

pub fn run_audit(args: &AuditArgs, out: &mut dyn Write) -> anyhow::Result<ExitCode> {
    block_on(out, async {
        if !(1..=1000).contains(&args.limit) {
            return Err(CliError::Usage("--limit must be 1 to 1000".into()));
        }
        let client = client(&args.server)?;
        let entries: Vec<AuditEntry> = client
            .get_query(
                "/api/v1/audit",
                &[
                    ("token_id", args.token_id.clone()),
                    ("before", args.before.map(|b| b.to_string())),
                    ("limit", Some(args.limit.to_string())),
                ],
            )
            .await?;
        Reply::typed(&entries, args.server.json, |e| audit_table(e))
    })
}

pub fn audit_table(all: &[AuditEntry]) -> String {
    let mut t = Table::new(&["SEQ", "AT", "TOKEN", "CALL", "TARGET", "STATUS", "RESULT"]);
    for e in all {
        t.row(vec![
            text(&e.seq),
            when(&e.at),
            format!("{} ({})", e.token_id, e.token_name),
            format!("{} {}", e.method, e.route),
            text(&e.target),
            text(&e.status),
            text(&e.result),
        ]);
    }
    t.render()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn tokens_and_audit_entries_render() {
        let v: ApiTokenView = serde_json::from_value(json!({"id": "k-7", "name": "ci",
            "role": "trainer", "projects": ["vision"], "created_by": "admin",
            "created_at": "2026-01-01T00:00:00Z", "state": "active"}))
        .unwrap();
        let t = table(std::slice::from_ref(&v));
        let row = t.lines().nth(1).unwrap();
        for want in ["k-7", "ci", "trainer", "vision", "active", "admin"] {
            assert!(row.contains(want), "{want}: {t}");
        }
        let e: AuditEntry = serde_json::from_value(json!({"seq": 12,
            "at": "2026-01-01T00:00:00Z", "token_id": "k-7", "token_name": "ci",
            "method": "POST", "route": "/api/v1/jobs", "target": "/api/v1/jobs",
            "status": 403, "result": "refused"}))
        .unwrap();
        let t = audit_table(&[e]);
        let row = t.lines().nth(1).unwrap();
        for want in ["12", "k-7 (ci)", "POST /api/v1/jobs", "403", "refused"] {
            assert!(row.contains(want), "{want}: {t}");
        }
    }
}
