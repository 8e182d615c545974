#!/usr/bin/env bash
# The Python side's checks (part of scripts/test.sh): ruff (lint and format) and mypy --strict
# over workers/torch, then its unit tests. ruff and mypy are pinned (workers/torch/tools.lock,
# versions and sha256) and installed once into target/python-tools; mypy reads torch's types,
# and the tests run, in the torch engine's environment (target/torch-venv, made by
# scripts/setup.sh, which runs first).
set -euo pipefail
cd "$(dirname "$0")/.."
tools=target/python-tools
python="${ZFLOW_TORCH_PYTHON:-$PWD/target/torch-venv/bin/python}"
lock=workers/torch/tools.lock
if ! cmp -s "$lock" "$tools/zflow-tools.lock" 2>/dev/null; then
  python3 -m venv "$tools"
  "$tools/bin/pip" install --quiet --require-hashes --no-deps -r "$lock"
  cp "$lock" "$tools/zflow-tools.lock"
fi
cd workers/torch
"../../$tools/bin/ruff" check .
"../../$tools/bin/ruff" format --check .
"../../$tools/bin/mypy" --python-executable "$python" zflow_torch tests
"$python" -m unittest discover -s tests
