//! One inference request from arrival to answer: inputs checked against
//! the model before they are queued (so a bad request never shares a batch
//! with good ones), the job queued on the version it was routed to, the
//! requested outputs picked, and the outcome counted and observed.

use std::sync::Arc;
use std::time::Instant;

use edgeloop_models::runtime::IoInfo;
use edgeloop_models::tensor::Tensor;
use tokio::sync::oneshot;

use super::batch::batch_key;
use super::error::ServeError;
use super::host::ModelHost;
use super::loader::Version;
use super::pool::{Job, Named};
use super::protocol::{
    checked_shape, datatype_name, parse_datatype, supported_datatypes, to_tensor, RequestInput,
};
use crate::observe::Observation;

/// A request in tensors, for callers in this process.
#[derive(Debug, Clone, Default)]
pub struct InferRequest {
    /// The caller's id; one is generated when `None`.
    pub id: Option<String>,
    pub inputs: Named,
    /// The outputs wanted, in this order; `None` for all, in model order.
    pub outputs: Option<Vec<String>>,
}

#[derive(Debug, Clone)]
pub struct InferResponse {
    pub model: String,
    pub version: String,
    pub id: String,
    pub outputs: Named,
}

/// A fresh request id: a random UUID (version 4), unique across restarts,
/// since feedback refers back to it.
pub fn new_request_id() -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut b = rand::random::<[u8; 16]>();
    b[6] = (b[6] & 0x0f) | 0x40; // version 4
    b[8] = (b[8] & 0x3f) | 0x80; // RFC 4122 variant
                                 // Written by hand, not with `format!` per byte: every request without
                                 // an id (tritonclient sends none by default) pays for this.
    let mut id = String::with_capacity(36);
    for (i, x) in b.iter().enumerate() {
        if matches!(i, 4 | 6 | 8 | 10) {
            id.push('-');
        }
        id.push(char::from(HEX[usize::from(x >> 4)]));
        id.push(char::from(HEX[usize::from(x & 0x0f)]));
    }
    id
}

impl ModelHost {
    /// Runs one request on the version serving `model` (or `version`, which
    /// must be the serving one).
    pub async fn infer(
        &self,
        model: &str,
        version: Option<&str>,
        request: InferRequest,
    ) -> Result<InferResponse, ServeError> {
        let started = Instant::now();
        let target = self.resolve(model, version)?;
        let id = request.id.unwrap_or_else(new_request_id);
        let (inputs, result) = execute(&target, request.inputs, request.outputs).await;
        self.record(&target, &id, &inputs, &result, started);
        Ok(InferResponse {
            model: target.model.clone(),
            version: target.version.clone(),
            id,
            outputs: result?,
        })
    }

    /// What every front end (REST, gRPC) does once a request is routed to
    /// `target` and its body decoded: run it, answer with `respond`, then
    /// count and observe it whatever the outcome (so the latency includes
    /// writing the answer). A decoding error takes the same way, so a bad
    /// request is counted like any other.
    pub(super) async fn run_routed<T>(
        &self,
        target: &Arc<Version>,
        id: &str,
        decoded: Result<(Named, Option<Vec<String>>), ServeError>,
        started: Instant,
        respond: impl FnOnce(&Result<Named, ServeError>) -> T,
    ) -> T {
        let (inputs, result) = match decoded {
            Ok((inputs, outputs)) => execute(target, inputs, outputs).await,
            Err(e) => (Vec::new(), Err(e)),
        };
        let answer = respond(&result);
        self.record(target, id, &inputs, &result, started);
        answer
    }

    /// Counts the finished request and tells the observer (also for errors).
    pub(super) fn record(
        &self,
        version: &Version,
        id: &str,
        inputs: &[(String, Tensor)],
        result: &Result<Named, ServeError>,
        started: Instant,
    ) {
        let latency = started.elapsed();
        let ok = result.is_ok();
        version.metrics.request(latency, ok);
        self.observer.observe(&Observation {
            model: &version.model,
            version: &version.version,
            request_id: id,
            inputs,
            outputs: result.as_deref().unwrap_or(&[]),
            latency,
            ok,
        });
    }
}

/// Checks, queues and awaits one request on `version`. Gives the inputs back
/// (for the observer) with the outputs or the error.
async fn execute(
    version: &Arc<Version>,
    inputs: Named,
    outputs: Option<Vec<String>>,
) -> (Named, Result<Named, ServeError>) {
    if let Err(e) = check_inputs(&version.inputs, &inputs) {
        return (inputs, Err(e));
    }
    let wanted = match select_outputs(&version.outputs, outputs) {
        Ok(w) => w,
        Err(e) => return (inputs, Err(e)),
    };
    let inputs = in_model_order(&version.inputs, inputs);
    let (key, rows) = if version.batchable {
        batch_key(&inputs)
    } else {
        (None, 1)
    };
    let (reply, answer) = oneshot::channel();
    let job = Job {
        inputs,
        key,
        rows,
        enqueued: Instant::now(),
        counted: true,
        reply,
    };
    // `Closed` cannot happen here (this request holds the version, so its
    // pool is open), but either way the answer is "try again".
    if let Err((_, job)) = version.pool.submit(job) {
        let err = ServeError::QueueFull {
            model: version.model.clone(),
            capacity: version.pool.capacity(),
        };
        return (job.inputs, Err(err));
    }
    let Ok(result) = answer.await else {
        return (
            Vec::new(),
            Err(ServeError::Inference("the model worker failed".into())),
        );
    };
    let outputs = result
        .outputs
        .map_err(ServeError::Inference)
        .map(|all| pick(all, wanted.as_deref()));
    (result.inputs, outputs)
}

/// Every model input given once, with the model's dtype, rank and fixed
/// dimensions; nothing else.
pub(super) fn check_inputs(model: &[IoInfo], given: &[(String, Tensor)]) -> Result<(), ServeError> {
    for (i, (name, tensor)) in given.iter().enumerate() {
        let bad = |reason: String| ServeError::BadInput {
            name: name.clone(),
            reason,
        };
        if given[..i].iter().any(|(n, _)| n == name) {
            return Err(bad("given more than once".into()));
        }
        let Some(io) = model.iter().find(|io| io.name == *name) else {
            let names: Vec<String> = model.iter().map(|io| format!("`{}`", io.name)).collect();
            return Err(bad(format!(
                "the model has no such input; its inputs are {}",
                names.join(", ")
            )));
        };
        if io.dtype != Some(tensor.dtype()) {
            return Err(bad(format!(
                "the model expects datatype {}, got {}",
                io.dtype.map_or("(unsupported)", datatype_name),
                datatype_name(tensor.dtype())
            )));
        }
        let shape = tensor.shape();
        let fits = shape.len() == io.shape.len()
            && io.shape.iter().zip(shape).all(|(want, &got)| {
                want.is_none_or(|w| u64::try_from(w).ok() == u64::try_from(got).ok())
            });
        if !fits {
            let want: Vec<i64> = io.shape.iter().map(|d| d.unwrap_or(-1)).collect();
            return Err(bad(format!(
                "the model expects shape {want:?} (-1: any size), got {shape:?}"
            )));
        }
    }
    if let Some(missing) = model
        .iter()
        .find(|io| !given.iter().any(|(n, _)| *n == io.name))
    {
        return Err(ServeError::BadInput {
            name: missing.name.clone(),
            reason: "missing: the model requires it".into(),
        });
    }
    Ok(())
}

/// Reorders checked inputs into the model's input order (batches join
/// inputs by position).
pub(super) fn in_model_order(model: &[IoInfo], given: Named) -> Named {
    let mut slots: Vec<Option<(String, Tensor)>> = given.into_iter().map(Some).collect();
    model
        .iter()
        .filter_map(|io| {
            slots
                .iter_mut()
                .find(|s| s.as_ref().is_some_and(|(n, _)| *n == io.name))
                .and_then(Option::take)
        })
        .collect()
}

/// The indices (into the model's outputs) of the outputs asked for.
fn select_outputs(
    model: &[IoInfo],
    wanted: Option<Vec<String>>,
) -> Result<Option<Vec<usize>>, ServeError> {
    let Some(wanted) = wanted else {
        return Ok(None);
    };
    let mut indices = Vec::with_capacity(wanted.len());
    for (i, name) in wanted.iter().enumerate() {
        let bad = |reason: String| ServeError::BadOutput {
            name: name.clone(),
            reason,
        };
        if wanted[..i].contains(name) {
            return Err(bad("requested more than once".into()));
        }
        let Some(index) = model.iter().position(|o| o.name == *name) else {
            let names: Vec<String> = model.iter().map(|o| format!("`{}`", o.name)).collect();
            return Err(bad(format!(
                "the model has no such output; its outputs are {}",
                names.join(", ")
            )));
        };
        indices.push(index);
    }
    Ok(Some(indices))
}

fn pick(all: Named, wanted: Option<&[usize]>) -> Named {
    let Some(wanted) = wanted else {
        return all;
    };
    let mut all: Vec<Option<(String, Tensor)>> = all.into_iter().map(Some).collect();
    wanted
        .iter()
        .filter_map(|&i| all.get_mut(i).and_then(Option::take))
        .collect()
}

/// The protocol's inputs as tensors: datatype known, shape valid, and
/// exactly as many elements (JSON) or bytes (binary data, taken from
/// `binary` in input order) as the shape holds.
pub(super) fn decode_inputs(
    inputs: Vec<RequestInput<'_>>,
    binary: &[u8],
) -> Result<Named, ServeError> {
    let mut cursor = super::binary::Cursor::new(binary);
    let named = inputs
        .into_iter()
        .map(|input| {
            let bad = |reason: String| ServeError::BadInput {
                name: input.name.clone(),
                reason,
            };
            let dtype = parse_datatype(&input.datatype).ok_or_else(|| {
                bad(format!(
                    "datatype {:?} is not supported; use one of {}",
                    input.datatype,
                    supported_datatypes()
                ))
            })?;
            let (shape, _) = checked_shape(&input.shape).map_err(bad)?;
            let tensor = match (input.data, input.parameters.binary_data_size) {
                (Some(data), None) => to_tensor(dtype, shape, data.get()).map_err(bad)?,
                (None, Some(size)) => {
                    let bytes = cursor.take(size).map_err(bad)?;
                    super::binary::to_tensor(dtype, shape, bytes).map_err(bad)?
                }
                (Some(_), Some(_)) => {
                    return Err(bad("has both data and binary_data_size".into()));
                }
                (None, None) => {
                    return Err(bad(
                        "has no data (JSON) and no parameters.binary_data_size (binary)".into(),
                    ))
                }
            };
            Ok((input.name, tensor))
        })
        .collect::<Result<Named, ServeError>>()?;
    cursor.finish().map_err(ServeError::BadBody)?;
    Ok(named)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn request_ids_are_uuid_v4() {
        let a = new_request_id();
        assert_eq!(a.len(), 36);
        assert_eq!(&a[14..15], "4", "{a}");
        assert!(matches!(&a[19..20], "8" | "9" | "a" | "b"), "{a}");
        for (i, c) in a.chars().enumerate() {
            let dash = matches!(i, 8 | 13 | 18 | 23);
            assert_eq!(c == '-', dash, "{a}");
            assert!(
                dash || c.is_ascii_hexdigit() && !c.is_ascii_uppercase(),
                "{a}"
            );
        }
        assert_ne!(a, new_request_id());
    }
}
