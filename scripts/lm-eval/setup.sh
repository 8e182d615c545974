#!/usr/bin/env bash
# The lm-evaluation-harness side of the eval agreement test: a venv at target/lm-eval-venv with
# lm_eval 0.4.13 and what it needs beyond the torch engine's environment (requirements.txt,
# hash-pinned, --no-deps). It LAYERS on target/torch-venv (made by scripts/setup.sh): a .pth file
# in its site-packages appends target/torch-venv's site-packages to sys.path, so lm_eval runs the
# same torch 2.15.0 / transformers 5.23.0 (and numpy, tokenizers, safetensors, huggingface-hub)
# that zflow's torch engine does; nothing of those is installed twice.
# Idempotent: does nothing (and reaches nothing) when the venv already holds this
# requirements.txt's packages.
# Usage: scripts/lm-eval/setup.sh            (reaches PyPI the first time)
#        WHEELS=DIR scripts/lm-eval/setup.sh  (offline, from files `pip download`ed into DIR:
#          requirements.txt's, plus setuptools and wheel for building its three sdists)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
base="$repo/target/torch-venv"
venv="$repo/target/lm-eval-venv"
req="$here/requirements.txt"
copy="$venv/zflow-lm-eval-requirements.txt"

check() {
  "$venv/bin/python" - "$base" <<'PY'
import importlib.metadata as m, sys
import torch, transformers, lm_eval, lm_eval.models.huggingface, evaluate, datasets
import antlr4, sympy, math_verify  # minerva_math's utils.py
import gguf  # transformers' GGUF loader (gemma_hf.py)
# The layering: torch and transformers come from the torch engine's venv, not this one.
for mod in (torch, transformers):
    assert mod.__file__.startswith(sys.argv[1] + "/"), (mod.__name__, mod.__file__)
assert m.version("antlr4-python3-runtime").startswith("4.11"), m.version("antlr4-python3-runtime")
print("lm_eval", m.version("lm_eval"), "torch", torch.__version__, "transformers",
      transformers.__version__, "datasets", datasets.__version__, "evaluate", evaluate.__version__)
PY
}

if cmp -s "$req" "$copy" 2>/dev/null && check >/dev/null 2>&1; then
  echo "lm-eval venv up to date: $venv"
  exit 0
fi

if ! "$base/bin/python" -c "import torch, transformers" >/dev/null 2>&1; then
  echo "lm-eval setup: $base is missing or incomplete: run scripts/setup.sh first" >&2
  exit 1
fi
# The layering rule: requirements.txt holds nothing that target/torch-venv has. The same version
# there is harmless (the line can go); another version would shadow the engine's: refused.
"$base/bin/python" - "$req" <<'PY'
import importlib.metadata as m, re, sys
have = {re.sub(r"[-_.]+", "-", d.metadata["Name"]).lower(): d.version for d in m.distributions()}
bad = False
for line in open(sys.argv[1]):
    pin = re.match(r"([A-Za-z0-9_.-]+)==(\S+)", line)
    if pin and (key := re.sub(r"[-_.]+", "-", pin[1]).lower()) in have:
        same = have[key] == pin[2]
        bad |= not same
        print(f"lm-eval setup: {pin[1]}=={pin[2]} is in target/torch-venv too ({have[key]})"
              + ("; drop it from requirements.txt" if same else ": it would shadow it"),
              file=sys.stderr)
sys.exit(1 if bad else 0)
PY
# `python -m venv` from inside a venv makes one on the same base interpreter (CPython 3.11).
[ -x "$venv/bin/python" ] || "$base/bin/python" -m venv "$venv"
purelib='import sysconfig; print(sysconfig.get_paths()["purelib"])'
"$base/bin/python" -c "$purelib" > "$("$venv/bin/python" -c "$purelib")/zflow-torch-venv.pth"
rm -f "$copy"
index=()
[ -n "${WHEELS:-}" ] && index=(--no-index --find-links "$WHEELS")
PIP_DISABLE_PIP_VERSION_CHECK=1 "$venv/bin/python" -m pip install --quiet \
  --require-hashes --no-deps "${index[@]}" -r "$req"
# pip check, less what target/torch-venv's own pip check already says (torch 2.15.0's wheel asks for
# setuptools>=77.0.3 and that venv has 65.5.0; only torch.utils.cpp_extension imports it): the
# layer may add no unmet requirement of its own.
export PIP_DISABLE_PIP_VERSION_CHECK=1
new_problems="$(comm -23 <("$venv/bin/python" -m pip check | sort) <("$base/bin/python" -m pip check | sort))" || true
if [ -n "$new_problems" ]; then
  echo "lm-eval setup: pip check: $new_problems" >&2
  exit 1
fi
check
cp "$req" "$copy"
echo "lm-eval venv ready: $venv"
