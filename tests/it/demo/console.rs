//! The web console over the demo's loop (issue #18), in a real browser,
//! while `edgeloop demo --keep-running` serves it: the fleet of three
//! agents, the model's lineage, the retrain's rollout succeeded, and drift
//! rising after the shift with the loop's decisions on the chart.
//! Screenshots go where the console test puts its own, named `demo-*`.

use std::path::Path;
use std::time::Duration;

use edgeloop_tests::browser;
use serde_json::Value;

const WAIT: Duration = Duration::from_secs(30);

/// The console's base URL, from the demo's own log line.
fn base_of(work: &Path) -> String {
    let log = std::fs::read_to_string(work.join("../demo-stderr.log")).unwrap();
    let at = log
        .find("the web console: ")
        .unwrap_or_else(|| panic!("the demo printed no console URL:\n{log}"));
    let url = log[at + "the web console: ".len()..]
        .split_whitespace()
        .next()
        .unwrap();
    url.trim_end_matches("/ui/").to_string()
}

async fn api(base: &str, token: &str, path: &str) -> Value {
    reqwest::Client::new()
        .get(format!("{base}{path}"))
        .bearer_auth(token)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

pub async fn over_the_demo(work: &Path) {
    let Some((chromium, chromedriver)) = browser::required("the demo's console part") else {
        return;
    };
    edgeloop_client_core::install_crypto_provider();
    let base = base_of(work);
    let token = std::fs::read_to_string(work.join("control-plane/admin.token")).unwrap();
    let token = token.trim();
    let driver = browser::Driver::start(&chromedriver).await.unwrap();
    let b = driver.browser(&chromium).await.unwrap();
    b.log_in(&base, token).await.unwrap();

    // The fleet: the three agents, online, each serving v2 and
    // reporting telemetry.
    let table = b.text("table.data").await.unwrap();
    for d in ["edge-1", "edge-2", "edge-3", "demo=rainfall", "last report"] {
        assert!(table.contains(d), "{d} missing from the fleet:\n{table}");
    }
    let serving = b
        .script(
            "return Array.from(document.querySelectorAll('tbody tr'))
               .map(r => r.cells[4].textContent.trim());",
        )
        .await
        .unwrap();
    let serving: Vec<String> = serde_json::from_value(serving).unwrap();
    assert_eq!(serving.len(), 3, "{table}");
    for s in &serving {
        // With its variant, if the device got one; no rollout pending.
        assert!(
            s.starts_with("rainfall 2.0.0") && !s.contains('→'),
            "{serving:?}"
        );
    }
    assert_eq!(b.find_all("tbody .badge.good").await.unwrap().len(), 3);
    b.page_shot("demo-fleet.png").await.unwrap();

    // The model: v2's lineage back to its dataset and job, and its gate.
    b.goto(&format!("{base}/ui/models/rainfall")).await.unwrap();
    b.wait_for_text("[id='v-2.0.0']", "Version 2.0.0", WAIT)
        .await
        .unwrap();
    let v2 = b.text("section[aria-labelledby='v-2.0.0']").await.unwrap();
    for want in [
        "dataset snapshot",
        "training job",
        "checkpoint",
        "trigger: drift",
        "from 1.0.0",
    ] {
        assert!(v2.contains(want), "{want} missing from v2:\n{v2}");
    }
    assert!(
        !b.find_all("section[aria-labelledby='v-2.0.0'] table.gate")
            .await
            .unwrap()
            .is_empty(),
        "v2 shows its gate's evidence"
    );
    b.page_shot("demo-model.png").await.unwrap();

    // The retrain's rollout, succeeded, every wave healthy.
    let deployments = api(&base, token, "/api/v1/deployments").await;
    let v2_rollout = deployments
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["deployment"]["target_version"] == "2.0.0")
        .unwrap_or_else(|| panic!("no rollout of v2: {deployments}"));
    let id = v2_rollout["id"].as_str().unwrap();
    b.goto(&format!("{base}/ui/deployments")).await.unwrap();
    let link = b
        .find(&format!("a[href='/ui/deployments/{id}']"), WAIT)
        .await
        .unwrap();
    b.click(&link).await.unwrap();
    b.wait_for_text("#live .state", "succeeded", WAIT)
        .await
        .unwrap();
    let waves = b.text("#live table.data").await.unwrap();
    assert!(
        waves.contains("healthy") && !waves.contains("failed"),
        "{waves}"
    );
    b.page_shot("demo-deployment.png").await.unwrap();

    // v1's drift: flagged after the shift, with the retrain and v2's start
    // marked on the same axis, and the windows that rose past the line.
    b.goto(&format!("{base}/ui/models/rainfall/drift?version=1.0.0"))
        .await
        .unwrap();
    b.find("figure.chart svg", WAIT).await.unwrap();
    let marks = b
        .script(
            "return Array.from(document.querySelectorAll('figure.chart svg text'))
               .map(t => t.textContent);",
        )
        .await
        .unwrap();
    let marks: Vec<String> = serde_json::from_value(marks).unwrap();
    for want in [
        "drift flagged",
        "retrain (drift",
        "v2.0.0 serving",
        "PSI act",
    ] {
        assert!(
            marks.iter().any(|m| m.starts_with(want)),
            "no {want:?} on the drift charts: {marks:?}"
        );
    }
    let flagged = b.find_all("table.data tbody tr").await.unwrap().len();
    assert!(flagged >= 1, "windows where drift was flagged are listed");
    // Rising: v1's first windows (before the shift, days 11 500 on) are
    // not drifting, later ones are, past the act line (a window's PSI on
    // a couple of seconds of traffic is noisy, so drifting takes several
    // windows over the line in a row: `set_after`).
    let drift = api(&base, token, "/api/v1/models/rainfall/drift?version=1.0.0").await;
    let act = drift["config"]["psi_act"].as_f64().unwrap();
    let windows = drift["series"][0]["windows"].as_array().unwrap();
    assert_eq!(windows[0]["drifting"], false, "{drift}");
    let first = windows
        .iter()
        .position(|w| w["drifting"] == true)
        .unwrap_or_else(|| panic!("v1's drift never set: {drift}"));
    assert!(first > 0, "{drift}");
    assert!(
        windows[first]["severity"].as_f64().unwrap() >= act,
        "{drift}"
    );
    b.page_shot("demo-drift.png").await.unwrap();

    b.close().await.unwrap();
    drop(driver);
}
