#!/usr/bin/env bash
# Creates the Python virtual environment of the standard clients the suite
# tests our protocols with: NVIDIA's `tritonclient` (the Open Inference
# Protocol v2 client most users have), over HTTP (binary tensors by
# default) and gRPC (grpcio and protobuf, raw tensor contents).
#
#   scripts/python-clients.sh
#
# Creates ${EDGELOOP_DEPS:-$HOME/.edgeloop/deps}/pyclients and prints its
# python path on the last line. Idempotent like scripts/python-env.sh: pip
# runs only when the marker differs from the requirement list below.
#
# A venv of its own: tritonclient 2.73.0 pins ml-dtypes <= 0.5.4, which the
# training venv's onnx stack (ml_dtypes 0.6.0) does not allow. Every package
# is pinned, the transitive ones too; wheels only (about 15 s cold here).
set -euo pipefail
deps="${EDGELOOP_DEPS:-$HOME/.edgeloop/deps}"
venv="$deps/pyclients"
python="${PYTHON:-python3}"
requirements="tritonclient[http,grpc]==2.73.0
aiohappyeyeballs==2.7.1
aiohttp==3.14.5
aiosignal==1.4.0
attrs==26.1.0
brotli==1.2.1
certifi==2026.10.19.post1
frozenlist==1.8.0
gevent==26.9.0
geventhttpclient==2.6.1
greenlet==3.3.2
grpcio==1.85.3
idna==3.20
ml_dtypes==0.5.4
multidict==7.2.1
numpy==2.4.6
packaging==26.4
propcache==0.5.4
protobuf==6.33.6
python-rapidjson==1.25
typing_extensions==4.16.0
urllib3==2.8.0
yarl==1.25.1
zope.event==6.2
zope.interface==8.7"
marker="$venv/.edgeloop-requirements.txt"
if [ -x "$venv/bin/python" ] && [ -f "$marker" ] && [ "$(cat "$marker")" = "$requirements" ]; then
  echo "$venv/bin/python"
  exit 0
fi
command -v "$python" >/dev/null || { echo "python-clients.sh: $python is required" >&2; exit 1; }
mkdir -p "$deps"
if [ ! -x "$venv/bin/python" ]; then
  echo "==> creating venv $venv" >&2
  "$python" -m venv "$venv" >&2
fi
rm -f "$marker"
echo "==> installing the pinned client requirements" >&2
req_file="$(mktemp)"
trap 'rm -f "$req_file"' EXIT
printf '%s\n' "$requirements" >"$req_file"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
  --only-binary=:all: -r "$req_file" >&2
"$venv/bin/python" -c 'import tritonclient.http, tritonclient.grpc, numpy' >&2
printf '%s' "$requirements" >"$marker"
echo "$venv/bin/python"
