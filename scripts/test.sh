#!/usr/bin/env bash
# The test command (the README's second command; .ci/run calls it): formatting and lints of
# both languages (scripts/python-check.sh for the Python worker), set-up, the local Slurm, the
# real model and benchmark data the evaluation tests score (scripts/fixtures.sh: fetched with
# their sha256 pins by zflow's own fetch stages), then every test of the workspace. The ui test
# drives Debian's Chromium (scripts/browser.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
# A clean clone (CI) gains nothing from incremental compilation, and it costs build time.
if [ -n "${CI:-}" ]; then export CARGO_INCREMENTAL=0; fi
cargo fmt --all --check
# Where the set-up puts what the tests use, set before the first build: the tests' build
# scripts (build.rs, evals/build.rs) read these, and a value that changed would rebuild them.
export SLURM_CONF="$PWD/target/slurm-local/slurm.conf"
export ZFLOW_EVAL_DATA="$PWD/target/test-fixtures/data-root"
# The torch engine's Python, which scripts/setup.sh installs (its tests run with it).
export ZFLOW_TORCH_PYTHON="$PWD/target/torch-venv/bin/python"
# The set-up waits on the network and the disk (the torch environment's ~3 GB of wheels,
# Chromium, Slurm's packages: one after another, as apt allows one installer at a time); the
# build (zflow's and the tests', linted as they compile) waits on the CPU. They run side by side.
mkdir -p target
# The Python checks (scripts/python-check.sh) and lm-eval's environment (the agreement test's:
# ~80 s of pip the test would otherwise spend) need the torch environment, and join the set-up.
(scripts/setup.sh && scripts/browser.sh > target/browser.env && scripts/slurm-local.sh start &&
  scripts/lm-eval/setup.sh && scripts/python-check.sh) > target/test-setup.log 2>&1 &
setup=$!
# Clippy's lints run inside the build itself: its driver is the workspace's compiler (what
# `cargo clippy` sets, for a check), so one compilation of our crates both lints and builds
# them. A separate `cargo clippy --workspace --all-targets -- -D warnings` type-checked every
# dependency once more, DataFusion's above all: 257 s of a 2-core machine, where linting in the
# build adds 28 s of compile time. The build covers what --all-targets does (libraries, unit
# tests, binaries, integration tests, examples; there are no benches). Dependencies build with
# the plain compiler, so their artifacts are the same as any other build's.
export RUSTC_WORKSPACE_WRAPPER=clippy-driver CLIPPY_ARGS="-D__CLIPPY_HACKERY__warnings__CLIPPY_HACKERY__"
nextest=""
if cargo nextest --version >/dev/null 2>&1; then nextest=1; fi
if [ -n "$nextest" ]; then
  cargo nextest run --workspace --no-run
else
  cargo test --workspace --no-run
fi
if ! wait "$setup"; then
  cat target/test-setup.log >&2
  echo "test.sh: the set-up or the Python checks failed (log above)" >&2
  exit 1
fi
cat target/test-setup.log
eval "$(scripts/fixtures.sh)"
# nextest runs two tests at once on two cores, and many start PyTorch processes that use every
# core. OpenMP threads that spin long while they wait (libgomp's default, 300,000 turns) then
# starve the other test's: two 2-thread ranks of the tiny phase on two cores took 28-32 s so,
# 11 s spinning 1,000 turns. Alone, a process runs as fast either way (9.5 s); with threads that
# never spin (OMP_WAIT_POLICY=PASSIVE) it took 16.6 s.
export GOMP_SPINCOUNT=1000
# Chromium and ChromeDriver for the ui test (tests/ui.rs), which scripts/browser.sh installed.
eval "$(cat target/browser.env)"
# nextest (on the machine's image; cargo test where it is missing) runs each test in its own
# process and keeps both cores busy across test binaries, where cargo test runs the binaries
# one after another and a binary's last long test leaves a core idle; it also prints each
# test's time. It runs no doctests, so those run apart, first (so that the closing lines are
# nextest's summary of every test).
if [ -n "$nextest" ]; then
  cargo test --workspace --doc
  cargo nextest run --workspace --no-fail-fast
else
  cargo test --workspace
fi
