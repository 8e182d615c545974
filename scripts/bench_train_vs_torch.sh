#!/usr/bin/env bash
# The training step of a recipe's model on zflow's torch engine (the worker's own step) against
# the same model trained by plain transformers + PyTorch, in one command:
#   scripts/bench_train_vs_torch.sh [RECIPE] [--rounds R] [other `zflow bench train` flags]
# Uses the torch engine's environment (PyPI's torch 2.15.0 wheel, as users install it), which
# scripts/setup.sh creates in target/torch-venv; `zflow bench train` alternates the two
# sides for R rounds (default 2) and prints each round's ratios.
set -euo pipefail
cd "$(dirname "$0")/.."
recipe=recipes/zaya1-nano.yaml
if [ $# -gt 0 ] && [ "${1#--}" = "$1" ]; then recipe=$1; shift; fi
scripts/setup.sh
cargo build --quiet --bin zflow
target/debug/zflow bench train "$recipe" "$@"
