#!/usr/bin/env bash
# Creates the Python virtual environment used to train the MNIST evaluation
# models (tools/train_mnist.py) and to run ONNX Runtime's own quantizer as the
# side-by-side baseline of ours.
#
#   scripts/python-env.sh
#
# Creates ${EDGELOOP_DEPS:-$HOME/.edgeloop/deps}/pyenv and prints its python
# path on the last line. Idempotent: pip is skipped when the venv's marker
# holds the lock file's sha256 (scripts/lib/venv.sh).
#
# Every package is pinned (scripts/requirements/pyenv.in, hash-locked in
# pyenv.txt), the transitive ones too, so that two machines train
# with the same numpy and export with the same onnx. numpy 2.2.6, onnx 1.22.0
# and onnxruntime 1.31.1 all publish CPython 3.11 manylinux x86_64 wheels
# (onnxruntime 1.31.1 is the library the Rust side loads, see
# scripts/fetch-onnxruntime.sh). Wheels only (--only-binary): nothing is
# compiled on a 2-core machine.
set -euo pipefail

# The directory models/src/deps.rs resolves, so Rust tests find what this installs.
deps="${EDGELOOP_DEPS:-$HOME/.edgeloop/deps}"
venv="$deps/pyenv"

# shellcheck source=lib/venv.sh
. "$(dirname "$0")/lib/venv.sh"
venv_install "$venv" pyenv numpy onnx onnxruntime
echo "$venv/bin/python"
