#!/usr/bin/env bash
# Fetches the ONNX operator conformance cases (onnx/backend/test/data/node)
# from the PyPI wheel onnx==1.22.0, the last release that ships them.
# Idempotent; prints the directory on its last line.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
deps="${EDGELOOP_DEPS:-$HOME/.edgeloop/deps}"
dest="$deps/onnx-1.22.0/node"
if [ -f "$dest/.complete" ]; then
  echo "$dest"
  exit 0
fi
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
# One platform, so the wheel (and its pin) is the same on any machine: only
# its test data is used.
python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.11 \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  onnx==1.22.0 -d "$tmp" >&2
# shellcheck source=lib/pins.sh
. "$repo/scripts/lib/pins.sh"
verify_pinned "$tmp"/onnx-1.22.0-*.whl
python3 - "$tmp" <<'PY'
import glob, os, sys, zipfile
tmp = sys.argv[1]
wheel = glob.glob(os.path.join(tmp, "onnx-1.22.0-*.whl"))[0]
prefix = "onnx/backend/test/data/node/"
out = os.path.join(tmp, "node")
with zipfile.ZipFile(wheel) as z:
    for name in z.namelist():
        if name.startswith(prefix) and not name.endswith("/"):
            rel = name[len(prefix):]
            target = os.path.join(out, rel)
            os.makedirs(os.path.dirname(target), exist_ok=True)
            with z.open(name) as src, open(target, "wb") as dst:
                dst.write(src.read())
PY
touch "$tmp/node/.complete"
mkdir -p "$(dirname "$dest")"
rm -rf "$dest"
mv "$tmp/node" "$dest"
echo "$dest"
