#!/usr/bin/env bash
# The model-over-2-GiB test (edge-agent/tests/serve/big_model.rs), which the
# suite skips (#[ignore]): it writes ≈2.2 GB of weights into a temporary
# directory (removed at the end), peaks at ≈10 GB of memory, and its
# per-weight loops (quantizers, tensor conversion) are slow unoptimized.
# So it builds `edgeloop-models` (only that crate) at opt-level 3, in its
# own target directory so the usual build is not flipped back and forth.
# Needs ONNX Runtime (scripts/fetch-onnxruntime.sh) and ≈3 GB free in $TMPDIR.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-target}/big-model"
exec cargo test -p edgeloop-edge-agent --test serve \
  --config 'profile.dev.package.edgeloop-models.opt-level=3' \
  -- --ignored --exact --nocapture \
  big_model::a_model_over_2_gib_is_gated_signed_and_served_from_files
