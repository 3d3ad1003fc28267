#!/usr/bin/env bash
# Creates the Python virtual environment with PyTorch that the PyTorch
# reference trainer (workloads/pytorch/train_ddp.py) runs in: its DDP runs
# in workloads/pytorch/test_contract.py, and tests/tests/pytorch.rs (the
# local engine, Slurm, a retraining pipeline and `edgeloop demo --trainer
# pytorch`).
#
#   scripts/torch-env.sh
#
# Creates ${EDGELOOP_DEPS:-$HOME/.edgeloop/deps}/torch-venv and prints its
# python path on the last line. Idempotent: pip is skipped when the marker
# records exactly the requirement list below.
#
# Why a venv of its own, and why it is big: PyPI has no CPU-only torch. The
# torch==2.15.0 wheel (539 MB) links libtorch_cuda.so, which needs the CUDA 13
# runtime libraries even on a machine without a GPU (`import torch` fails on
# libcudart.so.13, then libcublasLt), so its metadata's CUDA wheels come too:
# 5.6 GB installed. Measured on the 2-core CI kind of machine: 72 s cold
# (downloads at about 50 MB/s), under a second warm (the marker). Every
# package is pinned, the transitive ones too (`pip freeze` of a resolved
# install); onnx, onnxscript and onnxruntime are the exporter's and the
# export check's, at the versions the rest of the workspace uses.
set -euo pipefail

deps="${EDGELOOP_DEPS:-$HOME/.edgeloop/deps}"
venv="$deps/torch-venv"
python="${PYTHON:-python3}"

requirements="torch==2.15.0
numpy==2.2.6
onnx==1.22.0
onnxscript==0.7.2
onnx-ir==1.1.0
onnxruntime==1.31.1
cuda-bindings==13.5.0
cuda-pathfinder==1.9.1
cuda-toolkit==13.2.2
filelock==4.3.1
flatbuffers==25.12.19
fsspec==2026.9.0
Jinja2==3.1.6
MarkupSafe==3.0.4
ml_dtypes==0.7.0
mpmath==1.3.0
networkx==3.6.1
nvidia-cublas==13.4.1.3
nvidia-cuda-cccl==13.3.5.0.6
nvidia-cuda-cupti==13.2.86
nvidia-cuda-nvrtc==13.2.86
nvidia-cuda-runtime==13.2.86
nvidia-cudnn-cu13==9.26.0.51
nvidia-cufft==12.2.0.57
nvidia-cufile==1.17.1.22
nvidia-cusolver==12.2.0.11
nvidia-cusparse==12.7.10.12
nvidia-cusparselt-cu13==0.8.1
nvidia-nccl-cu13==2.30.7
nvidia-nvjitlink==13.5.37
nvidia-nvshmem-cu13==3.7.2
nvidia-nvtx==13.2.86
packaging==26.4
protobuf==7.36.2
setuptools==84.2.1
sympy==1.14.0
triton==3.9.0
typing_extensions==4.16.0"

marker="$venv/.edgeloop-requirements.txt"

if [ -x "$venv/bin/python" ] && [ -f "$marker" ] && [ "$(cat "$marker")" = "$requirements" ]; then
  echo "$venv/bin/python"
  exit 0
fi

command -v "$python" >/dev/null || { echo "torch-env.sh: $python is required" >&2; exit 1; }

mkdir -p "$deps"
if [ ! -x "$venv/bin/python" ]; then
  echo "==> creating venv $venv" >&2
  "$python" -m venv "$venv" >&2
fi

# The marker goes only after a successful install (and import), so an
# interrupted run is retried in full the next time.
rm -f "$marker"
echo "==> installing torch and its CUDA runtime wheels (about 3 GB to download, 5.6 GB installed)" >&2
req_file="$(mktemp)"
trap 'rm -f "$req_file"' EXIT
printf '%s\n' "$requirements" >"$req_file"
started=$SECONDS
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
  --only-binary=:all: -r "$req_file" >&2
"$venv/bin/python" -c 'import torch, torch.distributed, numpy, onnx, onnxscript, onnxruntime' >&2
printf '%s' "$requirements" >"$marker"
echo "==> torch installed in $((SECONDS - started)) s" >&2

echo "$venv/bin/python"
