//! The real binary: first start says once where the admin token is (the
//! token itself only to a terminal, which a pipe is not), SIGTERM drains
//! in-flight requests and exits 0, a restart reuses everything.
#![allow(clippy::unwrap_used)]

use std::os::unix::fs::PermissionsExt;
use std::process::Stdio;
use std::time::Duration;

use edgeloop_models::Digest;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

struct Running {
    child: Child,
    http: String,
    stdout: Vec<String>,
}

async fn start(data_dir: &std::path::Path) -> Running {
    let mut child = Command::new(env!("CARGO_BIN_EXE_control-plane"))
        .args([
            "serve",
            "--grpc-listen",
            "127.0.0.1:0",
            "--http-listen",
            "127.0.0.1:0",
        ])
        .arg("--data-dir")
        .arg(data_dir)
        .env("NO_COLOR", "1")
        .env("EDGELOOP_LOG", "info")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut stderr = BufReader::new(child.stderr.take().unwrap()).lines();
    let http = tokio::time::timeout(Duration::from_secs(30), async {
        while let Some(line) = stderr.next_line().await.unwrap() {
            if let Some(rest) = line.split("http=").nth(1) {
                return rest.split_whitespace().next().unwrap().to_string();
            }
        }
        panic!("control plane exited before serving");
    })
    .await
    .expect("control plane did not start");
    // Keep draining stderr so the child never blocks on a full pipe.
    tokio::spawn(async move { while let Ok(Some(_)) = stderr.next_line().await {} });
    let mut stdout_lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut stdout = vec![];
    // The token lines are printed before serving starts.
    while let Ok(Ok(Some(line))) =
        tokio::time::timeout(Duration::from_millis(200), stdout_lines.next_line()).await
    {
        stdout.push(line);
    }
    Running {
        child,
        http: format!("http://{http}"),
        stdout,
    }
}

#[tokio::test]
async fn sigterm_drains_in_flight_requests_and_exits_zero() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("cp");
    let mut cp = start(&data_dir).await;

    let token_path = data_dir.join("admin.token");
    let token = std::fs::read_to_string(&token_path)
        .unwrap()
        .trim()
        .to_string();
    // stdout is a pipe here, as under systemd or in a container: a log
    // others read gets where the token is, never the token.
    assert_eq!(
        cp.stdout,
        [format!(
            "admin token created: {} (mode 0600)",
            token_path.display()
        )]
    );
    assert!(!cp.stdout.iter().any(|l| l.contains(&token)));
    assert_eq!(
        std::fs::metadata(&token_path).unwrap().permissions().mode() & 0o777,
        0o600
    );

    // An upload that is still streaming when SIGTERM arrives.
    let data: Vec<u8> = (0..2_000_000u32).map(|i| (i % 251) as u8).collect();
    let digest = Digest::of(&data);
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Vec<u8>, std::io::Error>>(4);
    let body = reqwest::Body::wrap_stream(tokio_stream_from(rx));
    let client = reqwest::Client::new();
    let upload = tokio::spawn(
        client
            .put(format!("{}/api/v1/artifacts/{digest}", cp.http))
            .bearer_auth(&token)
            .body(body)
            .send(),
    );
    let mut chunks = data.chunks(100_000);
    tx.send(Ok(chunks.next().unwrap().to_vec())).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;

    kill(
        Pid::from_raw(cp.child.id().unwrap() as i32),
        Signal::SIGTERM,
    )
    .unwrap();
    // Draining: new connections stop being accepted (within a bound, since
    // the signal is handled asynchronously)...
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let fresh = reqwest::Client::new()
            .get(format!("{}/healthz", cp.http))
            .timeout(Duration::from_secs(2))
            .send()
            .await;
        if fresh.is_err() {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "new requests still accepted 10 s after SIGTERM: {fresh:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // ...but the one in flight finishes.
    for chunk in chunks {
        tx.send(Ok(chunk.to_vec())).await.unwrap();
    }
    drop(tx);
    let resp = upload.await.unwrap().unwrap();
    assert_eq!(resp.status(), 201);

    let status = tokio::time::timeout(Duration::from_secs(30), cp.child.wait())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(status.code(), Some(0));

    // Restart: the token is not printed again, and the upload survived.
    let mut again = start(&data_dir).await;
    assert!(
        !again.stdout.iter().any(|l| l.contains("admin token")),
        "{:?}",
        again.stdout
    );
    let got = reqwest::Client::new()
        .get(format!("{}/api/v1/artifacts/{digest}", again.http))
        .bearer_auth(&token)
        .send()
        .await
        .unwrap();
    assert_eq!(got.status(), 200);
    assert_eq!(got.bytes().await.unwrap().len(), data.len());
    kill(
        Pid::from_raw(again.child.id().unwrap() as i32),
        Signal::SIGINT,
    )
    .unwrap();
    let status = tokio::time::timeout(Duration::from_secs(30), again.child.wait())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(status.code(), Some(0));
}

fn tokio_stream_from(
    rx: tokio::sync::mpsc::Receiver<Result<Vec<u8>, std::io::Error>>,
) -> impl futures::Stream<Item = Result<Vec<u8>, std::io::Error>> {
    futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|item| (item, rx))
    })
}

#[tokio::test]
async fn a_missing_data_dir_setting_is_a_clear_error() {
    let out = Command::new(env!("CARGO_BIN_EXE_control-plane"))
        .arg("serve")
        .env_remove("EDGELOOP_DATA_DIR")
        .output()
        .await
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--data-dir"), "{stderr}");
}
