//! The bridge's progress endpoint on a real loopback socket.

#![allow(clippy::unwrap_used)]

use edgeloop_trainer_bridge::progress::ProgressHub;
use tokio_util::sync::CancellationToken;

#[tokio::test]
async fn reports_are_kept_validated_and_written_for_tensorboard() {
    edgeloop_client_core::install_crypto_provider();
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("job-1")).unwrap();
    let stop = CancellationToken::new();
    let hub = ProgressHub::start(
        "127.0.0.1:0".parse().unwrap(),
        dir.path().to_path_buf(),
        stop.clone(),
    )
    .await
    .unwrap();
    let client = reqwest::Client::new();
    let post = |job: &str, body: &str| {
        client
            .post(hub.url_for(job))
            .header("content-type", "application/json")
            .body(body.to_string())
            .send()
    };
    assert_eq!(
        post("job-1", r#"{"step": 7, "metrics": {"loss": 0.5}}"#)
            .await
            .unwrap()
            .status(),
        202
    );
    let latest = hub.latest("job-1").unwrap();
    assert_eq!((latest.step, latest.metrics["loss"]), (7, 0.5));
    for (job, body, status) in [
        ("job-1", "not json", 400),
        ("job-1", r#"{"step": "seven"}"#, 400),
        ("job-1", r#"{"step": 1, "extra": true}"#, 400),
        ("job-2", r#"{"step": 1}"#, 404),
    ] {
        assert_eq!(
            post(job, body).await.unwrap().status(),
            status,
            "{job} {body}"
        );
    }
    assert_eq!(
        hub.latest("job-1").unwrap().step,
        7,
        "rejected reports change nothing"
    );
    let big = format!(
        r#"{{"step": 1, "metrics": {{"x": "{}"}}}}"#,
        "a".repeat(100_000)
    );
    assert_eq!(post("job-1", &big).await.unwrap().status(), 413);
    let tb = std::fs::read_dir(dir.path().join("job-1/tensorboard"))
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    let records =
        edgeloop_trainer_bridge::tensorboard::read_records(&std::fs::read(tb).unwrap()).unwrap();
    assert_eq!(records.len(), 2);
    stop.cancel();
}
