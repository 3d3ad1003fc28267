#!/usr/bin/env bash
# Creates the Python virtual environment of the tools that check the
# console API's OpenAPI document against the running control plane:
# `openapi-spec-validator` (is the document valid OpenAPI) and
# `schemathesis` (does the API do what the document says), run by
# tests/it/openapi_conformance.rs.
#
#   scripts/python-apitest.sh
#
# Creates ${EDGELOOP_DEPS:-$HOME/.edgeloop/deps}/pyapitest and prints its
# python path on the last line. Idempotent (scripts/lib/venv.sh).
#
# A venv of its own, so schemathesis's pins (hypothesis, jsonschema,
# pydantic) never meet the training or client venvs'. Every package is
# pinned, the transitive ones too (resolved in a scratch venv with
# `pip freeze`); wheels only.
set -euo pipefail
deps="${EDGELOOP_DEPS:-$HOME/.edgeloop/deps}"
venv="$deps/pyapitest"
# shellcheck source=lib/venv.sh
. "$(dirname "$0")/lib/venv.sh"
venv_install "$venv" pyapitest schemathesis openapi_spec_validator
echo "$venv/bin/python"
