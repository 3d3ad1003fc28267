//! Retraining pipelines as the console API shows them.

use serde::{Deserialize, Serialize};

/// A retraining pipeline's steps, in the order they run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum Step {
    /// Original data + edge hard examples + labelled feedback, as a snapshot.
    BuildDataset,
    /// A training job through a trainer bridge, from the model's template.
    Train,
    /// The final checkpoint to ONNX.
    Export,
    /// Quantization behind the accuracy gate, on recent labelled edge data.
    Quantize,
    /// A new model version with full lineage.
    Register,
    /// Promote only if the new version beats the serving one.
    Compare,
    /// A staged rollout.
    Deploy,
    /// The drift reference becomes the new version's statistics.
    ResetReference,
}

impl Step {
    pub const ALL: [Step; 8] = [
        Step::BuildDataset,
        Step::Train,
        Step::Export,
        Step::Quantize,
        Step::Register,
        Step::Compare,
        Step::Deploy,
        Step::ResetReference,
    ];

    /// The step after this one; `None` after the last.
    pub fn next(self) -> Option<Step> {
        let i = Step::ALL.iter().position(|s| *s == self)?;
        Step::ALL.get(i + 1).copied()
    }
}
