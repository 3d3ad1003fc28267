#!/usr/bin/env bash
# The GPU check, for a machine with an NVIDIA GPU and its driver. One
# prepared script, under 8 minutes on a fresh machine:
#
#   1. fetches the GPU runtime (scripts/fetch-onnxruntime.sh --gpu) and the
#      models: the MNIST CNN trained here and a real detector, NudeNet's
#      YOLOv8n (320n.onnx from the `nudenet` wheel on PyPI);
#   2. checks that the GPU build loads its NVIDIA libraries by itself
#      (models/tests/gpu_build.rs);
#   3. builds the release agent and runs edge-agent/benches/gpu_check.rs:
#      each model on the CUDA and TensorRT providers through the agent,
#      against the CPU (outputs) and a raw ONNX Runtime session on the same
#      provider (latency), a restart on the TensorRT engine cache, /metrics,
#      and GPU memory;
#   4. writes the report to $GPU_CHECK_REPORT (default $OUT/gpu-report.md
#      when $OUT is set, else target/gpu-check/report.md).
#
#   scripts/gpu-check.sh          on the GPU
#   scripts/gpu-check.sh --cpu    the same steps on the CPU build and CPU
#                                 provider: checks this script on any machine
#
# Exits non-zero if a hard check fails (a provider that silently fell back,
# outputs out of tolerance, a library that does not load).
set -euo pipefail

repo="$(cd "$(dirname "$0")/.." && pwd)"
cd "$repo"
deps="${EDGELOOP_DEPS:-$HOME/.edgeloop/deps}"
mode="${1:-gpu}"
started=$(date +%s)
say() { echo "==> [$(( $(date +%s) - started ))s] $*" >&2; }

if [ -n "${OUT:-}" ]; then
  report="${GPU_CHECK_REPORT:-$OUT/gpu-report.md}"
else
  report="${GPU_CHECK_REPORT:-$repo/target/gpu-check/report.md}"
fi
mkdir -p "$(dirname "$report")"

say "CPU runtime and test models"
cpu_lib=$(scripts/fetch-onnxruntime.sh | tail -1)
scripts/fetch-mnist-models.sh >/dev/null

say "NudeNet's YOLOv8n detector (PyPI nudenet)"
detector="$deps/nudenet/320n.onnx"
if [ ! -s "$detector" ]; then
  stage=$(mktemp -d)
  python3 -m pip download --quiet --no-deps --only-binary=:all: "nudenet==3.4.2" -d "$stage" >&2
  python3 - "$stage" "$detector" <<'PY'
import os, sys, zipfile
stage, dest = sys.argv[1], sys.argv[2]
wheel = next(os.path.join(stage, f) for f in os.listdir(stage) if f.endswith(".whl"))
with zipfile.ZipFile(wheel) as z:
    member = next(n for n in z.namelist() if n.endswith("320n.onnx"))
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    with open(dest + ".tmp", "wb") as f:
        f.write(z.read(member))
os.replace(dest + ".tmp", dest)
PY
  rm -rf "$stage"
fi
models="$deps/mnist-models/cnn.onnx,$detector"

{
  echo "# GPU check"
  echo
  echo "- date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "- commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
  if command -v nvidia-smi >/dev/null; then
    echo "- GPU: $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | head -1)"
    echo "- $(nvidia-smi | grep -o 'CUDA Version: [0-9.]*' | head -1)"
  else
    echo "- GPU: none (nvidia-smi not found)"
  fi
  echo "- mode: $mode"
} >"$report"

if [ "$mode" = "--cpu" ]; then
  lib="$cpu_lib"
  providers=cpu
else
  say "GPU runtime (onnxruntime-gpu and the NVIDIA wheels)"
  lib=$(scripts/fetch-onnxruntime.sh --gpu | tail -1)
  providers=cuda,tensorrt
  echo "- GPU runtime: $(tail -1 "$(dirname "$lib")/cuda/.complete")" >>"$report"
  say "the GPU build loads its NVIDIA libraries (models/tests/gpu_build.rs)"
  if EDGELOOP_ORT_GPU_LIBRARY="$lib" cargo test --release -q -p edgeloop-models --test gpu_build -- --ignored >&2; then
    echo "- GPU build loads its libraries and runs a session on CUDA: ✓" >>"$report"
  else
    echo "- GPU build loads its libraries and runs a session on CUDA: ✗" >>"$report"
    status=1
  fi
fi

say "building the release agent"
cargo build --release -q -p edgeloop-edge-agent --bin edge-agent >&2
echo "- release agent: $(du -h target/release/edge-agent | cut -f1)" >>"$report"

say "serving checks ($providers)"
part=$(mktemp)
if EDGELOOP_ORT_LIBRARY="$lib" GPU_CHECK_MODELS="$models" GPU_CHECK_PROVIDERS="$providers" \
   GPU_CHECK_DYNAMIC="${GPU_CHECK_DYNAMIC:-320}" GPU_CHECK_REPORT="$part" \
   cargo bench -q -p edgeloop-edge-agent --bench gpu_check >&2; then
  :
else
  status=1
fi
cat "$part" >>"$report" 2>/dev/null || true
rm -f "$part"
echo >>"$report"
echo "Finished in $(( $(date +%s) - started )) s." >>"$report"
say "report: $report"
cat "$report"
exit "${status:-0}"
