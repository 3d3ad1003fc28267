//! `edgeloop model alias set | list | delete | history`: a model's aliases
//! (`production`, `staging`), which point at versions and move; every move
//! is kept (who, when, from, to, why).

use std::io::Write;
use std::process::ExitCode;

use clap::Subcommand;
use edgeloop_api::aliases::{AliasHistoryView, AliasName, AliasView, SetAlias};
use edgeloop_api::registry::{is_valid_version, VERSION_RULE};

use super::api::{block_on, client, segment, CliError, Reply, ServerArgs};
use super::table::{text, when, Table};

#[derive(Debug, Subcommand)]
pub enum AliasCommand {
    /// Point an alias at a version (create it, or move it).
    Set {
        model: String,
        alias: AliasName,
        version: String,
        /// Why it moves, kept in its history.
        #[arg(long)]
        reason: Option<String>,
    },
    /// The model's aliases and the versions they point at.
    List { model: String },
    /// Delete an alias (its history is kept).
    Delete { model: String, alias: AliasName },
    /// Every move of an alias, oldest first.
    History { model: String, alias: AliasName },
}

pub fn run(
    cmd: AliasCommand,
    server: &ServerArgs,
    out: &mut dyn Write,
) -> anyhow::Result<ExitCode> {
    block_on(out, async {
        let client = client(server)?;
        let json = server.json;
        match cmd {
            AliasCommand::Set {
                model,
                alias,
                version,
                reason,
            } => {
                if !is_valid_version(&version) {
                    return Err(CliError::Usage(format!(
                        "{version:?} is not a valid version: {VERSION_RULE}"
                    )));
                }
                let path = format!("/api/v1/models/{}/aliases/{alias}", model_path(&model)?);
                let set: AliasView = client.put(&path, &SetAlias { version, reason }).await?;
                Reply::typed(&set, json, |a| {
                    format!("{} {} -> version {}\n", a.model, a.alias, a.version)
                })
            }
            AliasCommand::List { model } => {
                let path = format!("/api/v1/models/{}/aliases", model_path(&model)?);
                let all: Vec<AliasView> = client.get(&path).await?;
                Reply::typed(&all, json, |all| list_table(all))
            }
            AliasCommand::Delete { model, alias } => {
                let path = format!("/api/v1/models/{}/aliases/{alias}", model_path(&model)?);
                client.delete::<()>(&path).await?;
                Ok(Reply::ok(if json {
                    "{}\n".to_string()
                } else {
                    format!("deleted alias {alias} of {model}\n")
                }))
            }
            AliasCommand::History { model, alias } => {
                let path = format!(
                    "/api/v1/models/{}/aliases/{alias}/history",
                    model_path(&model)?
                );
                let h: AliasHistoryView = client.get(&path).await?;
                Reply::typed(&h, json, history_table)
            }
        }
    })
}

fn model_path(model: &str) -> Result<&str, CliError> {
    segment("model name", model)
}

pub fn list_table(all: &[AliasView]) -> String {
    let mut t = Table::new(&["ALIAS", "VERSION", "UPDATED", "BY"]);
    for a in all {
        t.row(vec![
            a.alias.to_string(),
            text(&a.version),
            when(&a.updated_at),
            text(&a.updated_by),
        ]);
    }
    t.render()
}

/// One row per move, oldest first; `-` where it came from or went to
/// nothing (created, deleted).
pub fn history_table(h: &AliasHistoryView) -> String {
    let mut t = Table::new(&["WHEN", "BY", "FROM", "TO", "REASON"]);
    for c in &h.history {
        t.row(vec![
            when(&c.at),
            text(&c.by),
            text(c.from.as_deref().unwrap_or("")),
            text(c.to.as_deref().unwrap_or("")),
            text(c.reason.as_deref().unwrap_or("")),
        ]);
    }
    let now = match &h.version {
        Some(v) => format!("{} {} -> version {v}\n", h.model, h.alias),
        None => format!("{} {} (deleted)\n", h.model, h.alias),
    };
    format!("{now}{}", t.render())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_history_reads_as_moves_and_says_where_it_points() {
        let h: AliasHistoryView = serde_json::from_value(serde_json::json!({
            "model": "digits", "alias": "production",
            "history": [
                {"at": "2026-12-01T09:00:00Z", "by": "admin", "to": "1.0.0"},
                {"at": "2026-12-02T09:00:00Z", "by": "admin", "from": "1.0.0", "to": "2.0.0",
                 "reason": "better"},
                {"at": "2026-12-03T09:00:00Z", "by": "admin", "from": "2.0.0"},
            ]
        }))
        .unwrap();
        let t = history_table(&h);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines[0], "digits production (deleted)", "{t}");
        assert_eq!(lines.len(), 5, "{t}");
        assert!(lines[2].contains("-      1.0.0"), "{t}");
        assert!(lines[3].contains("1.0.0  2.0.0  better"), "{t}");
        assert!(lines[4].ends_with("2.0.0  -      -"), "{t}");
    }
}
