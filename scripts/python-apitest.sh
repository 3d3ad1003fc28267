#!/usr/bin/env bash
# Creates the Python virtual environment of the tools that check the
# console API's OpenAPI document against the running control plane:
# `openapi-spec-validator` (is the document valid OpenAPI) and
# `schemathesis` (does the API do what the document says), run by
# tests/tests/openapi_conformance.rs.
#
#   scripts/python-apitest.sh
#
# Creates ${EDGELOOP_DEPS:-$HOME/.edgeloop/deps}/pyapitest and prints its
# python path on the last line. Idempotent like scripts/python-clients.sh:
# pip runs only when the marker differs from the requirement list below.
#
# A venv of its own, so schemathesis's pins (hypothesis, jsonschema,
# pydantic) never meet the training or client venvs'. Every package is
# pinned, the transitive ones too (resolved in a scratch venv with
# `pip freeze`); wheels only.
set -euo pipefail
deps="${EDGELOOP_DEPS:-$HOME/.edgeloop/deps}"
venv="$deps/pyapitest"
python="${PYTHON:-python3}"
requirements="schemathesis==4.32.5
openapi-spec-validator==0.9.0
annotated-types==0.8.0
anyio==4.16.0
attrs==26.1.0
certifi==2026.10.19.post1
charset-normalizer==3.5.3
click==8.5.1
graphql-core==3.3.2
harfile==0.6.0
hypothesis==6.170.17
hypothesis-graphql==0.13.5
idna==3.20
iniconfig==2.3.1
jsonschema==4.26.0
jsonschema-path==0.5.0
jsonschema-specifications==2025.9.1
jsonschema_rs==0.60.3
lazy-object-proxy==1.13.0
markdown-it-py==4.3.0
MarkupSafe==3.0.4
mdurl==0.1.2
openapi-schema-validator==0.9.0
packaging==26.4
pathable==0.6.0
pluggy==1.7.0
pydantic==2.14.4
pydantic-settings==2.16.3
pydantic_core==2.50.5
Pygments==2.21.0
pyrate-limiter==4.5.1
pytest==9.2.0
python-dotenv==1.2.4
PyYAML==6.0.4
referencing==0.37.0
requests==2.34.2
rfc3339-validator==0.1.4
rich==15.0.0
rpds-py==2026.9.1
six==1.17.0
sortedcontainers==2.4.0
typing-inspection==0.4.5
typing_extensions==4.16.0
urllib3==2.8.0
Werkzeug==3.1.9"
marker="$venv/.edgeloop-requirements.txt"
if [ -x "$venv/bin/python" ] && [ -f "$marker" ] && [ "$(cat "$marker")" = "$requirements" ]; then
  echo "$venv/bin/python"
  exit 0
fi
command -v "$python" >/dev/null || { echo "python-apitest.sh: $python is required" >&2; exit 1; }
mkdir -p "$deps"
if [ ! -x "$venv/bin/python" ]; then
  echo "==> creating venv $venv" >&2
  "$python" -m venv "$venv" >&2
fi
rm -f "$marker"
echo "==> installing the pinned API test requirements" >&2
req_file="$(mktemp)"
trap 'rm -f "$req_file"' EXIT
printf '%s\n' "$requirements" >"$req_file"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
  --only-binary=:all: -r "$req_file" >&2
"$venv/bin/python" -c 'import schemathesis, openapi_spec_validator' >&2
printf '%s' "$requirements" >"$marker"
echo "$venv/bin/python"
