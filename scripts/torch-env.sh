#!/usr/bin/env bash
# Creates the Python virtual environment with PyTorch that the PyTorch
# reference trainer (workloads/pytorch/train_ddp.py) runs in: its DDP runs
# in workloads/pytorch/test_contract.py, and tests/it/pytorch.rs (the
# local engine, Slurm, a retraining pipeline and `edgeloop demo --trainer
# pytorch`).
#
#   scripts/torch-env.sh
#
# Creates ${EDGELOOP_DEPS:-$HOME/.edgeloop/deps}/torch-venv and prints its
# python path on the last line. Idempotent (scripts/lib/venv.sh); the pins
# are scripts/requirements/torch.in, hash-locked in torch.txt.
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

# shellcheck source=lib/venv.sh
. "$(dirname "$0")/lib/venv.sh"
venv_install "$venv" torch torch torch.distributed numpy onnx onnxscript onnxruntime
echo "$venv/bin/python"
