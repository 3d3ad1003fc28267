#!/usr/bin/env bash
# Installs the ONNX Runtime CPU library (and three small test models) that
# `edgeloop_models::runtime` loads at run time. The build never downloads it.
#
#   scripts/fetch-onnxruntime.sh          the CPU library
#   scripts/fetch-onnxruntime.sh --gpu    the GPU build and its NVIDIA runtime
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
#
# --gpu installs into .../onnxruntime-gpu-1.31.1/ instead: the library and
# its CUDA and TensorRT providers from `onnxruntime-gpu`, and under cuda/
# the NVIDIA libraries they need, from their PyPI wheels (CUDA 13.0, cuDNN 9,
# TensorRT 10: the majors that ORT build was linked against; the pins keep
# the driver requirement at CUDA 13.0's, >= 580). The providers have no
# RUNPATH, so `edgeloop_models::runtime` preloads everything in cuda/ before
# it loads them: no LD_LIBRARY_PATH to set. About 3 GB on disk. The driver
# (libcuda.so.1) comes with the machine, never from here.
set -euo pipefail

version="1.31.1"
repo="$(cd "$(dirname "$0")/.." && pwd)"
deps="${EDGELOOP_DEPS:-$HOME/.edgeloop/deps}"
dest="$deps/onnxruntime-$version"
lib_name="libonnxruntime.so.$version"
models=(mul_1 sigmoid logreg_iris)
# shellcheck source=lib/pins.sh
. "$repo/scripts/lib/pins.sh"
# One platform, so the wheel's name (and its pin) is the same on any machine:
# only the shared libraries are taken from it, never Python code.
# The installed libraries, checked every run: `verify_installed DIR PREFIX
# FILE...` (PREFIX tells the GPU build's pins from the CPU build's).
verify_installed() {
  local dir="$1" prefix="$2" f
  shift 2
  for f in "$@"; do
    verify_pinned_as "$prefix$f" "$dir/$f" || {
      echo "fetch-onnxruntime.sh: $dir/$f is not the pinned build; delete it to fetch it again" >&2
      exit 1
    }
  done
}
platform=(--python-version 3.11 --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux2014_x86_64)

if [ "$(uname -s)" != "Linux" ]; then
  echo "fetch-onnxruntime.sh: only Linux is supported (the wheel's library is $lib_name)" >&2
  exit 1
fi

if [ "${1:-}" = "--gpu" ]; then
  dest="$deps/onnxruntime-gpu-$version"
  # name==version of every wheel; each one's shared libraries go to cuda/.
  runtime_wheels=(
    "nvidia-cuda-runtime==13.0.96"
    "nvidia-cuda-nvrtc==13.0.88"
    "nvidia-cublas==13.0.2.14"
    "nvidia-curand==10.4.0.35"
    "nvidia-cufft==12.0.0.61"
    "nvidia-cudnn-cu13==9.28.1.4"
  )
  # PyPI has TensorRT's libraries only as an sdist that downloads the real
  # wheel from pypi.nvidia.com while it builds. Tried, but optional: without
  # it the TensorRT provider falls back to CUDA. EDGELOOP_TENSORRT_LIBS names
  # a directory with an installed TensorRT 10 instead (a Jetson's
  # /usr/lib/aarch64-linux-gnu, a tarball's lib/).
  tensorrt_wheel="tensorrt-cu13-libs==10.16.1.11"
  marker="$dest/cuda/.complete"
  if [ -s "$dest/$lib_name" ] && [ -s "$dest/libonnxruntime_providers_cuda.so" ] &&
     [ -s "$dest/libonnxruntime_providers_tensorrt.so" ] && [ -s "$marker" ] &&
     [ "$(head -1 "$marker")" = "${runtime_wheels[*]}" ]; then
    # Every run, also when nothing was fetched: these are what the agent loads.
    verify_installed "$dest" gpu/ "$lib_name" libonnxruntime_providers_shared.so \
      libonnxruntime_providers_cuda.so libonnxruntime_providers_tensorrt.so
    echo "$dest/$lib_name"
    exit 0
  fi
  command -v python3 >/dev/null || { echo "fetch-onnxruntime.sh: python3 is required" >&2; exit 1; }
  mkdir -p "$dest"
  stage="$(mktemp -d "$dest/.fetch.XXXXXX")"
  trap 'rm -rf "$stage"' EXIT
  echo "==> downloading onnxruntime-gpu==$version and the NVIDIA runtime wheels from PyPI (about 3 GB)" >&2
  python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.11 \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux2014_x86_64 \
    "onnxruntime-gpu==$version" "${runtime_wheels[@]}" -d "$stage/wheels" >&2
  verify_pinned "$stage"/wheels/*.whl
  tensorrt="absent"
  if [ -n "${EDGELOOP_TENSORRT_LIBS:-}" ]; then
    tensorrt="from $EDGELOOP_TENSORRT_LIBS"
  elif timeout 600 python3 -m pip wheel --quiet --no-deps "$tensorrt_wheel" -w "$stage/trt" >&2 2>"$stage/trt.log"; then
    # Built here from an sdist that downloads from pypi.nvidia.com: used
    # only once its wheel is pinned like every other download.
    if verify_pinned "$stage"/trt/*.whl 2>>"$stage/trt.log"; then
      mv "$stage"/trt/*.whl "$stage/wheels/"
      tensorrt="$tensorrt_wheel"
    else
      echo "==> TensorRT's libraries are not used: $(tail -1 "$stage/trt.log"); the TensorRT provider will fall back to CUDA" >&2
    fi
  else
    echo "==> TensorRT's libraries could not be fetched ($tensorrt_wheel is an sdist that downloads from pypi.nvidia.com: $(tail -1 "$stage/trt.log")); the TensorRT provider will fall back to CUDA. Set EDGELOOP_TENSORRT_LIBS to a TensorRT 10 lib dir to use one." >&2
  fi
  python3 - "$stage/wheels" "$stage/out" "$lib_name" <<'PY'
import os, shutil, sys, zipfile
wheels, out, lib_name = sys.argv[1], sys.argv[2], sys.argv[3]
os.makedirs(os.path.join(out, "cuda"), exist_ok=True)
def copy(zf, member, path):
    with zf.open(member) as src, open(path, "wb") as dst:
        shutil.copyfileobj(src, dst)
        dst.flush()
        os.fsync(dst.fileno())
ort = ["libonnxruntime_providers_shared.so", "libonnxruntime_providers_cuda.so",
       "libonnxruntime_providers_tensorrt.so", lib_name]
found = set()
for wheel in sorted(os.listdir(wheels)):
    with zipfile.ZipFile(os.path.join(wheels, wheel)) as zf:
        for member in zf.namelist():
            base = os.path.basename(member)
            if wheel.startswith("onnxruntime_gpu-"):
                if member.startswith("onnxruntime/capi/") and base in ort:
                    copy(zf, member, os.path.join(out, base))
                    found.add(base)
            elif ".so" in base and not base.endswith(".py"):
                # Flattened: the loader matches by soname, not by path.
                copy(zf, member, os.path.join(out, "cuda", base))
missing = [n for n in ort if n not in found]
if missing:
    sys.exit(f"fetch-onnxruntime.sh: onnxruntime-gpu has no {missing}")
for need in ["libcudart.so.13", "libcublas.so.13", "libcublasLt.so.13", "libcurand.so.10",
             "libcudnn.so.9"]:
    if not os.path.exists(os.path.join(out, "cuda", need)):
        sys.exit(f"fetch-onnxruntime.sh: no {need} in the NVIDIA wheels")
PY
  # Replace the whole set at once: a half-updated cuda/ would mix releases.
  rm -rf "$dest/cuda.old"
  [ -d "$dest/cuda" ] && mv "$dest/cuda" "$dest/cuda.old"
  if [ -n "${EDGELOOP_TENSORRT_LIBS:-}" ]; then
    for f in "$EDGELOOP_TENSORRT_LIBS"/libnvinfer*.so.10* "$EDGELOOP_TENSORRT_LIBS"/libnvonnxparser*.so.10*; do
      [ -e "$f" ] && cp -L "$f" "$stage/out/cuda/"
    done
  fi
  mv "$stage/out/cuda" "$dest/cuda"
  for f in "$stage"/out/*.so*; do mv -f "$f" "$dest/"; done
  rm -rf "$dest/cuda.old"
  verify_installed "$dest" gpu/ "$lib_name" libonnxruntime_providers_shared.so \
    libonnxruntime_providers_cuda.so libonnxruntime_providers_tensorrt.so
  printf '%s\ntensorrt: %s\n' "${runtime_wheels[*]}" "$tensorrt" >"$marker"
  echo "==> installed $dest ($(du -sh "$dest" | cut -f1))" >&2
  echo "$dest/$lib_name"
  exit 0
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
  python3 -m pip download --quiet --no-deps --only-binary=:all: "${platform[@]}" \
    "onnxruntime==$version" -d "$stage/wheel" >&2
  shopt -s nullglob
  wheels=("$stage"/wheel/onnxruntime-"$version"-*.whl)
  [ "${#wheels[@]}" -eq 1 ] || { echo "fetch-onnxruntime.sh: expected one onnxruntime $version wheel from pip, got ${#wheels[@]}" >&2; exit 1; }
  wheel="${wheels[0]}"
  verify_pinned "$wheel"

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
    verify_pinned_as "$(basename "$target")" "$stage/out/$target"
    mv -f "$stage/out/$target" "$dest/$target"
    echo "==> installed $dest/$target" >&2
  done
fi

# Every run, also when nothing was fetched: this is the library the agent
# and the control plane load.
verify_installed "$dest" "" "$lib_name"
echo "$dest/$lib_name"
