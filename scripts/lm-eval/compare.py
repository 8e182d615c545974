"""Compares zflow's samples with lm-evaluation-harness's, document by document.

    python compare.py ZFLOW_RESULTS_JSON LM_EVAL_OUT_DIR [TASK ...]

ZFLOW_RESULTS_JSON is what ``zflow eval --log-samples --out`` writes; LM_EVAL_OUT_DIR is
run.sh's output folder (``samples_<task>_local_*.jsonl`` somewhere under it). For every task of
the zflow results (or the named ones) and every document both scored, it checks:

- the exact prompt of every request;
- log-likelihoods within 1e-4 relative, and the same is-greedy verdict;
- the same generated text;
- the same extracted answers (gsm8k's filters), and the same per-document metric values
  (exact_match, math_verify, pass@1, acc, acc_norm); a value lm-eval does not report is a
  difference too.

It prints one line per task and every difference, and exits 1 if there is one.
"""

import json
import sys
from pathlib import Path
from typing import Any

REL_TOL = 1e-4

# zflow's per-document value names -> lm-eval's, per task family.
VALUES = {
    "exact_match,minerva": "exact_match",
    "math_verify": "math_verify",
    "pass@1": ("pass@1", "pass_at_1"),
    "acc": "acc",
    "acc_norm": "acc_norm",
}


def lm_eval_samples(out: Path, task: str) -> dict[int, list[dict[str, Any]]]:
    """lm-eval's records of ``<task>_local``, by document (several per document: one per filter)."""
    files = sorted(out.rglob(f"samples_{task}_local_*.jsonl"))
    if not files:
        raise SystemExit(f"no lm-eval samples for {task}_local under {out}")
    by_doc: dict[int, list[dict[str, Any]]] = {}
    for line in files[-1].read_text().splitlines():
        rec = json.loads(line)
        by_doc.setdefault(int(rec["doc_id"]), []).append(rec)
    return by_doc


def close(a: float, b: float) -> bool:
    return abs(a - b) <= REL_TOL * max(abs(a), abs(b), 1e-12)


def compare_doc(task: str, ours: dict[str, Any], theirs: list[dict[str, Any]]) -> list[str]:
    diffs = []
    first = theirs[0]
    args = first["arguments"]
    requests = ours["requests"]
    if len(args) != len(requests):
        return [f"{len(requests)} requests, lm-eval has {len(args)}"]
    for i, req in enumerate(requests):
        arg = args[f"gen_args_{i}"]
        if arg["arg_0"] != req["context"]:
            diffs.append(f"request {i}: the prompts differ")
        resp = first["resps"][i][0]
        if req["type"] == "loglikelihood":
            if arg["arg_1"] != req["continuation"]:
                diffs.append(f"request {i}: the continuations differ")
            logprob, greedy = float(resp[0]), str(resp[1]) == "True"
            if not close(logprob, req["logprob"]):
                diffs.append(f"request {i}: log-likelihood {req['logprob']} vs {logprob}")
            if greedy != req["is_greedy"]:
                diffs.append(f"request {i}: is_greedy {req['is_greedy']} vs {greedy}")
        elif req["type"] == "generate":
            if resp != req["text"]:
                diffs.append(f"request {i}: generated {req['text']!r} vs {resp!r}")
    for rec in theirs:
        name = rec.get("filter", "none")
        if name in ours.get("answers", {}) and rec["filtered_resps"][0] != ours["answers"][name]:
            diffs.append(
                f"filter {name}: answer {ours['answers'][name]!r} vs {rec['filtered_resps'][0]!r}"
            )
    for key, value in ours["values"].items():
        metric, _, filt = key.partition(",")
        counterparts = 0
        for rec in theirs:
            mapped = VALUES.get(key, metric if filt == rec.get("filter", "none") else None)
            for k in (mapped,) if isinstance(mapped, str) else mapped or ():
                if k in rec:
                    counterparts += 1
                    if float(rec[k]) != value:
                        diffs.append(f"{key}: {value} vs lm-eval's {k} {rec[k]}")
        # A value lm-eval does not report is a difference, not something to pass over.
        if counterparts == 0:
            diffs.append(f"{key}: lm-eval's samples have no counterpart")
    return diffs


def main() -> None:
    results = json.loads(Path(sys.argv[1]).read_text())
    out = Path(sys.argv[2])
    wanted = set(sys.argv[3:])
    failed = False
    for task in results["tasks"]:
        name = task["task"]
        if wanted and name not in wanted:
            continue
        theirs = lm_eval_samples(out, name)
        compared = 0
        problems = []
        for sample in task.get("samples") or []:
            if sample["doc"] not in theirs:
                continue
            compared += 1
            for d in compare_doc(name, sample, theirs[sample["doc"]]):
                problems.append(f"  document {sample['doc']}: {d}")
        status = "agree" if not problems and compared else "DIFFER"
        print(f"{name}: {compared} documents compared, {status}")
        for p in problems:
            print(p)
        failed |= bool(problems) or compared == 0
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
