//! [`ModelHost`]: which version of each model serves, and the A/B swap.
//!
//! Each model has a current version and, after a swap, the previous one,
//! kept loaded (its workers idle) so that a rollback is a swap back rather
//! than a reload. Requests take an `Arc` of the current version when they
//! arrive and keep it until answered: a swap replaces the map entry and
//! never touches a request already routed, so requests queued on the old
//! version finish there while new ones go to the new one.

use std::collections::HashMap;
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Instant;

use async_trait::async_trait;
use tokio::sync::oneshot;

use super::batch::batch_key;
use super::error::ServeError;
use super::loader::{Loader, Version};
use super::metrics::{Registry, ServingInfo};
use super::pool::Job;
use super::probe::{check_probe, expected_outputs};
use super::protocol::{datatype_name, MetadataTensor, ModelMetadata};
use crate::config::ServeConfig;
use crate::observe::Observer;
use crate::serving::{ActivationError, ModelServing, PrepareSpec, ProbeSpec, Serving, Timed};
use edgeloop_models::tensor::Tensor;
use std::path::PathBuf;

struct Entry {
    current: Arc<Version>,
    previous: Option<Arc<Version>>,
}

pub struct ModelHost {
    loader: Loader,
    pub(super) observer: Arc<dyn Observer>,
    pub(super) registry: Arc<Registry>,
    models: RwLock<HashMap<String, Entry>>,
    /// One activation at a time: two racing swaps of one model could
    /// otherwise each keep the other's version as "previous".
    activating: tokio::sync::Mutex<()>,
}

impl std::fmt::Debug for ModelHost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModelHost")
            .field("serving", &self.serving_info())
            .finish_non_exhaustive()
    }
}

impl ModelHost {
    /// Serves nothing until sync activates a version. Loads no ONNX Runtime
    /// yet: that happens on the first activation.
    pub fn new(config: ServeConfig, observer: Arc<dyn Observer>) -> Arc<ModelHost> {
        let registry = Arc::new(Registry::default());
        Arc::new(ModelHost {
            loader: Loader::new(config, Arc::clone(&registry)),
            observer,
            registry,
            models: RwLock::new(HashMap::new()),
            activating: tokio::sync::Mutex::new(()),
        })
    }

    pub fn config(&self) -> &ServeConfig {
        self.loader.config()
    }

    /// The version serving `model` (`version`, if given, must be it).
    pub(super) fn resolve(
        &self,
        model: &str,
        version: Option<&str>,
    ) -> Result<Arc<Version>, ServeError> {
        let models = self.models.read().unwrap_or_else(PoisonError::into_inner);
        let current = models
            .get(model)
            .map(|e| &e.current)
            .ok_or_else(|| ServeError::UnknownModel(model.to_string()))?;
        match version {
            Some(v) if v != current.version => Err(ServeError::UnknownVersion {
                model: model.to_string(),
                version: v.to_string(),
            }),
            _ => Ok(Arc::clone(current)),
        }
    }

    /// What serves now, sorted by model.
    pub fn serving_info(&self) -> Vec<ServingInfo> {
        let models = self.models.read().unwrap_or_else(PoisonError::into_inner);
        let mut info: Vec<ServingInfo> = models
            .values()
            .map(|e| ServingInfo {
                model: e.current.model.clone(),
                version: e.current.version.clone(),
                provider: e.current.provider.clone(),
            })
            .collect();
        info.sort_by(|a, b| a.model.cmp(&b.model));
        info
    }

    /// `GET /v2/models/{name}[/versions/{version}]`.
    pub fn metadata(
        &self,
        model: &str,
        version: Option<&str>,
    ) -> Result<ModelMetadata, ServeError> {
        let v = self.resolve(model, version)?;
        let describe = |io: &[edgeloop_models::runtime::IoInfo]| {
            io.iter()
                .map(|i| MetadataTensor {
                    name: i.name.clone(),
                    // `servable` refused versions with other types at load.
                    datatype: i.dtype.map_or("", datatype_name).to_string(),
                    shape: i.shape.iter().map(|d| d.unwrap_or(-1)).collect(),
                })
                .collect()
        };
        Ok(ModelMetadata {
            name: v.model.clone(),
            versions: vec![v.version.clone()],
            platform: "onnxruntime",
            inputs: describe(&v.inputs),
            outputs: describe(&v.outputs),
        })
    }

    /// The Prometheus text exposition of all serving metrics.
    pub fn metrics_text(&self) -> String {
        let mut text = self.registry.render(&self.serving_info());
        text.push_str(&self.observer.metrics_text());
        text
    }

    /// Runs the probe on `version`'s own workers (so a reused standby is
    /// probed exactly like a fresh load).
    async fn probe(&self, version: &Version, spec: &PrepareSpec) -> Result<(), ActivationError> {
        let Some(ProbeSpec {
            inputs,
            max_latency,
        }) = &spec.probe
        else {
            return Ok(());
        };
        let fail = ActivationError::Probe;
        super::infer::check_inputs(&version.inputs, inputs)
            .map_err(|e| fail(format!("sample inputs: {e}")))?;
        let ordered = super::infer::in_model_order(&version.inputs, inputs.clone());
        let batch = match version.inputs.first().map(|i| i.shape.first()) {
            Some(Some(None)) => ordered
                .first()
                .and_then(|(_, t)| t.shape().first().copied()),
            _ => None,
        };
        let (key, rows) = batch_key(&ordered);
        let (reply, answer) = oneshot::channel();
        version
            .pool
            .submit(Job {
                inputs: ordered,
                key,
                rows,
                enqueued: Instant::now(),
                counted: false,
                reply,
            })
            .map_err(|(e, _)| fail(format!("could not queue the probe: {e:?}")))?;
        let result = answer
            .await
            .map_err(|_| fail("the worker running the probe failed".to_string()))?;
        let outputs = result.outputs.map_err(|e| fail(format!("running: {e}")))?;
        let signature = spec.manifest.as_ref().map(|m| &m.signature);
        let expected = expected_outputs(signature, &version.outputs);
        check_probe(&expected, &outputs, batch, result.run_time, *max_latency).map_err(fail)
    }
}

#[async_trait]
impl ModelServing for ModelHost {
    async fn activate(&self, spec: PrepareSpec) -> Result<Serving, ActivationError> {
        let _one_at_a_time = self.activating.lock().await;
        let same = |v: &Version| v.version == spec.version && v.path == spec.path;
        let standby = {
            let models = self.models.read().unwrap_or_else(PoisonError::into_inner);
            match models.get(&spec.model) {
                Some(e) if same(&e.current) => {
                    return Ok(Serving {
                        version: e.current.version.clone(),
                        provider: e.current.provider.clone(),
                    })
                }
                Some(e) => e.previous.as_ref().filter(|p| same(p)).cloned(),
                None => None,
            }
        };
        let version = match standby {
            Some(version) => version,
            None => {
                let loader = self.loader.clone();
                let load_spec = spec.clone();
                tokio::task::spawn_blocking(move || loader.load(&load_spec))
                    .await
                    .map_err(|e| ActivationError::Load(format!("the loading task failed: {e}")))??
                    .into()
            }
        };
        if let Err(e) = self.probe(&version, &spec).await {
            tracing::warn!(model = %spec.model, version = %spec.version, error = %e, "not activated; the serving version stays");
            return Err(e);
        }

        let replaced = {
            let mut models = self.models.write().unwrap_or_else(PoisonError::into_inner);
            let old = models.remove(&spec.model);
            let (previous, dropped) = match old {
                Some(e) => (Some(e.current), e.previous),
                None => (None, None),
            };
            models.insert(
                spec.model.clone(),
                Entry {
                    current: Arc::clone(&version),
                    previous,
                },
            );
            dropped
        };
        // Outside the lock: dropping the last handle closes that pool.
        drop(replaced);
        self.observer
            .model_activated(&version.model, &version.version, spec.manifest.as_ref());
        tracing::info!(
            model = %version.model,
            version = %version.version,
            provider = %version.provider,
            batching = version.batchable,
            "serving"
        );
        Ok(Serving {
            version: version.version.clone(),
            provider: version.provider.clone(),
        })
    }

    fn serving(&self, model: &str) -> Option<Serving> {
        let models = self.models.read().unwrap_or_else(PoisonError::into_inner);
        models.get(model).map(|e| Serving {
            version: e.current.version.clone(),
            provider: e.current.provider.clone(),
        })
    }

    async fn benchmark(
        &self,
        path: PathBuf,
        inputs: Vec<(String, Tensor)>,
        runs: u32,
    ) -> Result<Timed, ActivationError> {
        let loader = self.loader.clone();
        tokio::task::spawn_blocking(move || loader.time(&path, &inputs, runs))
            .await
            .map_err(|e| ActivationError::Load(format!("the benchmark task failed: {e}")))?
    }

    fn describe_host(&self) -> String {
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        let gpu = edgeloop_client_core::gpu::LocalGpus::detect()
            .gpus
            .first()
            .map(|g| format!(", GPU {}", g.name))
            .unwrap_or_default();
        let providers: Vec<String> = self
            .config()
            .providers
            .iter()
            .map(|p| format!("{p:?}"))
            .collect();
        format!(
            "device: {} {}, {cpus} CPUs{gpu}; serving providers {}",
            std::env::consts::OS,
            std::env::consts::ARCH,
            providers.join(",")
        )
    }

    fn unload(&self, model: &str) {
        let removed = self
            .models
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(model);
        if removed.is_some() {
            tracing::info!(model, "unloaded; requests in flight finish first");
        }
    }
}
