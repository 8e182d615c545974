#!/usr/bin/env bash
# The training step of a recipe's model, zflow's native engine against the same model and step in
# PyTorch, in one command:
#   scripts/bench_train_vs_torch.sh [RECIPE] [--rounds R] [other `zflow bench train` flags]
# Installs PyTorch as its users do, the torch 2.15.0 wheel from PyPI (with its CUDA libraries,
# ~3 GB; once) with numpy, into target/bench/torch-venv, then runs `zflow bench train`, which
# alternates the two sides for R rounds (default 2) and prints each round's ratio.
set -euo pipefail
cd "$(dirname "$0")/.."
recipe=recipes/zaya1-nano.yaml
if [ $# -gt 0 ] && [ "${1#--}" = "$1" ]; then recipe=$1; shift; fi
venv=target/bench/torch-venv
if ! "$venv/bin/python" -c "import torch, numpy" 2>/dev/null; then
  echo "installing torch==2.15.0 from PyPI into $venv (~3 GB)" >&2
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet torch==2.15.0 numpy
fi
cargo build --quiet --bin zflow
ZFLOW_TORCH_PYTHON="$venv/bin/python" target/debug/zflow bench train "$recipe" "$@"
