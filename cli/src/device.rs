//! `edgeloop device list [--selector S] | show <id>`: enrolled edge devices
//! through the console API.

use std::io::Write;
use std::process::ExitCode;

use clap::Subcommand;
use serde_json::Value;

use super::api::{block_on, client, segment, Reply, ServerArgs};
use super::table::{bytes, fields, text, when, Table};

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
                let all = client
                    .get_query("/api/v1/devices", &[("selector", selector)])
                    .await?;
                Ok(Reply::show(&all, server.json, |all| {
                    table(all.as_array().map_or(&[][..], |a| a))
                }))
            }
            DeviceCommand::Show { id } => {
                let id = segment("device id", &id)?;
                let d = client.get(&format!("/api/v1/devices/{id}")).await?;
                Ok(Reply::show(&d, server.json, render))
            }
        }
    })
}

pub fn table(all: &[Value]) -> String {
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
        let c = &d["capabilities"];
        t.row(vec![
            text(&d["id"]),
            text(&d["status"]),
            text(&d["labels"]),
            text(&c["arch"]),
            text(&c["os"]),
            providers(c),
            text(&c["agent_version"]),
            when(&d["last_seen"]),
        ]);
    }
    t.render()
}

/// `CUDAExecutionProvider` → `CUDA`: the suffix is the same on every one.
fn providers(c: &Value) -> String {
    let names: Vec<&str> = c["execution_providers"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|p| p.as_str())
        .map(|p| p.strip_suffix("ExecutionProvider").unwrap_or(p))
        .collect();
    if names.is_empty() {
        "-".into()
    } else {
        names.join(",")
    }
}

pub fn render(d: &Value) -> String {
    let c = &d["capabilities"];
    let gpus: Vec<String> = c["gpus"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|g| {
            format!(
                "{}x {} ({})",
                text(&g["count"]),
                text(&g["model"]),
                bytes(&g["memory_bytes"])
            )
        })
        .collect();
    let mut pairs = vec![
        ("id", text(&d["id"])),
        ("status", text(&d["status"])),
        ("labels", text(&d["labels"])),
        ("hostname", text(&c["hostname"])),
        ("arch", text(&c["arch"])),
        ("os", text(&c["os"])),
        ("agent", text(&c["agent_version"])),
        ("providers", providers(c)),
        (
            "gpus",
            if gpus.is_empty() {
                "-".into()
            } else {
                gpus.join(", ")
            },
        ),
        ("free disk", bytes(&c["free_disk_bytes"])),
        ("last seen", when(&d["last_seen"])),
        ("enrolled", when(&d["enrolled_at"])),
        ("cert until", when(&d["cert_not_after"])),
    ];
    if !d["revoked_at"].is_null() {
        pairs.push(("revoked", when(&d["revoked_at"])));
        pairs.push(("reason", text(&d["revoked_reason"])));
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
            "last_seen": "t", "enrolled_at": "t0", "revoked_at": null,
            "revoked_reason": null, "cert_not_after": "t9"});
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
