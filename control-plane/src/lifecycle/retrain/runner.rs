//! The thin task around [`crate::lifecycle::pipeline::advance`]: every tick it
//! polls each running pipeline's current step, feeds the result to the pure
//! state machine, and saves the result with a compare-and-swap, so a cancel
//! that landed meanwhile wins over what the step found. Aborts (a cancel, a
//! failed step) stop the step's job or rollout. A pipeline that ended gives
//! its model's retraining slot back. After a restart the same loop simply
//! polls the persisted step again; every executor is idempotent.

use std::sync::Arc;
use std::time::Duration;

use time::OffsetDateTime;
use tokio_util::sync::CancellationToken;

use super::steps::{self, StepError};
use crate::lifecycle::pipeline::{advance, Action, Event, Pipeline, PipelineState};
use crate::Core;
use edgeloop_errors::Result;

/// Runs until `shutdown`, one tick every `interval`.
pub async fn run(core: Arc<Core>, interval: Duration, shutdown: CancellationToken) {
    loop {
        // Another replica runs it while it holds the lease.
        if core.leader.leads(crate::leader::Task::Pipelines) {
            if let Err(e) = tick(&core, OffsetDateTime::now_utc()).await {
                tracing::error!(error = %e, "pipeline tick failed; retrying next tick");
            }
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(interval) => {}
        }
    }
}

/// One pass: every running pipeline advances by at most one event, and
/// every ended one that still holds its model's slot is cleaned up.
pub async fn tick(core: &Core, now: OffsetDateTime) -> Result<()> {
    // Taken once: a tick that outlives this replica's lease saves nothing
    // over the new leader's work.
    let fence = core.leader.fence(crate::leader::Task::Pipelines);
    for p in core.store.lifecycle.pipelines.values()? {
        let id = p.id.clone();
        let result = if p.state.is_terminal() {
            release(core, &p, now).await
        } else {
            step(core, p, now, fence).await
        };
        if let Err(e) = result {
            tracing::error!(pipeline = %id, error = %e, "advancing pipeline");
        }
    }
    Ok(())
}

async fn step(
    core: &Core,
    p: Pipeline,
    now: OffsetDateTime,
    fence: Option<edgeloop_store::Fence>,
) -> Result<()> {
    let PipelineState::Running { step, attempt, .. } = p.state else {
        return Ok(());
    };
    let event = match steps::poll(core, &p, step, attempt, now).await {
        Ok(Some(output)) => Event::Succeeded(output),
        Ok(None) => Event::Tick,
        Err(StepError { reason, retryable }) => {
            tracing::warn!(pipeline = %p.id, ?step, attempt, %reason, retryable, "step failed");
            Event::Failed { reason, retryable }
        }
    };
    let (next, actions) = advance(&p, event, now.unix_timestamp());
    if next == p {
        return Ok(());
    }
    let saved =
        core.store.update_fenced(
            &core.store.lifecycle.pipelines,
            fence,
            &p.id,
            |cur| match cur {
                Some(cur) if cur == p => Ok(next.clone()),
                // Cancelled (or otherwise changed) while the step ran: what the
                // step found no longer applies; the next tick starts from the
                // new state.
                _ => Err(()),
            },
        )?;
    match saved {
        Ok(_) => {}
        Err(edgeloop_store::NotWritten::Refused(())) => return Ok(()),
        Err(edgeloop_store::NotWritten::FencedOut(f)) => {
            return Err(crate::leader::not_written(
                edgeloop_store::NotWritten::FencedOut(f),
            ))
        }
    }
    core.store.flush().await?;
    if let PipelineState::Running {
        step: s,
        attempt: a,
        ..
    } = next.state
    {
        if (s, a) != (step, attempt) {
            tracing::info!(pipeline = %next.id, step = ?s, attempt = a, "pipeline step started");
        }
    }
    for action in actions {
        if let Action::Abort { step } = action {
            steps::abort(core, &next, step, now).await?;
        }
    }
    if next.state.is_terminal() {
        tracing::info!(pipeline = %next.id, state = ?next.state, "pipeline ended");
        release(core, &next, now).await?;
    }
    Ok(())
}

/// For an ended pipeline: stops what its last step started (a cancel
/// through the API only recorded the decision) and frees the model's slot.
async fn release(core: &Core, p: &Pipeline, now: OffsetDateTime) -> Result<()> {
    if core
        .store
        .lifecycle
        .pipeline_active
        .get(&p.model)?
        .as_deref()
        != Some(p.id.as_str())
    {
        return Ok(());
    }
    let last = match &p.state {
        PipelineState::Cancelled { step }
        | PipelineState::Failed { step, .. }
        | PipelineState::Stopped { step, .. } => Some(*step),
        _ => None,
    };
    if let Some(step) = last {
        steps::abort(core, p, step, now).await?;
    }
    // Only while it is still this pipeline's: a new retrain may have taken
    // the slot over already.
    if core
        .store
        .lifecycle
        .pipeline_active
        .remove_if_eq(&p.model, &p.id)?
    {
        core.store.flush().await?;
    }
    Ok(())
}
