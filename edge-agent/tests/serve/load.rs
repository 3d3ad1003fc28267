//! Under load: swaps fail no request, a full queue answers 503 with
//! Retry-After, and batched requests each get their own answers.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use edgeloop_edge_agent::serving::ModelServing;
use serde_json::Value;

use crate::common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hot_swap_under_load_fails_no_request() {
    const CLIENTS: usize = 8;
    const REQUESTS: usize = 500;
    let server = start(config()).await;
    let models = Models::new();
    let files = [
        ("1", 1.0f32, models.write("add1", &add_model(1.0))),
        ("2", 2.0f32, models.write("add2", &add_model(2.0))),
    ];
    server
        .host
        .activate(spec("add", "1", &files[0].2))
        .await
        .unwrap();

    let done = Arc::new(AtomicBool::new(false));
    let url = format!("{}/v2/models/add/infer", server.base);
    let clients: Vec<_> = (0..CLIENTS)
        .map(|c| {
            let (client, url) = (server.client.clone(), url.clone());
            tokio::spawn(async move {
                let mut failures = Vec::new();
                let mut versions = [0usize; 2];
                for r in 0..REQUESTS {
                    let x = (c * REQUESTS + r) as f32;
                    let body = infer_body("x", &[1, 4], &[x, x + 0.5, -x, 0.25]);
                    let response = client.post(&url).json(&body).send().await.unwrap();
                    let status = response.status().as_u16();
                    let text = response.text().await.unwrap();
                    if status != 200 {
                        failures.push(format!("{status}: {text}"));
                        continue;
                    }
                    let body: Value = serde_json::from_str(&text).unwrap();
                    let (index, c) = match body["model_version"].as_str() {
                        Some("1") => (0, 1.0),
                        Some("2") => (1, 2.0),
                        other => panic!("unexpected version {other:?}"),
                    };
                    versions[index] += 1;
                    // The answer is the version's own: y = x + c.
                    assert_eq!(
                        output_data(&body, 0),
                        vec![x + c, x + 0.5 + c, -x + c, 0.25 + c],
                        "request {x} on version {index}"
                    );
                }
                (failures, versions)
            })
        })
        .collect();

    // Swap back and forth while the clients run.
    let swapper = {
        let (host, done) = (Arc::clone(&server.host), Arc::clone(&done));
        let files = files.clone();
        tokio::spawn(async move {
            let mut swaps = 0;
            while !done.load(Ordering::Relaxed) || swaps < 6 {
                let (version, _, path) = &files[(swaps + 1) % 2];
                host.activate(spec("add", version, path)).await.unwrap();
                swaps += 1;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            swaps
        })
    };
    let mut failures = Vec::new();
    let mut versions = [0usize; 2];
    for client in clients {
        let (f, v) = client.await.unwrap();
        failures.extend(f);
        versions[0] += v[0];
        versions[1] += v[1];
    }
    done.store(true, Ordering::Relaxed);
    let swaps = swapper.await.unwrap();
    assert!(
        failures.is_empty(),
        "{} failed: {:?}",
        failures.len(),
        &failures[..failures.len().min(5)]
    );
    assert_eq!(versions[0] + versions[1], CLIENTS * REQUESTS);
    assert!(swaps >= 6, "only {swaps} swaps");
    assert!(
        versions[0] > 0 && versions[1] > 0,
        "both versions served: {versions:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_queue_answers_503_with_retry_after() {
    let mut cfg = config();
    cfg.workers_per_model = 1;
    cfg.queue_capacity = 1;
    cfg.max_batch_size = 1;
    let server = start(cfg).await;
    let models = Models::new();
    let slow = models.write("slow", &slow_model(512, 60));
    server
        .host
        .activate(spec("slow", "1", &slow))
        .await
        .unwrap();

    let body = infer_body("x", &[1, 512], &noise(512, 9));
    let started = Instant::now();
    let replies = futures_join(
        (0..16)
            .map(|_| {
                let (client, url, body) = (
                    server.client.clone(),
                    format!("{}/v2/models/slow/infer", server.base),
                    body.clone(),
                );
                async move {
                    let r = client.post(url).json(&body).send().await.unwrap();
                    let status = r.status().as_u16();
                    let retry = r
                        .headers()
                        .get("retry-after")
                        .map(|v| v.to_str().unwrap().to_string());
                    let body: Value = r.json().await.unwrap();
                    (status, retry, body)
                }
            })
            .collect(),
    )
    .await;
    let full: Vec<_> = replies.iter().filter(|(s, _, _)| *s == 503).collect();
    let ok = replies.iter().filter(|(s, _, _)| *s == 200).count();
    assert_eq!(full.len() + ok, 16, "only 200 and 503: {replies:?}");
    assert!(ok >= 1, "some were served");
    assert!(
        !full.is_empty(),
        "the queue of 1 never overflowed in {:?}",
        started.elapsed()
    );
    for (_, retry, body) in full {
        assert_eq!(retry.as_deref(), Some("1"));
        assert!(
            body["error"].as_str().unwrap().contains("retry later"),
            "{body}"
        );
    }
    // Once drained it serves again, and the depth gauge is back to 0.
    let again = server.post("/v2/models/slow/infer", &body).await;
    assert_eq!(again.status, 200, "{}", again.text);
    let metrics = server.get("/metrics").await.text;
    assert!(
        metrics.contains("edgeloop_inference_queue_depth{model=\"slow\"} 0"),
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batched_requests_get_their_own_answers() {
    let mut cfg = config();
    cfg.workers_per_model = 1;
    cfg.max_batch_size = 8;
    cfg.max_queue_delay = Duration::from_millis(5);
    let server = start(cfg).await;
    let models = Models::new();
    let slow = models.write("slow", &slow_model(64, 200));
    server
        .host
        .activate(spec("slow", "1", &slow))
        .await
        .unwrap();
    let url = format!("{}/v2/models/slow/infer", server.base);

    // Each request alone first: the reference answers.
    let inputs: Vec<(Vec<usize>, Vec<f32>)> = (0..24)
        .map(|i| {
            let rows = 1 + i % 3;
            (vec![rows, 64], noise(rows * 64, i as u64))
        })
        .collect();
    let mut alone = Vec::new();
    for (shape, data) in &inputs {
        let got = server
            .post("/v2/models/slow/infer", &infer_body("x", shape, data))
            .await;
        assert_eq!(got.status, 200, "{}", got.text);
        alone.push(output_data(&got.body, 0));
    }
    let batches_before = batch_runs(&server.get("/metrics").await.text);

    // Then all at once, so they queue up and share runs.
    let together = futures_join(
        inputs
            .iter()
            .map(|(shape, data)| {
                let (client, url, body) = (
                    server.client.clone(),
                    url.clone(),
                    infer_body("x", shape, data),
                );
                async move {
                    let r: Value = client
                        .post(url)
                        .json(&body)
                        .send()
                        .await
                        .unwrap()
                        .json()
                        .await
                        .unwrap();
                    output_data(&r, 0)
                }
            })
            .collect(),
    )
    .await;
    for (i, (a, b)) in alone.iter().zip(&together).enumerate() {
        assert_eq!(a.len(), b.len(), "request {i}");
        let worst = a
            .iter()
            .zip(b)
            .map(|(x, y)| (x - y).abs())
            .fold(0.0f32, f32::max);
        assert!(
            worst < 1e-4,
            "request {i}: batched answer differs by {worst}"
        );
    }
    let batches_after = batch_runs(&server.get("/metrics").await.text);
    let runs = batches_after - batches_before;
    assert!(
        runs < 24,
        "24 concurrent requests took {runs} runs: no batching happened"
    );
}

/// Model runs so far (the batch-size histogram's count) for `slow`.
fn batch_runs(metrics: &str) -> u64 {
    metrics
        .lines()
        .find(|l| l.starts_with("edgeloop_inference_batch_size_count{model=\"slow\""))
        .and_then(|l| l.rsplit(' ').next())
        .map_or(0, |v| v.parse().unwrap())
}

/// Runs futures concurrently on the runtime and collects their results in order.
async fn futures_join<F>(futures: Vec<F>) -> Vec<F::Output>
where
    F: std::future::Future + Send + 'static,
    F::Output: Send + 'static,
{
    let handles: Vec<_> = futures.into_iter().map(tokio::spawn).collect();
    let mut out = Vec::with_capacity(handles.len());
    for h in handles {
        out.push(h.await.unwrap());
    }
    out
}
