#!/usr/bin/env bash
# Installs the ONNX Runtime CPU library (and three small test models) that
# `edgeloop_models::runtime` loads at run time. The build never downloads it.
#
#   scripts/fetch-onnxruntime.sh
#
# Installs into ${EDGELOOP_DEPS:-$HOME/.edgeloop/deps}/onnxruntime-1.31.1/:
#   libonnxruntime.so.1.31.1
#   datasets/{mul_1,sigmoid,logreg_iris}.onnx
# and prints the library path on its last line. Idempotent: files already in
# place (non-empty) are kept, and nothing is downloaded when all are there.
#
# The library comes from PyPI's `onnxruntime` wheel, fetched with pip (the
# ordinary client, so a configured index or proxy is honoured). It needs only
# libc, libstdc++ and libgcc_s (glibc >= 2.28); no Python at run time.
set -euo pipefail

version="1.31.1"
repo="$(cd "$(dirname "$0")/.." && pwd)"
deps="${EDGELOOP_DEPS:-$HOME/.edgeloop/deps}"
dest="$deps/onnxruntime-$version"
lib_name="libonnxruntime.so.$version"
models=(mul_1 sigmoid logreg_iris)

if [ "$(uname -s)" != "Linux" ]; then
  echo "fetch-onnxruntime.sh: only Linux is supported (the wheel's library is $lib_name)" >&2
  exit 1
fi

# Every file we install, relative to $dest, paired with its path in the wheel.
wanted=("$lib_name=onnxruntime/capi/$lib_name")
for m in "${models[@]}"; do
  wanted+=("datasets/$m.onnx=onnxruntime/datasets/$m.onnx")
done

missing=()
for pair in "${wanted[@]}"; do
  [ -s "$dest/${pair%%=*}" ] || missing+=("$pair")
done

if [ "${#missing[@]}" -gt 0 ]; then
  command -v python3 >/dev/null || { echo "fetch-onnxruntime.sh: python3 is required" >&2; exit 1; }
  mkdir -p "$dest/datasets"
  # The staging dir sits inside $dest so that the final `mv` is a rename on
  # one file system, hence atomic: a reader never sees a half-written file.
  stage="$(mktemp -d "$dest/.fetch.XXXXXX")"
  trap 'rm -rf "$stage"' EXIT

  echo "==> downloading onnxruntime==$version (wheel) from PyPI" >&2
  python3 -m pip download --quiet --no-deps --only-binary=:all: \
    "onnxruntime==$version" -d "$stage/wheel" >&2
  shopt -s nullglob
  wheels=("$stage"/wheel/onnxruntime-"$version"-*.whl)
  [ "${#wheels[@]}" -eq 1 ] || { echo "fetch-onnxruntime.sh: expected one onnxruntime $version wheel from pip, got ${#wheels[@]}" >&2; exit 1; }
  wheel="${wheels[0]}"

  # python3's zipfile, not unzip: unzip is often missing on a fresh machine.
  python3 - "$wheel" "$stage/out" "${missing[@]}" <<'PY'
import os, shutil, sys, zipfile

wheel, out, pairs = sys.argv[1], sys.argv[2], sys.argv[3:]
with zipfile.ZipFile(wheel) as zf:
    for pair in pairs:
        target, member = pair.split("=", 1)
        path = os.path.join(out, target)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        try:
            src = zf.open(member)
        except KeyError:
            sys.exit(f"fetch-onnxruntime.sh: {member} is not in {os.path.basename(wheel)}")
        with src, open(path, "wb") as dst:
            shutil.copyfileobj(src, dst)
            dst.flush()
            os.fsync(dst.fileno())
PY

  for pair in "${missing[@]}"; do
    target="${pair%%=*}"
    [ -s "$stage/out/$target" ] || { echo "fetch-onnxruntime.sh: $target came out empty" >&2; exit 1; }
    mv -f "$stage/out/$target" "$dest/$target"
    echo "==> installed $dest/$target" >&2
  done
fi

echo "$dest/$lib_name"
