//! The `.deb` packages as an operator installs them: `scripts/package.sh`
//! builds them from this build's binaries, and a fresh Debian 12 container
//! (the base image `scripts/containers-up.sh` makes) installs them with
//! `dpkg -i`. There is no systemd as PID 1 here, so each daemon is started
//! as its unit says, read from the installed unit file: its `ExecStart`,
//! under its `User=`, with its `Environment=` and `UMask=`, and no new
//! privileges. The control plane answers `/readyz`, an agent and a bridge
//! enroll with it and come online; an upgrade to the next version keeps
//! the admin token, the identities, the enrolled state and the edited
//! configuration, and the daemons come back on it without a token; `remove`
//! keeps the state, `purge` deletes it. Lintian passes on them, and the
//! units' `systemd-analyze security` exposure is held where the issue set it.

use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use edgeloop_tests::{eventually, free_port};
use serde_json::{json, Value};

const V1: &str = "0.1.0";
const V2: &str = "0.1.1~test";
const WAIT: Duration = Duration::from_secs(60);

fn repo() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
}

fn ok(what: &str, out: Output) -> String {
    assert!(
        out.status.success(),
        "{what}: {}\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `scripts/package.sh debs` of this build's binaries as `version`, into `out`.
fn package(version: &str, out: &Path) {
    let result = Command::new(repo().join("scripts/package.sh"))
        .args([
            "--profile",
            "dev",
            "--no-build",
            "--fast",
            "--version",
            version,
            "--out",
        ])
        .arg(out)
        .arg("debs")
        .output()
        .unwrap();
    ok("scripts/package.sh", result);
}

/// A Debian container the test installs into, removed when dropped.
struct Machine {
    name: String,
}

impl Machine {
    fn start(dist: &Path) -> Machine {
        let name = format!("edgeloop-packages-{}", std::process::id());
        let _ = Command::new("podman").args(["rm", "-f", &name]).output();
        let image = std::env::var("EDGELOOP_TEST_IMAGE").unwrap();
        ok(
            "podman run",
            Command::new("podman")
                // An init as PID 1 reaps the daemons that exit (a stopped
                // daemon must not linger as a zombie).
                .args([
                    "run",
                    "-d",
                    "--init",
                    "--name",
                    &name,
                    "--network",
                    "host",
                    "-v",
                ])
                .arg(format!("{}:/dist:ro", dist.display()))
                .args([&image, "sleep", "infinity"])
                .output()
                .unwrap(),
        );
        Machine { name }
    }

    /// Runs `script` with `sh -c` in the machine as root; its stdout.
    fn sh(&self, script: &str) -> String {
        ok(
            script,
            Command::new("podman")
                .args(["exec", &self.name, "sh", "-c", script])
                .output()
                .unwrap(),
        )
    }

    /// Whether `path` exists in the machine.
    fn exists(&self, path: &str) -> bool {
        Command::new("podman")
            .args(["exec", &self.name, "test", "-e", path])
            .status()
            .unwrap()
            .success()
    }

    /// Starts `unit` as systemd would, from its installed unit file: the
    /// first `ExecStart`, under `User=` and `Group=`, with the unit's
    /// `Environment=` lines, `UMask=` and no new privileges; output to
    /// `/var/log/<unit>.log`.
    fn start_unit(&self, unit: &str) {
        let text = self.sh(&format!("cat /lib/systemd/system/{unit}.service"));
        let field = |key: &str| -> Vec<String> {
            text.lines()
                .filter_map(|l| l.strip_prefix(&format!("{key}=")))
                .map(str::to_string)
                .collect()
        };
        let user = field("User").pop().expect("User=");
        let group = field("Group").pop().expect("Group=");
        let umask = field("UMask").pop().unwrap_or_else(|| "0022".into());
        let exec = field("ExecStart").pop().expect("ExecStart=");
        let env = field("Environment").join(" ");
        self.sh(&format!(
            "cd / && umask {umask} && setsid setpriv --reuid {user} --regid {group} --init-groups \
             --no-new-privs env -i PATH=/usr/bin:/bin {env} {exec} >>/var/log/{unit}.log 2>&1 &"
        ));
    }

    /// Stops `unit`'s daemon with SIGTERM, as `systemctl stop` does, and
    /// waits until it has drained and exited. It must be running. (The
    /// base image has no procps: the processes are found in /proc.)
    fn stop_unit(&self, unit: &str) {
        let binary = match unit {
            "edgeloop-control-plane" => "control-plane",
            "edgeloop-agent" => "edge-agent",
            _ => "trainer-bridge",
        };
        self.sh(&format!(
            "pids() {{ for p in /proc/[0-9]*; do [ \"$(cat $p/comm 2>/dev/null)\" = {binary} ] \
             && echo ${{p#/proc/}}; done; }}; \
             running=$(pids); [ -n \"$running\" ] || {{ echo '{unit} is not running' >&2; exit 2; }}; \
             kill -TERM $running; i=0; while [ -n \"$(pids)\" ]; do \
             i=$((i+1)); [ $i -lt 600 ] || {{ echo '{unit} did not stop' >&2; exit 1; }}; sleep 0.1; done"
        ));
    }

    fn log(&self, unit: &str) -> String {
        self.sh(&format!("cat /var/log/{unit}.log 2>/dev/null || true"))
    }
}

impl Drop for Machine {
    fn drop(&mut self) {
        let _ = Command::new("podman")
            .args(["rm", "-f", "-t", "0", &self.name])
            .output();
    }
}

/// Sets `key = value` in the machine's `/etc/edgeloop/<file>` (an operator's
/// edit of the conffile).
fn configure(m: &Machine, file: &str, settings: &[(&str, String)]) {
    let mut script = String::new();
    for (key, value) in settings {
        script.push_str(&format!(
            "sed -i '/^# {key} = /d; /^{key} = /d' /etc/edgeloop/{file} && \
             echo '{key} = {value}' >> /etc/edgeloop/{file} && "
        ));
    }
    script.push_str("true");
    m.sh(&script);
}

async fn get(client: &reqwest::Client, url: &str, token: &str) -> (u16, Value) {
    match client.get(url).bearer_auth(token).send().await {
        Ok(r) => {
            let status = r.status().as_u16();
            (status, r.json().await.unwrap_or(Value::Null))
        }
        Err(_) => (0, Value::Null),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_packages_install_run_as_their_units_upgrade_keeping_state_and_purge() {
    if !edgeloop_tests::in_own_process_with_containers() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let dist = dir.path().join("dist");
    package(V1, &dist.join("v1"));
    package(V2, &dist.join("v2"));
    // Lintian passes: what stays is overridden in the package, with its
    // reason (the embedded ONNX Runtime build, no manual pages).
    let debs_v1: Vec<_> = std::fs::read_dir(dist.join("v1"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "deb"))
        .collect();
    assert_eq!(debs_v1.len(), 3, "{debs_v1:?}");
    ok(
        "lintian",
        Command::new("lintian")
            .args(["--fail-on", "error,warning", "--tag-display-limit", "0"])
            .args(&debs_v1)
            .output()
            .expect("lintian (scripts/package-tools.sh installs it)"),
    );
    let m = Machine::start(&dist);
    let debs = |v: &str| {
        format!(
            "/dist/{d}/edgeloop-control-plane_{v}_amd64.deb /dist/{d}/edgeloop-agent_{v}_amd64.deb \
             /dist/{d}/edgeloop-bridge_{v}_amd64.deb",
            d = if v == V1 { "v1" } else { "v2" }
        )
    };
    m.sh(&format!("dpkg -i {}", debs(V1)));
    for (user, state) in [
        ("edgeloop", "/var/lib/edgeloop"),
        ("edgeloop-agent", "/var/lib/edgeloop-agent"),
        ("edgeloop-bridge", "/var/lib/edgeloop-bridge"),
    ] {
        let owner = m.sh(&format!("stat -c '%U %a' {state}"));
        assert_eq!(owner.trim(), format!("{user} 700"), "{state}");
        assert!(m
            .sh(&format!("getent passwd {user}"))
            .contains("/usr/sbin/nologin"));
    }

    // The control plane, on ports of this test's choosing (the conffile edited).
    let (http, grpc, inference) = (free_port(), free_port(), free_port());
    configure(
        &m,
        "control-plane.toml",
        &[
            ("http-listen", format!("\"127.0.0.1:{http}\"")),
            ("grpc-listen", format!("\"127.0.0.1:{grpc}\"")),
        ],
    );
    m.start_unit("edgeloop-control-plane");
    edgeloop_client_core::install_crypto_provider();
    let client = reqwest::Client::new();
    let base = format!("http://127.0.0.1:{http}");
    eventually(WAIT, "the packaged control plane is ready", || async {
        let (status, _) = get(&client, &format!("{base}/readyz"), "").await;
        (status == 200).then_some(())
    })
    .await;
    let admin = m.sh("cat /var/lib/edgeloop/admin.token").trim().to_string();
    // The journal gets where the token is, never the token.
    let cp_log = m.log("edgeloop-control-plane");
    assert!(!cp_log.contains(&admin), "{cp_log}");
    assert!(
        cp_log.contains("admin token created: /var/lib/edgeloop/admin.token"),
        "{cp_log}"
    );
    assert_eq!(
        m.sh("stat -c '%U %a' /var/lib/edgeloop/admin.token").trim(),
        "edgeloop 600"
    );
    let token = |kind: &'static str, name: &'static str| {
        let client = client.clone();
        let (base, admin) = (base.clone(), admin.clone());
        async move {
            let r = client
                .post(format!("{base}/api/v1/tokens"))
                .bearer_auth(&admin)
                .json(&json!({"kind": kind, "name": name}))
                .send()
                .await
                .unwrap();
            assert_eq!(r.status().as_u16(), 201);
            let body: Value = r.json().await.unwrap();
            body["token"].as_str().unwrap().to_string()
        }
    };

    // An agent and a bridge enroll with it, each from its own package.
    let cp_url = format!("\"https://localhost:{grpc}\"");
    configure(
        &m,
        "agent.toml",
        &[
            ("control-plane", cp_url.clone()),
            (
                "bootstrap-token",
                format!("\"{}\"", token("device", "pkg-device").await),
            ),
            (
                "trusted-keys",
                format!(
                    "[\"{}\"]",
                    edgeloop_models::manifest::ManifestKey::generate()
                        .public()
                        .to_hex()
                ),
            ),
            ("inference-listen", format!("\"127.0.0.1:{inference}\"")),
            (
                "grpc-inference-listen",
                format!("\"127.0.0.1:{}\"", free_port()),
            ),
        ],
    );
    configure(
        &m,
        "bridge.toml",
        &[
            ("control-plane", cp_url.clone()),
            (
                "bootstrap-token",
                format!("\"{}\"", token("cluster", "pkg-cluster").await),
            ),
        ],
    );
    m.start_unit("edgeloop-agent");
    m.start_unit("edgeloop-bridge");
    let online = |what: &'static str, name: &'static str, unit: &'static str| {
        let (client, base, admin) = (client.clone(), base.clone(), admin.clone());
        let m = &m;
        async move {
            let deadline = tokio::time::Instant::now() + WAIT;
            loop {
                let (_, d) = get(&client, &format!("{base}/api/v1/{what}/{name}"), &admin).await;
                if d["status"] == "online" {
                    return;
                }
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "{name} not online: {d}\n{unit}'s log:\n{}\ncontrol plane's log:\n{}",
                    m.log(unit),
                    m.log("edgeloop-control-plane")
                );
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        }
    };
    online("devices", "pkg-device", "edgeloop-agent").await;
    online("clusters", "pkg-cluster", "edgeloop-bridge").await;
    // The agent serves with the ONNX Runtime library its package ships.
    eventually(WAIT, "the agent's inference API is ready", || async {
        let (status, _) = get(
            &client,
            &format!("http://127.0.0.1:{inference}/v2/health/ready"),
            "",
        )
        .await;
        (status == 200).then_some(())
    })
    .await;
    let agent_log = m.log("edgeloop-agent");
    assert!(
        !agent_log.contains("ERROR"),
        "the agent's log has errors:\n{agent_log}"
    );
    let identity = m.sh("cd /var/lib/edgeloop-agent && find . -type f | sort | xargs sha256sum");

    // The upgrade: daemons stopped (prerm leaves them to postinst), the new
    // packages over the old, edited conffiles kept, the token no longer needed.
    for unit in [
        "edgeloop-agent",
        "edgeloop-bridge",
        "edgeloop-control-plane",
    ] {
        m.stop_unit(unit);
    }
    m.sh(&format!(
        "dpkg -i --force-confold {} 2>&1 | tail -n 20",
        debs(V2)
    ));
    assert!(m
        .sh("dpkg -s edgeloop-agent")
        .contains(&format!("Version: {V2}")));
    assert_eq!(
        m.sh("cat /var/lib/edgeloop/admin.token").trim(),
        admin,
        "the admin token survives the upgrade"
    );
    assert!(m
        .sh("cat /etc/edgeloop/agent.toml")
        .contains(&format!("inference-listen = \"127.0.0.1:{inference}\"")));
    let after = m.sh("cd /var/lib/edgeloop-agent && find . -type f | sort | xargs sha256sum");
    let identity_files = |listing: &str| -> Vec<String> {
        listing
            .lines()
            .filter(|l| l.contains("identity"))
            .map(str::to_string)
            .collect()
    };
    assert!(!identity_files(&identity).is_empty(), "{identity}");
    assert_eq!(identity_files(&identity), identity_files(&after));
    configure(&m, "agent.toml", &[("bootstrap-token", "\"\"".into())]);
    configure(&m, "bridge.toml", &[("bootstrap-token", "\"\"".into())]);
    m.start_unit("edgeloop-control-plane");
    eventually(WAIT, "the upgraded control plane is ready", || async {
        let (status, _) = get(&client, &format!("{base}/readyz"), "").await;
        (status == 200).then_some(())
    })
    .await;
    let (status, devices) = get(&client, &format!("{base}/api/v1/devices"), &admin).await;
    assert_eq!(status, 200, "the old admin token still works: {devices}");
    m.start_unit("edgeloop-agent");
    m.start_unit("edgeloop-bridge");
    online("devices", "pkg-device", "edgeloop-agent").await;
    online("clusters", "pkg-cluster", "edgeloop-bridge").await;
    for unit in [
        "edgeloop-agent",
        "edgeloop-bridge",
        "edgeloop-control-plane",
    ] {
        m.stop_unit(unit);
    }

    // remove keeps the state and the configuration; purge deletes them.
    m.sh("dpkg --remove edgeloop-agent edgeloop-bridge edgeloop-control-plane");
    assert!(!m.exists("/usr/bin/edge-agent"));
    for kept in [
        "/var/lib/edgeloop/admin.token",
        "/var/lib/edgeloop-agent",
        "/etc/edgeloop/agent.toml",
    ] {
        assert!(m.exists(kept), "{kept} kept by remove");
    }
    m.sh("dpkg --purge edgeloop-agent edgeloop-bridge edgeloop-control-plane");
    for gone in [
        "/var/lib/edgeloop",
        "/var/lib/edgeloop-agent",
        "/var/lib/edgeloop-bridge",
        "/etc/edgeloop/agent.toml",
        "/etc/edgeloop/control-plane.toml",
    ] {
        assert!(!m.exists(gone), "{gone} deleted by purge");
    }
}

/// `systemd-analyze security --offline=true` of each unit: the agent and
/// the control plane at 2.0 ("OK") or below, the bridge below 5.0 (it
/// starts training processes and container runtimes).
#[test]
fn the_units_exposure_is_low() {
    let units = repo().join("deploy/debian");
    for (unit, limit) in [
        ("edgeloop-agent.service", 2.0),
        ("edgeloop-control-plane.service", 2.0),
        ("edgeloop-bridge.service", 5.0),
    ] {
        let out = Command::new("systemd-analyze")
            .args(["security", "--offline=true", "--no-pager"])
            .arg(units.join(unit))
            .output()
            .expect("systemd-analyze (Debian's systemd) is installed");
        let text = String::from_utf8_lossy(&out.stdout);
        let score: f64 = text
            .lines()
            .find_map(|l| l.split("exposure level for ").nth(1))
            .and_then(|rest| rest.split(": ").nth(1))
            .and_then(|s| s.split_whitespace().next())
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("no exposure level for {unit}:\n{text}"));
        assert!(score <= limit, "{unit}: exposure {score} > {limit}\n{text}");
    }
}

/// Every key the shipped configuration files show (commented out, with an
/// example value) is one the daemon reads: uncommented, each file parses
/// into the daemon's settings, which refuse unknown keys.
#[test]
fn the_shipped_configuration_files_name_real_settings() {
    let uncommented = |file: &str| -> String {
        let text = std::fs::read_to_string(repo().join("deploy/debian").join(file)).unwrap();
        text.lines()
            .filter_map(|l| l.strip_prefix("# "))
            .filter(|l| {
                l.split_once(" = ").is_some_and(|(k, _)| {
                    !k.is_empty() && k.bytes().all(|b| b.is_ascii_lowercase() || b == b'-')
                })
            })
            .collect::<Vec<_>>()
            .join("\n")
    };
    let agent = uncommented("agent.toml");
    assert!(agent.contains("control-plane = "), "{agent}");
    let parsed: edgeloop_edge_agent::AgentSettings =
        toml::from_str(&agent).unwrap_or_else(|e| panic!("agent.toml:\n{agent}\n{e}"));
    assert!(parsed.control_plane.is_some());
    let bridge = uncommented("bridge.toml");
    let parsed: edgeloop_trainer_bridge::BridgeSettings =
        toml::from_str(&bridge).unwrap_or_else(|e| panic!("bridge.toml:\n{bridge}\n{e}"));
    assert!(parsed.container_runtime.is_some());
    let cp = uncommented("control-plane.toml");
    let parsed: edgeloop_control_plane::ServeSettings =
        toml::from_str(&cp).unwrap_or_else(|e| panic!("control-plane.toml:\n{cp}\n{e}"));
    assert!(parsed.store_url.is_some());
}

/// The control plane's OCI image, built by `scripts/package.sh image` with
/// Buildah from scratch: loaded into Podman from the archive alone, it runs
/// as its non-root user and `control-plane serve` answers `/readyz`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_control_plane_image_runs_non_root_and_answers_readyz() {
    if !edgeloop_tests::in_own_process_with_containers() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let version = "0.1.0-imagetest";
    ok(
        "scripts/package.sh image",
        Command::new(repo().join("scripts/package.sh"))
            .args([
                "--profile",
                "dev",
                "--no-build",
                "--version",
                version,
                "--out",
            ])
            .arg(dir.path())
            .arg("image")
            .output()
            .unwrap(),
    );
    let archive = dir
        .path()
        .join(format!("edgeloop-control-plane-{version}.oci.tar"));
    let tag = format!("localhost/edgeloop-control-plane-test:{version}");
    // From the archive alone: drop what the build left in local storage.
    let _ = Command::new("podman")
        .args([
            "rmi",
            "-f",
            &format!("localhost/edgeloop-control-plane:{version}"),
            &tag,
        ])
        .output();
    let loaded = ok(
        "podman load",
        Command::new("podman")
            .args(["load", "-q", "-i"])
            .arg(&archive)
            .output()
            .unwrap(),
    );
    let image = loaded
        .lines()
        .find_map(|l| l.strip_prefix("Loaded image: "))
        .unwrap_or_else(|| panic!("{loaded}"))
        .trim()
        .to_string();
    ok(
        "podman tag",
        Command::new("podman")
            .args(["tag", &image, &tag])
            .output()
            .unwrap(),
    );
    let user = ok(
        "podman image inspect",
        Command::new("podman")
            .args(["image", "inspect", "--format", "{{.Config.User}}", &tag])
            .output()
            .unwrap(),
    );
    assert_eq!(user.trim(), "65532:65532");
    let (http, grpc) = (free_port(), free_port());
    let name = format!("edgeloop-image-{}", std::process::id());
    let _ = Command::new("podman").args(["rm", "-f", &name]).output();
    ok(
        "podman run",
        Command::new("podman")
            .args([
                "run",
                "-d",
                "--name",
                &name,
                "--network",
                "host",
                &tag,
                "serve",
            ])
            .args(["--http-listen", &format!("127.0.0.1:{http}")])
            .args(["--grpc-listen", &format!("127.0.0.1:{grpc}")])
            .output()
            .unwrap(),
    );
    edgeloop_client_core::install_crypto_provider();
    let client = reqwest::Client::new();
    eventually(WAIT, "the image's control plane is ready", || async {
        let (status, _) = get(&client, &format!("http://127.0.0.1:{http}/readyz"), "").await;
        (status == 200).then_some(())
    })
    .await;
    let top = ok(
        "podman top",
        Command::new("podman")
            .args(["top", &name, "huser", "user", "comm"])
            .output()
            .unwrap(),
    );
    let logs = Command::new("podman")
        .args(["logs", &name])
        .output()
        .unwrap();
    let _ = Command::new("podman")
        .args(["rm", "-f", "-t", "0", &name])
        .output();
    let _ = Command::new("podman")
        .args(["rmi", "-f", &tag, &image])
        .output();
    let serving = top
        .lines()
        .find(|l| l.contains("control-plane"))
        .unwrap_or_else(|| panic!("{top}\n{}", String::from_utf8_lossy(&logs.stderr)));
    let words: Vec<&str> = serving.split_whitespace().collect();
    assert_eq!(words[1], "edgeloop", "{top}");
    assert_ne!(words[0], "root", "{top}");
}

/// The offline bundle, unpacked into an empty directory, used with no
/// network (`unshare -n`), an empty `HOME` and no `EDGELOOP_*` or
/// `ORT_DYLIB_PATH`: `install.sh --check` verifies it, and `edgeloop model
/// quantize` finds ONNX Runtime beside itself and quantizes behind the
/// gate. `--split` parts join back into the same archive.
#[test]
fn the_offline_bundle_works_with_no_network_and_no_environment() {
    let dir = tempfile::tempdir().unwrap();
    let version = "0.1.0";
    let out = dir.path().join("dist");
    ok(
        "scripts/package.sh bundle",
        Command::new(repo().join("scripts/package.sh"))
            .args([
                "--profile",
                "dev",
                "--no-build",
                "--fast",
                "--split",
                "20M",
                "--out",
            ])
            .arg(&out)
            .arg("bundle")
            .output()
            .unwrap(),
    );
    let name = format!("edgeloop-offline-{version}-x86_64");
    let archive = out.join(format!("{name}.tar.gz"));
    // The parts check and join back into the archive.
    let parts = out.join(format!("{name}.parts"));
    ok(
        "the parts",
        Command::new("sh")
            .arg("-c")
            .arg(format!(
                "sha256sum --quiet -c {name}.parts.sha256 && cat {name}.tar.gz.part-* > joined.tar.gz \
                 && cmp joined.tar.gz {} && test $(ls {name}.tar.gz.part-* | wc -l) -gt 1",
                archive.display()
            ))
            .current_dir(&parts)
            .output()
            .unwrap(),
    );
    let site = dir.path().join("site");
    let home = dir.path().join("home");
    std::fs::create_dir_all(&site).unwrap();
    std::fs::create_dir_all(&home).unwrap();
    ok(
        "tar",
        Command::new("tar")
            .arg("-xzf")
            .arg(&archive)
            .arg("-C")
            .arg(&site)
            .output()
            .unwrap(),
    );
    let root = site.join(&name);
    let mnist = edgeloop_tests::mnist::mnist_dir();
    let work = dir.path().join("work");
    std::fs::create_dir_all(&work).unwrap();
    for f in ["mlp.onnx", "calib_mlp.npz", "eval_mlp.npz"] {
        std::fs::copy(mnist.join(f), work.join(f)).unwrap();
    }
    let isolated = |script: &str| {
        Command::new("unshare")
            .args(["-n", "env", "-i", "PATH=/usr/bin:/bin"])
            .arg(format!("HOME={}", home.display()))
            .args(["sh", "-c", script])
            .current_dir(&work)
            .output()
            .unwrap()
    };
    let checked = ok(
        "install.sh --check",
        isolated(&format!("{}/install.sh --check", root.display())),
    );
    assert!(checked.contains("intact"), "{checked}");
    // No network: nothing but loopback.
    let links = ok("ip link", isolated("cat /proc/net/dev"));
    assert!(!links.contains("eth0"), "{links}");
    let quantized = ok(
        "edgeloop model quantize from the bundle",
        isolated(&format!(
            "{}/bin/edgeloop model quantize mlp.onnx --calibration calib_mlp.npz \
             --eval eval_mlp.npz --out digits.onnx --json",
            root.display()
        )),
    );
    let outcome: Value =
        serde_json::from_str(&quantized).unwrap_or_else(|e| panic!("{e}: {quantized}"));
    assert!(work.join("digits.onnx").exists(), "{outcome}");
    // Nothing was written outside the work dir and the empty HOME.
    let installed = ok(
        "install.sh",
        isolated(&format!(
            "{}/install.sh {}",
            root.display(),
            dir.path().join("opt").display()
        )),
    );
    assert!(installed.contains("installed under"), "{installed}");
    let version_out = ok(
        "the installed control-plane",
        isolated(&format!(
            "{}/bin/control-plane --version",
            dir.path().join("opt").display()
        )),
    );
    assert!(version_out.contains("0.1.0"), "{version_out}");
}

/// The units set `MemoryDenyWriteExecute=yes`: ONNX Runtime's CPU kernels
/// must then never need writable code. The kernel's own form of that rule
/// (`PR_SET_MDWE`, Linux 6.3, kept across exec) on `edgeloop model
/// quantize`, which loads the same library, builds sessions and runs every
/// candidate: it succeeds, and a writable executable mapping is refused.
#[test]
fn onnx_runtime_runs_where_memory_may_not_be_writable_and_executable() {
    // prctl from Python's ctypes, then exec: no unsafe block in the suite.
    const MDWE: &str = "import ctypes, os, sys\n\
        libc = ctypes.CDLL(None, use_errno=True)\n\
        if libc.prctl(65, 1, 0, 0, 0) != 0:\n    sys.exit('PR_SET_MDWE: ' + os.strerror(ctypes.get_errno()))\n\
        os.execvp(sys.argv[1], sys.argv[1:])\n";
    let deny_write_execute = |program: &str| {
        let mut cmd = Command::new("python3");
        cmd.args(["-c", MDWE, program]);
        cmd
    };
    // The rule holds: a writable and executable mapping is refused.
    let refused = deny_write_execute("python3")
        .args([
            "-c",
            "import mmap; mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)",
        ])
        .output()
        .unwrap();
    assert!(
        !refused.status.success()
            && String::from_utf8_lossy(&refused.stderr).contains("Permission denied"),
        "PR_SET_MDWE did not take: {refused:?}"
    );
    let dir = tempfile::tempdir().unwrap();
    let mnist = edgeloop_tests::mnist::mnist_dir();
    let mut quantize = deny_write_execute(edgeloop_tests::edgeloop_bin().to_str().unwrap());
    quantize
        .args(["model", "quantize"])
        .arg(mnist.join("cnn.onnx"))
        .arg("--calibration")
        .arg(mnist.join("calib_cnn.npz"))
        .arg("--eval")
        .arg(mnist.join("eval_cnn.npz"))
        .arg("--out")
        .arg(dir.path().join("digits.onnx"))
        .arg("--json")
        .env("HOME", dir.path())
        .env(
            "ORT_DYLIB_PATH",
            edgeloop_models::deps::dir()
                .unwrap()
                .join("onnxruntime-1.31.1/libonnxruntime.so.1.31.1"),
        )
        .env_remove("EDGELOOP_MANIFEST_SIGNING_KEY");
    let out = ok(
        "edgeloop model quantize under PR_SET_MDWE",
        quantize.output().unwrap(),
    );
    let outcome: Value = serde_json::from_str(&out).unwrap();
    assert!(dir.path().join("digits.onnx").exists(), "{outcome}");
}
