#!/usr/bin/env bash
# Creates the Python virtual environment used to train the MNIST evaluation
# models (tools/train_mnist.py) and to run ONNX Runtime's own quantizer as the
# side-by-side baseline of ours.
#
#   scripts/python-env.sh
#
# Creates ${EDGELOOP_DEPS:-$HOME/.edgeloop/deps}/pyenv and prints its python
# path on the last line. Idempotent: pip is skipped when the marker records
# exactly the requirement list below (change the list and the next run
# reinstalls).
#
# Every package is pinned, the transitive ones too, so that two machines train
# with the same numpy and export with the same onnx. numpy 2.2.6, onnx 1.22.0
# and onnxruntime 1.31.1 all publish CPython 3.11 manylinux x86_64 wheels
# (onnxruntime 1.31.1 is the library the Rust side loads, see
# scripts/fetch-onnxruntime.sh). Wheels only (--only-binary): nothing is
# compiled on a 2-core machine.
set -euo pipefail

# The directory models/src/deps.rs resolves, so Rust tests find what this installs.
deps="${EDGELOOP_DEPS:-$HOME/.edgeloop/deps}"
venv="$deps/pyenv"
python="${PYTHON:-python3}"

requirements="numpy==2.2.6
onnx==1.22.0
onnxruntime==1.31.1
flatbuffers==25.12.19
ml_dtypes==0.6.0
packaging==26.4
protobuf==7.36.2
typing_extensions==4.16.0
pillow==13.0.0"

marker="$venv/.edgeloop-requirements.txt"

if [ -x "$venv/bin/python" ] && [ -f "$marker" ] && [ "$(cat "$marker")" = "$requirements" ]; then
  echo "$venv/bin/python"
  exit 0
fi

command -v "$python" >/dev/null || { echo "python-env.sh: $python is required" >&2; exit 1; }

mkdir -p "$deps"
if [ ! -x "$venv/bin/python" ]; then
  echo "==> creating venv $venv" >&2
  "$python" -m venv "$venv" >&2
fi

# The marker goes only after a successful install, so an interrupted run is
# retried in full the next time.
rm -f "$marker"
echo "==> installing the pinned requirements" >&2
req_file="$(mktemp)"
trap 'rm -f "$req_file"' EXIT
printf '%s\n' "$requirements" >"$req_file"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
  --only-binary=:all: -r "$req_file" >&2
"$venv/bin/python" -c 'import numpy, onnx, onnxruntime' >&2
printf '%s' "$requirements" >"$marker"

echo "$venv/bin/python"
