//! The console API as the demo uses it: JSON in and out with the admin
//! token, artifacts up and down. Errors carry the method, path, status and
//! the server's message.

use anyhow::Context as _;
use edgeloop_models::Digest;
use serde_json::Value;

#[derive(Clone)]
pub struct Console {
    http: reqwest::Client,
    base: String,
    token: String,
}

impl Console {
    pub fn new(base: String, token: String) -> anyhow::Result<Console> {
        Ok(Console {
            http: reqwest::Client::builder()
                .timeout(std::time::Duration::from_secs(60))
                .build()?,
            base,
            token,
        })
    }

    async fn send(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<&Value>,
    ) -> anyhow::Result<Value> {
        let mut req = self
            .http
            .request(method.clone(), format!("{}{path}", self.base))
            .bearer_auth(&self.token);
        if let Some(b) = body {
            req = req.json(b);
        }
        let resp = req
            .send()
            .await
            .with_context(|| format!("{method} {path}"))?;
        let status = resp.status();
        let v: Value = resp.json().await.unwrap_or(Value::Null);
        anyhow::ensure!(
            status.is_success(),
            "{method} {path}: {status}: {}",
            v["error"]
        );
        Ok(v)
    }

    pub async fn get(&self, path: &str) -> anyhow::Result<Value> {
        self.send(reqwest::Method::GET, path, None).await
    }

    pub async fn post(&self, path: &str, body: Value) -> anyhow::Result<Value> {
        self.send(reqwest::Method::POST, path, Some(&body)).await
    }

    pub async fn put(&self, path: &str, body: Value) -> anyhow::Result<Value> {
        self.send(reqwest::Method::PUT, path, Some(&body)).await
    }

    pub async fn upload(&self, bytes: Vec<u8>) -> anyhow::Result<Digest> {
        let d = Digest::of(&bytes);
        let resp = self
            .http
            .put(format!("{}/api/v1/artifacts/{d}", self.base))
            .bearer_auth(&self.token)
            .body(bytes)
            .send()
            .await
            .context("uploading an artifact")?;
        anyhow::ensure!(
            resp.status().is_success(),
            "uploading artifact {d}: {}",
            resp.status()
        );
        Ok(d)
    }

    pub async fn download(&self, d: &str) -> anyhow::Result<Vec<u8>> {
        let resp = self
            .http
            .get(format!("{}/api/v1/artifacts/{d}", self.base))
            .bearer_auth(&self.token)
            .send()
            .await
            .context("downloading an artifact")?;
        anyhow::ensure!(
            resp.status().is_success(),
            "downloading artifact {d}: {}",
            resp.status()
        );
        Ok(resp.bytes().await?.to_vec())
    }
}

/// Polls `check` every `every` until it returns `Some`, or fails after
/// `timeout` saying what it waited for.
pub async fn wait_for<T, F, Fut>(
    what: &str,
    timeout: std::time::Duration,
    mut check: F,
) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<Option<T>>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if let Some(v) = check().await? {
            return Ok(v);
        }
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
    }
}
