//! Samples as the console API shows them (`/api/v1/models/{name}/samples`):
//! the rows devices sent back (hard examples below the confidence
//! threshold, and predictions that received a label through the feedback
//! API) with their inputs and provenance, and the labelling queue: an
//! unlabelled hard example gets its label here, and labelled samples go
//! into the next retraining snapshot. The store's record is
//! `drift/src/records.rs`.

use serde::{Deserialize, Serialize};
use time::OffsetDateTime;

/// Most labels one bulk request sets.
pub const MAX_BULK_LABELS: usize = 1000;
/// The largest class index a label may name.
pub const MAX_LABEL: i64 = 1_000_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum SampleKind {
    /// Confidence below the device's hard-example threshold; sampled.
    HardExample,
    /// A prediction that received a label through the feedback API.
    Feedback,
}

/// Whether a sample has a label yet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum LabelState {
    Labelled,
    Unlabelled,
}

/// One input tensor of one row.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SampleTensor {
    pub name: String,
    /// NumPy name (`float32`, ...).
    pub dtype: String,
    pub shape: Vec<u64>,
    /// Row-major little-endian bytes, base64 (standard alphabet, padded).
    pub data_base64: String,
}

/// A sample with where it came from: device, version, confidence, time.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SampleView {
    /// Stable, for `GET .../samples/{id}` and labelling:
    /// `<version>:<device>:<report sequence>:<index>`.
    pub id: String,
    pub kind: SampleKind,
    pub model_name: String,
    pub model_version: String,
    pub device: String,
    /// The device's telemetry report that carried it.
    pub sequence: u64,
    /// The inference request (`/<row>` for a row of a batch).
    pub request_id: String,
    #[serde(default, with = "time::serde::rfc3339::option")]
    pub observed_at: Option<OffsetDateTime>,
    pub inputs: Vec<SampleTensor>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub predicted_class: Option<i64>,
    /// The top class's probability as the device computed it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub confidence: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label: Option<i64>,
    /// When and by whom the label was set here (absent for a label that
    /// came with feedback from the device).
    #[serde(
        default,
        with = "time::serde::rfc3339::option",
        skip_serializing_if = "Option::is_none"
    )]
    pub labelled_at: Option<OffsetDateTime>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub labelled_by: Option<String>,
}

/// `POST /api/v1/models/{name}/samples/{id}/label`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct SetLabel {
    /// The true class index.
    #[cfg_attr(feature = "openapi", schema(minimum = 0, maximum = 1000000))]
    pub label: i64,
}

/// One label of a bulk request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct LabelEntry {
    pub id: String,
    #[cfg_attr(feature = "openapi", schema(minimum = 0, maximum = 1000000))]
    pub label: i64,
}

/// `POST /api/v1/models/{name}/samples/labels`: all or nothing: every id
/// must name a sample of the model, or none is labelled.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct SetLabels {
    #[cfg_attr(feature = "openapi", schema(min_items = 1, max_items = 1000))]
    pub labels: Vec<LabelEntry>,
}

/// What a bulk request changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct LabelsSet {
    pub labelled: u64,
}

/// `GET /api/v1/models/{name}/samples/summary`: how many samples the
/// model keeps, how many were dropped for the cap (the oldest first), and
/// the cap. Samples stored before retention was counted are not in these.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SampleSummary {
    pub stored: u64,
    pub dropped: u64,
    pub max_per_model: u64,
}

/// A sample's id from its parts, and back.
pub fn sample_id(version: &str, device: &str, sequence: u64, index: usize) -> String {
    format!("{version}:{device}:{sequence}:{index}")
}

/// The parts of a sample id, if it is one.
pub fn parse_sample_id(id: &str) -> Option<(&str, &str, u64, usize)> {
    let mut parts = id.split(':');
    let (version, device, sequence, index) =
        (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() || version.is_empty() || device.is_empty() {
        return None;
    }
    let digits = |s: &str| !s.is_empty() && s.len() <= 20 && s.bytes().all(|b| b.is_ascii_digit());
    if !digits(sequence) || !digits(index) {
        return None;
    }
    Some((version, device, sequence.parse().ok()?, index.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sample_id_round_trips_and_nothing_else_parses() {
        let id = sample_id("1.2.0+build", "edge-1", 42, 3);
        assert_eq!(parse_sample_id(&id), Some(("1.2.0+build", "edge-1", 42, 3)));
        for bad in [
            "",
            "1:edge:1",
            "1:edge:1:2:3",
            ":edge:1:2",
            "1::1:2",
            "1:edge:x:2",
            "1:edge:1:-2",
            "1:edge:+1:2",
            "1:edge:99999999999999999999999:0",
        ] {
            assert_eq!(parse_sample_id(bad), None, "{bad:?}");
        }
    }
}
