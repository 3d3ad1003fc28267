//! `edgeloop device list [--selector S] | show <id>`: enrolled edge devices
//! through the console API.

use std::io::Write;
use std::process::ExitCode;

use clap::Subcommand;
use edgeloop_api::fleet::{Capabilities, MemberStatus, MemberView};

use super::api::{block_on, client, segment, Reply, ServerArgs};
use super::model_api::size;
use super::table::{fields, text, when, Cell, Table};

impl Cell for MemberStatus {
    fn cell(&self) -> String {
        self.as_str().into()
    }
}

#[derive(Debug, Subcommand)]
pub enum DeviceCommand {
    /// Devices with their status, labels and reported capabilities.
    List {
        /// A label selector, e.g. `site=berlin,edgeloop.io/arch=aarch64`
        /// (`=`, `!=`, `in (..)`, `notin (..)`, `key`, `!key`).
        #[arg(long, short = 'l')]
        selector: Option<String>,
    },
    /// One device.
    Show { id: String },
}

pub fn run(
    cmd: DeviceCommand,
    server: &ServerArgs,
    out: &mut dyn Write,
) -> anyhow::Result<ExitCode> {
    block_on(out, async {
        let client = client(server)?;
        match cmd {
            DeviceCommand::List { selector } => {
                let all: Vec<MemberView> = client
                    .get_query("/api/v1/devices", &[("selector", selector)])
                    .await?;
                Reply::typed(&all, server.json, |all| table(all))
            }
            DeviceCommand::Show { id } => {
                let id = segment("device id", &id)?;
                let d: MemberView = client.get(&format!("/api/v1/devices/{id}")).await?;
                Reply::typed(&d, server.json, render)
            }
        }
    })
}

pub fn table(all: &[MemberView]) -> String {
    let mut t = Table::new(&[
        "ID",
        "STATUS",
        "LABELS",
        "ARCH",
        "OS",
        "PROVIDERS",
        "AGENT",
        "LAST SEEN",
    ]);
    for d in all {
        let c = &d.capabilities;
        t.row(vec![
            text(&d.id),
            text(&d.status),
            text(&d.labels),
            text(&c.arch),
            text(&c.os),
            providers(c),
            text(&c.agent_version),
            when(&d.last_seen),
        ]);
    }
    t.render()
}

fn providers(c: &Capabilities) -> String {
    provider_names(&c.execution_providers)
}

/// `CUDAExecutionProvider` → `CUDA`: the suffix is the same on every one.
pub fn provider_names(providers: &[String]) -> String {
    let names: Vec<&str> = providers
        .iter()
        .map(|p| p.strip_suffix("ExecutionProvider").unwrap_or(p))
        .collect();
    if names.is_empty() {
        "-".into()
    } else {
        names.join(",")
    }
}

pub fn render(d: &MemberView) -> String {
    let c = &d.capabilities;
    let gpus: Vec<String> = c
        .gpus
        .iter()
        .map(|g| {
            format!(
                "{}x {} ({})",
                text(&g.count),
                text(&g.model),
                size(g.memory_bytes)
            )
        })
        .collect();
    let mut pairs = vec![
        ("id", text(&d.id)),
        ("status", text(&d.status)),
        ("project", text(&d.project)),
        ("labels", text(&d.labels)),
        ("hostname", text(&c.hostname)),
        ("arch", text(&c.arch)),
        ("os", text(&c.os)),
        ("agent", text(&c.agent_version)),
        ("providers", providers(c)),
        (
            "gpus",
            if gpus.is_empty() {
                "-".into()
            } else {
                gpus.join(", ")
            },
        ),
        ("free disk", size(c.free_disk_bytes)),
        ("last seen", when(&d.last_seen)),
        ("enrolled", when(&d.enrolled_at)),
        ("cert until", when(&d.cert_not_after)),
    ];
    if d.revoked_at.is_some() {
        pairs.push(("revoked", when(&d.revoked_at)));
        pairs.push(("reason", text(&d.revoked_reason)));
    }
    fields(&pairs)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn devices_show_status_labels_and_capabilities() {
        let d = json!({"id": "edge-1", "kind": "device", "status": "online",
            "labels": {"site": "lab"},
            "capabilities": {"arch": "aarch64", "os": "linux", "agent_version": "0.1.0",
                "hostname": "pi", "execution_providers": ["CUDAExecutionProvider", "CPUExecutionProvider"],
                "gpus": [{"model": "Orin", "memory_bytes": 8589934592u64, "count": 1}],
                "free_disk_bytes": 1048576},
            "last_seen": "2026-01-01T00:00:09Z", "enrolled_at": "2026-01-01T00:00:00Z",
            "revoked_at": null, "revoked_reason": null,
            "cert_not_after": "2026-02-01T00:00:00Z"});
        let d: MemberView = serde_json::from_value(d).unwrap();
        let t = table(std::slice::from_ref(&d));
        let row = t.lines().nth(1).unwrap();
        for want in [
            "edge-1", "online", "site=lab", "aarch64", "CUDA,CPU", "0.1.0",
        ] {
            assert!(row.contains(want), "{want}: {t}");
        }
        let out = render(&d);
        assert!(out.contains("gpus:        1x Orin (8.0 GiB)\n"), "{out}");
        assert!(!out.contains("revoked"), "{out}");
    }
}
