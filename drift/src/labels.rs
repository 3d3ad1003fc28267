//! The labelling queue over the samples devices send: a sample's id (its
//! key without the model), the view with its provenance, and labels set
//! one at a time or in bulk. A labelled sample is what the retraining
//! pipeline's dataset step reads (`retrain/dataset.rs::edge_rows`), so a
//! hard example labelled here reaches the next snapshot.

use edgeloop_api::samples::{
    parse_sample_id, sample_id, LabelEntry, LabelState, SampleKind, SampleTensor, SampleView,
    MAX_BULK_LABELS, MAX_LABEL,
};
use time::OffsetDateTime;

use super::records::{record_key, SampleRecord};
use crate::Trees;
use edgeloop_errors::{Error, Result};

/// The store key of sample `id` of `model`, or a 404 naming it (a
/// malformed id names no sample).
pub fn key_of(model: &str, id: &str) -> Result<String> {
    let (version, device, sequence, index) =
        parse_sample_id(id).ok_or_else(|| Error::not_found("sample", id))?;
    Ok(record_key(model, version, device, sequence, index))
}

/// The view of the record stored under `key`.
pub fn view(key: &str, r: SampleRecord) -> SampleView {
    let index = key
        .rsplit('/')
        .next()
        .and_then(|i| i.parse().ok())
        .unwrap_or(0);
    SampleView {
        id: sample_id(&r.model_version, &r.device, r.sequence, index),
        kind: r.kind,
        model_name: r.model_name,
        model_version: r.model_version,
        device: r.device,
        sequence: r.sequence,
        request_id: r.request_id,
        observed_at: r.observed_at,
        inputs: r
            .inputs
            .into_iter()
            .map(|t| SampleTensor {
                name: t.name,
                dtype: t.dtype,
                shape: t.shape,
                data_base64: t.data_base64,
            })
            .collect(),
        predicted_class: r.predicted_class,
        confidence: r.confidence,
        label: r.label,
        labelled_at: r.labelled_at,
        labelled_by: r.labelled_by,
    }
}

/// Which samples a listing keeps (besides version, device and sequence,
/// which the caller's scan and filter handle).
pub fn wanted(r: &SampleRecord, kind: Option<SampleKind>, state: Option<LabelState>) -> bool {
    kind.is_none_or(|k| k == r.kind)
        && match state {
            None => true,
            Some(LabelState::Labelled) => r.label.is_some(),
            Some(LabelState::Unlabelled) => r.label.is_none(),
        }
}

fn check_label(field: &str, label: i64) -> Result<()> {
    if !(0..=MAX_LABEL).contains(&label) {
        return Err(Error::bad_field(
            field,
            format!("a class index from 0 to {MAX_LABEL}, got {label}"),
        ));
    }
    Ok(())
}

pub fn get(store: &Trees, model: &str, id: &str) -> Result<SampleView> {
    let key = key_of(model, id)?;
    let r = store
        .samples
        .get(&key)?
        .ok_or_else(|| Error::not_found("sample", id))?;
    Ok(view(&key, r))
}

/// Labels one sample (relabelling replaces the label, and records who and
/// when). Not durable until the caller flushes.
pub fn label(
    store: &Trees,
    model: &str,
    id: &str,
    label: i64,
    by: &str,
    now: OffsetDateTime,
) -> Result<SampleView> {
    check_label("label", label)?;
    let key = key_of(model, id)?;
    let stored = store.samples.update(&key, |old| {
        let mut r = old.ok_or_else(|| Error::not_found("sample", id))?;
        r.label = Some(label);
        r.labelled_at = Some(now);
        r.labelled_by = Some(by.to_string());
        Ok::<_, Error>(r)
    })??;
    super::aggregates::labelled::on_labelled(store, &key, &stored)?;
    Ok(view(&key, stored))
}

/// Labels every entry, or none: each id must name a sample of `model` and
/// each label be a class index, checked before anything is written.
pub fn label_all(
    store: &Trees,
    model: &str,
    entries: &[LabelEntry],
    by: &str,
    now: OffsetDateTime,
) -> Result<u64> {
    if entries.is_empty() || entries.len() > MAX_BULK_LABELS {
        return Err(Error::bad_field(
            "labels",
            format!("give 1 to {MAX_BULK_LABELS} labels, got {}", entries.len()),
        ));
    }
    let mut keys = Vec::with_capacity(entries.len());
    for (i, e) in entries.iter().enumerate() {
        check_label(&format!("labels[{i}].label"), e.label)?;
        let key = key_of(model, &e.id)
            .ok()
            .filter(|k| store.samples.contains(k).unwrap_or(false))
            .ok_or_else(|| {
                Error::bad_field(
                    format!("labels[{i}].id"),
                    format!("{:?} is not a sample of model {model}", e.id),
                )
            })?;
        keys.push(key);
    }
    for (key, e) in keys.iter().zip(entries) {
        // Checked above; a sample deleted since (retention) is skipped,
        // not an error: its label has nothing left to label.
        let stored = store.samples.update(key, |old| {
            let mut r = old.ok_or(())?;
            r.label = Some(e.label);
            r.labelled_at = Some(now);
            r.labelled_by = Some(by.to_string());
            Ok::<_, ()>(r)
        })?;
        if let Ok(r) = stored {
            super::aggregates::labelled::on_labelled(store, key, &r)?;
        }
    }
    Ok(entries.len() as u64)
}
