//! What the serving path tells the telemetry side about each request. The
//! seam between `serve` (which must stay fast) and `telemetry` (sketches,
//! feedback, hard examples, store-and-forward): `observe` is called once per
//! request on the request's task, so an implementation must not block.

use std::time::Duration;

use edgeloop_models::manifest::Manifest;
use edgeloop_models::tensor::Tensor;

/// One finished inference request.
#[derive(Debug)]
pub struct Observation<'a> {
    pub model: &'a str,
    pub version: &'a str,
    /// The request's `id` (the client's, or one the agent assigned and returned).
    pub request_id: &'a str,
    /// The request's inputs, by name, as sent (batch dimension included).
    pub inputs: &'a [(String, Tensor)],
    /// The outputs, by name, in the model's output order; empty when `ok` is false.
    pub outputs: &'a [(String, Tensor)],
    pub latency: Duration,
    pub ok: bool,
}

pub trait Observer: Send + Sync + 'static {
    /// A version starts serving; `manifest` carries its reference statistics.
    fn model_activated(&self, model: &str, version: &str, manifest: Option<&Manifest>);
    fn observe(&self, observation: &Observation<'_>);
    /// The observer's own lines for `/metrics` (Prometheus text).
    fn metrics_text(&self) -> String {
        String::new()
    }
}

/// Records nothing.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoopObserver;

impl Observer for NoopObserver {
    fn model_activated(&self, _: &str, _: &str, _: Option<&Manifest>) {}
    fn observe(&self, _: &Observation<'_>) {}
}
