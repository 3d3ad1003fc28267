//! The BuildDataset step: the policy's base window and the model's
//! labelled edge samples (feedback, and hard examples labelled through the
//! queue, weighted) as one `.npz` snapshot in the artifact store.

use super::*;

/// One sample's shape, from a manifest's first input (its batch axis
/// dropped); every other axis must be fixed.
fn sample_shape(m: &SignedManifest) -> Option<Vec<usize>> {
    let input = m.manifest.signature.inputs.first()?;
    input
        .shape
        .iter()
        .skip(1)
        .map(|d| match d {
            DimSpec::Fixed(n) => usize::try_from(*n).ok(),
            DimSpec::Symbolic(_) => None,
        })
        .collect()
}

/// The snapshot, or `Ok(None)` while the policy's `min_fresh_edge_rows`
/// are not there yet (the step polls again next tick, within its timeout).
pub(super) async fn build_dataset(
    core: &Core,
    p: &Pipeline,
    config: &RetrainingConfig,
) -> Result<Option<Output>, StepError> {
    let base = match config.base_dataset {
        Some(d) => {
            let bytes = read_artifact(core, d).await?;
            let window = config.base_window_rows;
            Some(
                blocking(move || {
                    let npz = Npz::from_bytes(&bytes)
                        .map_err(|e| StepError::fatal(format!("base dataset {d}: {e}")))?;
                    let rows = Rows::from_npz(&npz).map_err(StepError::fatal)?;
                    Ok(match window {
                        Some(n) => rows.tail(n as usize),
                        None => rows,
                    })
                })
                .await?,
            )
        }
        None => None,
    };
    let serving = serving_version(core, &p.model)?;
    let from_manifest = match &serving {
        Some(v) => manifest_of(core, v).await?.as_ref().and_then(sample_shape),
        None => None,
    };
    let shape = from_manifest
        .or_else(|| base.as_ref().map(|b| b.sample_shape.clone()))
        .ok_or_else(|| {
            StepError::fatal(
                "the input shape is unknown: the serving version has no manifest with fixed input dims, \
                 and the policy names no base_dataset",
            )
        })?;
    let store = core.store.clone();
    let prefix = format!("{}/", p.model);
    let (eval_fraction, min_eval) = (config.eval_fraction, config.min_eval_samples);
    let hard_weight = config.hard_example_weight;
    let edge_window = config.edge_window_rows.map_or(usize::MAX, |n| n as usize);
    // Rows received after the second the pipeline's first step started in
    // are fresh (its start is recorded to the second; a row received in
    // that same second may have been there before it).
    let started = p
        .history
        .first()
        .map_or(0, |r| (i128::from(r.started_at) + 1) * 1_000_000_000 - 1);
    let min_fresh = config.min_fresh_edge_rows.map_or(0, |n| n as usize);
    let snapshot = blocking(move || {
        let records: Vec<_> = store
            .drift
            .samples
            .scan_prefix(&prefix)?
            .into_iter()
            .map(|(_, v)| v)
            .collect();
        let width = shape.iter().product();
        let (mut edge, skipped) = dataset::edge_rows(&records, Some(width));
        let fresh = dataset::fresh_rows(&edge, started);
        if fresh < min_fresh {
            tracing::debug!(
                fresh,
                min_fresh,
                "waiting for labelled rows observed since the pipeline started"
            );
            return Ok(None);
        }
        edge.drain(..edge.len().saturating_sub(edge_window));
        if skipped > 0 {
            tracing::warn!(
                skipped,
                "labelled samples that do not fit the model's input were left out"
            );
        }
        let snap = dataset::build(
            base.as_ref(),
            &edge,
            &shape,
            eval_fraction,
            min_eval,
            hard_weight,
        )
        .map_err(StepError::fatal)?;
        let bytes = snap
            .npz
            .to_bytes()
            .map_err(|e| StepError::transient(format!("encoding the snapshot: {e}")))?;
        Ok(Some((
            snap.train_rows,
            snap.eval_rows,
            snap.edge_rows,
            snap.hard_examples,
            bytes,
        )))
    })
    .await?;
    let Some((rows, eval_rows, edge_rows, hard_examples, bytes)) = snapshot else {
        return Ok(None);
    };
    let d = put_artifact(core, bytes).await?;
    Ok(Some(Output::Dataset {
        digest: d,
        rows: rows as u64,
        eval_rows: eval_rows as u64,
        edge_rows: edge_rows as u64,
        hard_examples: hard_examples as u64,
    }))
}
