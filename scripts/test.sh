#!/usr/bin/env bash
# The test command (the README's second command; .ci/run calls it): formatting and lints of
# both languages (scripts/python-check.sh for the Python worker), set-up, the local Slurm, the
# real model and benchmark data the evaluation tests score (scripts/fixtures.sh: fetched with
# their sha256 pins by zflow's own fetch stages), then every test of the workspace and a compile
# of the GPU backends. The ui test drives Debian's Chromium (scripts/browser.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo fmt --all --check
cargo clippy --workspace --all-targets -- -D warnings
scripts/setup.sh
scripts/python-check.sh
scripts/slurm-local.sh start
export SLURM_CONF="$PWD/target/slurm-local/slurm.conf"
# Set before the first build, so that the tests' build (whose build.rs reads it) is the same one.
export ZFLOW_EVAL_DATA="$PWD/target/test-fixtures/data-root"
# The torch engine's Python, which scripts/setup.sh installed (its tests run with it).
export ZFLOW_TORCH_PYTHON="$PWD/target/torch-venv/bin/python"
eval "$(scripts/fixtures.sh)"
# Chromium and ChromeDriver for the ui test (tests/ui.rs).
eval "$(scripts/browser.sh)"
cargo test --workspace
cargo check -p zflow-evals --features cuda,rocm
