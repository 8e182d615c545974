#!/usr/bin/env bash
# Installs what zflow's fetch stages call on a fresh Debian/Ubuntu machine that has only
# Rust: pip (for pip:// and sdist:// sources) and venv, npm (for npm:// sources: the nano recipe's
# corpora and Gemma's tokenizer), apt lists (for deb:// sources), a C compiler for -sys crates;
# then the torch engine's Python environment, target/torch-venv, from
# workers/torch/requirements.lock (every package pinned by version and sha256; torch 2.15.0 and transformers 5.23.0 from PyPI: the torch wheel
# brings its CUDA libraries, ~3 GB, once). Safe to run again; does nothing when all is there.
set -euo pipefail

SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi

need=()
command -v cc >/dev/null || need+=(gcc libc6-dev)
command -v python3 >/dev/null || need+=(python3)
python3 -m pip --version >/dev/null 2>&1 || need+=(python3-pip)
# venv (scripts/python-check.sh's pinned ruff and mypy); Debian ships ensurepip apart.
python3 -c 'import ensurepip' >/dev/null 2>&1 || need+=(python3-venv)
command -v npm >/dev/null || need+=(npm)
command -v dpkg >/dev/null || { echo "zflow's deb:// sources need a Debian-based system (dpkg)" >&2; }

# apt-get download needs package lists; a fresh container has none.
if [ -z "$(ls -A /var/lib/apt/lists 2>/dev/null | grep -v -e lock -e partial)" ] || [ ${#need[@]} -gt 0 ]; then
  $SUDO apt-get update -qq
fi
if [ ${#need[@]} -gt 0 ]; then
  echo "setup: installing ${need[*]}"
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >/dev/null
fi

# The torch engine's environment (stages/src/engine.rs runs target/torch-venv/bin/python unless
# ZFLOW_TORCH_PYTHON names another, e.g. one with PyTorch's ROCm build).
venv=target/torch-venv
lock=workers/torch/requirements.lock
cd "$(dirname "$0")/.."
if ! cmp -s "$lock" "$venv/zflow-requirements.lock" 2>/dev/null \
  || ! "$venv/bin/python" -c "import torch, transformers" >/dev/null 2>&1; then
  echo "setup: installing the torch engine's Python environment into $venv (torch's PyPI wheel with its CUDA libraries: ~3 GB, once)"
  python3 -m venv "$venv"
  # Every file pip fetches must match a sha256 of the lock.
  "$venv/bin/pip" install --quiet --disable-pip-version-check --require-hashes --no-deps -r "$lock"
  cp "$lock" "$venv/zflow-requirements.lock"
fi
echo "setup: ok"
