#!/usr/bin/env bash
# The model-over-2-GiB tests (edge-agent/tests/serve/big_model.rs, then
# tests/it/big_model_loop.rs), run by
# scripts/test.sh after the rest of the suite, on its own: it writes ≈2.2 GB
# of weights into a temporary directory (removed at the end), peaks at
# ≈11 GiB of memory and keeps both cores busy for about two minutes, which
# would disturb the serving tests' timings beside it. `cargo test` skips it
# (#[ignore]). Needs ONNX Runtime (scripts/fetch-onnxruntime.sh) and ≈5 GB
# free in $TMPDIR.
set -euo pipefail
cd "$(dirname "$0")/.."
# Say so plainly when the disk is too full, rather than fail half-way
# through writing the weights (a CI run once did, ENOSPC at 2 GB).
tmp="${TMPDIR:-/tmp}"
free_kib="$(df -Pk "$tmp" | awk 'NR == 2 { print $4 }')"
if [ "${free_kib:-0}" -lt $((5 * 1024 * 1024)) ]; then
  echo "test-big-model: needs about 5 GB free in $tmp, has $((free_kib / 1024)) MiB" >&2
  df -h "$tmp" "$(pwd)" >&2
  exit 1
fi
cargo test -p edgeloop-edge-agent --test serve -- --ignored --exact --nocapture \
  big_model::a_model_over_2_gib_is_gated_signed_and_served_from_files
# Then the same model through the CLI, the registry and a real agent
# (tests/it/big_model_loop.rs), which runs the `edgeloop` binary.
cargo build --bins
cargo test -p edgeloop-tests --test it -- --ignored --nocapture big_model_loop::
