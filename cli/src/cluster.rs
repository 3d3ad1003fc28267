//! `edgeloop cluster list | show <id>`: the enrolled trainer bridges, their
//! engines and each engine's node pools with GPU facts.

use std::io::Write;
use std::process::ExitCode;

use clap::Subcommand;
use edgeloop_api::fleet::{MemberView, NodePool};

use super::api::{block_on, client, segment, Reply, ServerArgs};
use super::model_api::size;
use super::table::{fields, text, when, Table};

#[derive(Debug, Subcommand)]
pub enum ClusterCommand {
    /// Bridges with their status, engines and GPUs.
    List,
    /// One bridge with its node pools: GPUs per node, type, driver, CUDA,
    /// and where each fact came from.
    Show { id: String },
}

pub fn run(
    cmd: ClusterCommand,
    server: &ServerArgs,
    out: &mut dyn Write,
) -> anyhow::Result<ExitCode> {
    block_on(out, async {
        let client = client(server)?;
        match cmd {
            ClusterCommand::List => {
                let all: Vec<MemberView> = client.get("/api/v1/clusters").await?;
                Reply::typed(&all, server.json, |all| table(all))
            }
            ClusterCommand::Show { id } => {
                let id = segment("cluster id", &id)?;
                let c: MemberView = client.get(&format!("/api/v1/clusters/{id}")).await?;
                Reply::typed(&c, server.json, render)
            }
        }
    })
}

/// `8x a100` per GPU pool, `-` for a cluster without GPUs.
fn gpus(pools: &[NodePool]) -> String {
    let with: Vec<String> = pools
        .iter()
        .filter(|p| p.gpus_per_node > 0)
        .map(|p| {
            format!(
                "{}:{}x{}",
                p.engine,
                p.gpus_per_node,
                p.gpu_type.as_deref().unwrap_or("gpu")
            )
        })
        .collect();
    if with.is_empty() {
        "-".into()
    } else {
        with.join(",")
    }
}

pub fn table(all: &[MemberView]) -> String {
    let mut t = Table::new(&["ID", "STATUS", "ENGINES", "POOLS", "GPUS", "LAST SEEN"]);
    for c in all {
        let caps = &c.capabilities;
        t.row(vec![
            text(&c.id),
            text(&c.status),
            text(&caps.engines),
            caps.pools.len().to_string(),
            gpus(&caps.pools),
            when(&c.last_seen),
        ]);
    }
    t.render()
}

pub fn render(c: &MemberView) -> String {
    let caps = &c.capabilities;
    let mut out = fields(&[
        ("id", text(&c.id)),
        ("status", text(&c.status)),
        ("hostname", text(&caps.hostname)),
        ("engines", text(&caps.engines)),
        ("agent", text(&caps.agent_version)),
        ("last seen", when(&c.last_seen)),
    ]);
    let mut t = Table::new(&[
        "ENGINE",
        "POOL",
        "NODES",
        "GPUS/NODE",
        "GPU",
        "GPU MEM",
        "DRIVER",
        "CUDA",
        "CONTAINERS",
        "SOURCE",
    ]);
    for p in &caps.pools {
        t.row(vec![
            text(&p.engine),
            text(&p.name),
            p.nodes.map_or_else(|| "any".into(), |n| n.to_string()),
            text(&p.gpus_per_node),
            text(&p.gpu_type),
            p.gpu_memory_bytes.map_or_else(|| "-".into(), size),
            text(&p.driver_version),
            text(&p.cuda_version),
            if p.containers.is_empty() {
                "-".to_string()
            } else {
                let ways: Vec<&str> = p.containers.iter().map(|w| w.as_str()).collect();
                ways.join(",")
            },
            text(&p.source),
        ]);
    }
    out.push('\n');
    if t.is_empty() {
        out.push_str("no node pools reported yet\n");
    } else {
        out.push_str(&t.render());
    }
    out
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_cluster_shows_its_pools_and_where_their_facts_came_from() {
        let c = json!({"id": "gpu-farm", "kind": "cluster", "status": "online", "labels": {},
            "capabilities": {"engines": ["local", "slurm"], "hostname": "head",
                "pools": [
                    {"engine": "slurm", "name": "gpu", "nodes": 4, "gpus_per_node": 8,
                     "gpu_type": "a100", "driver_version": "535.104.05", "cuda_version": null,
                     "containers": ["pyxis", "apptainer"],
                     "source": "slurmrestd GET /slurm/v0.0.38/nodes; driver from node features"},
                    {"engine": "local", "name": "local", "nodes": null, "gpus_per_node": 0,
                     "source": "nvidia-smi: No such file or directory (os error 2)"}
                ]},
            "last_seen": "2026-01-01T00:00:09Z", "enrolled_at": "2026-01-01T00:00:00Z",
            "revoked_at": null, "revoked_reason": null,
            "cert_not_after": "2026-02-01T00:00:00Z"});
        let c: MemberView = serde_json::from_value(c).unwrap();
        let t = table(std::slice::from_ref(&c));
        let row = t.lines().nth(1).unwrap();
        for want in ["gpu-farm", "online", "local,slurm", "slurm:8xa100"] {
            assert!(row.contains(want), "{want}: {t}");
        }
        let out = render(&c);
        let slurm = out.lines().find(|l| l.starts_with("slurm")).unwrap();
        for want in [
            "gpu",
            "4",
            "8",
            "a100",
            "535.104.05",
            "pyxis,apptainer",
            "driver from node features",
        ] {
            assert!(slurm.contains(want), "{want}: {out}");
        }
        let local = out.lines().find(|l| l.starts_with("local")).unwrap();
        assert!(
            local.contains("any") && local.contains("nvidia-smi"),
            "{out}"
        );
    }
}
