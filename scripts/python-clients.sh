#!/usr/bin/env bash
# Creates the Python virtual environment of the standard clients the suite
# tests our protocols with: NVIDIA's `tritonclient` (the Open Inference
# Protocol v2 client most users have), over HTTP (binary tensors by
# default) and gRPC (grpcio and protobuf, raw tensor contents).
#
#   scripts/python-clients.sh
#
# Creates ${EDGELOOP_DEPS:-$HOME/.edgeloop/deps}/pyclients and prints its
# python path on the last line. Idempotent (scripts/lib/venv.sh); the pins
# are scripts/requirements/pyclients.in, hash-locked in pyclients.txt.
#
# A venv of its own: tritonclient 2.73.0 pins ml-dtypes <= 0.5.4, which the
# training venv's onnx stack (ml_dtypes 0.6.0) does not allow. Every package
# is pinned, the transitive ones too; wheels only (about 15 s cold here).
set -euo pipefail
deps="${EDGELOOP_DEPS:-$HOME/.edgeloop/deps}"
venv="$deps/pyclients"
# shellcheck source=lib/venv.sh
. "$(dirname "$0")/lib/venv.sh"
venv_install "$venv" pyclients tritonclient.http tritonclient.grpc numpy
echo "$venv/bin/python"
