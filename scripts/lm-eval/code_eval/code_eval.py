"""An offline stand-in for the `code_eval` metric that lm-eval's humaneval and mbpp load with
`evaluate.load("code_eval")`.

`evaluate` fetches that metric's script from the Hugging Face Hub (it is not in the PyPI
package), which this project cannot reach. `evaluate.load(name)` first looks for a folder of that name holding a script of that name
under the working directory, so run.sh runs lm_eval from scripts/lm-eval/ and this file is
loaded instead, lm-eval's task code unchanged. It is written here from the metric's documented
behaviour, which it keeps:

- `compute(predictions, references, k=[1, 10, 100], num_workers=4, timeout=3.0)`:
  predictions[i] is a list of candidate programs for task i, references[i] its test code;
  each candidate runs as `candidate + "\\n" + reference`, in a fresh process (forked), in a
  temporary working directory, with its stdin/stdout/stderr swallowed, for at most `timeout`
  seconds; it passes when it runs to the end without raising.
- It returns `(pass_at_k, results)`: pass_at_k maps "pass@K" to the mean over tasks of the
  unbiased estimator 1 - C(n - c, K) / C(n, K) (n candidates, c passing), for each K that no
  task has fewer than K candidates for; results maps each task index to a list of
  `(completion_id, {"task_id", "passed", "result", "completion_id"})`, result being "passed",
  "timed out" or "failed: <exception>".
- It refuses to run unless HF_ALLOW_CODE_EVAL=1.

Before running a candidate the child process disables the obvious ways to harm the machine
(killing processes, deleting or moving files, spawning programs; the metric does the same).
It is not a sandbox: run only on a machine you can afford to lose anything writable on.
"""

import contextlib
import io
import multiprocessing
import os
import signal
import tempfile
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor, as_completed
from multiprocessing.queues import SimpleQueue
from typing import Any

import datasets
import evaluate
import numpy as np

_REFUSAL = (
    "code_eval runs untrusted model output as Python. Set HF_ALLOW_CODE_EVAL=1 to allow it "
    "(run.sh does), on a machine where that is acceptable."
)


class _Timeout(Exception):
    pass


class _Swallow(io.StringIO):
    """An output stream that keeps nothing and an input stream that refuses to be read."""

    def write(self, s: str) -> int:
        return len(s)

    def read(self, *args: object, **kwargs: object) -> str:
        raise OSError("stdin is closed")

    readline = read
    readlines = read

    def readable(self) -> bool:
        return False


def _disable_harm() -> None:
    import builtins
    import shutil
    import subprocess
    import sys

    os.environ["OMP_NUM_THREADS"] = "1"
    for name in (
        "kill", "killpg", "system", "putenv", "remove", "removedirs", "rmdir", "fchdir",
        "setuid", "fork", "forkpty", "rename", "renames", "truncate", "replace", "unlink",
        "fchmod", "fchown", "chmod", "chown", "chroot", "lchown", "getcwd", "chdir",
    ):  # fmt: skip
        if hasattr(os, name):
            setattr(os, name, None)
    shutil.rmtree = None  # type: ignore[assignment]
    shutil.move = None  # type: ignore[assignment]
    shutil.chown = None  # type: ignore[assignment]
    subprocess.Popen = None  # type: ignore[assignment,misc]
    builtins.help = None  # type: ignore[assignment]
    for mod in ("ipdb", "joblib", "resource", "psutil", "tkinter"):
        sys.modules[mod] = None  # type: ignore[assignment]


def _run(program: str, timeout: float, work: str, out: "SimpleQueue[str]") -> None:
    """In the child: runs `program` in the directory `work`, puts its verdict on `out`."""
    import sys

    os.chdir(work)

    def alarm(signum: int, frame: object) -> None:
        raise _Timeout()

    signal.signal(signal.SIGALRM, alarm)
    sink = _Swallow()
    verdict = "timed out"
    try:
        _disable_harm()
        with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
            sys.stdin = sink
            signal.setitimer(signal.ITIMER_REAL, timeout)
            try:
                exec(program, {})  # noqa: S102 -- the point of the metric
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
        verdict = "passed"
    except _Timeout:
        verdict = "timed out"
    except BaseException as e:  # noqa: BLE001 -- any failure of the candidate is a fail
        verdict = f"failed: {e}"
    out.put(verdict)
    # Not the parent's atexit handlers, nor its buffered output.
    os._exit(0)


def check(program: str, timeout: float, task_id: int, completion_id: int) -> dict[str, Any]:
    ctx = multiprocessing.get_context("fork")
    out = ctx.SimpleQueue()
    with tempfile.TemporaryDirectory(prefix="code_eval-") as work:
        p = ctx.Process(target=_run, args=(program, timeout, work, out))
        p.start()
        p.join(timeout=timeout + 1)
        if p.is_alive():
            p.kill()
            p.join()
    result = out.get() if not out.empty() else "timed out"
    return {
        "task_id": task_id,
        "passed": result == "passed",
        "result": result,
        "completion_id": completion_id,
    }


def pass_at_k(n: np.ndarray, c: np.ndarray, k: int) -> np.ndarray:
    """1 - C(n - c, k) / C(n, k) per task, as a numerically stable product."""

    def one(n: int, c: int) -> float:
        if n - c < k:
            return 1.0
        return 1.0 - float(np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))

    return np.array([one(int(a), int(b)) for a, b in zip(n, c, strict=True)])


class CodeEval(evaluate.Metric):
    def _info(self) -> evaluate.MetricInfo:
        return evaluate.MetricInfo(
            module_type="metric",
            description=__doc__ or "",
            citation="",
            inputs_description="predictions: list of lists of programs; references: test code",
            features=datasets.Features(
                {
                    "predictions": datasets.Sequence(datasets.Value("string")),
                    "references": datasets.Value("string"),
                }
            ),
        )

    def _compute(
        self,
        predictions: list[list[str]],
        references: list[str],
        k: list[int] = [1, 10, 100],  # noqa: B006 -- the metric's signature
        num_workers: int = 4,
        timeout: float = 3.0,
    ) -> tuple[dict[str, float], dict[int, list[tuple[int, dict[str, Any]]]]]:
        if os.getenv("HF_ALLOW_CODE_EVAL", "0") != "1":
            raise ValueError(_REFUSAL)
        results: dict[int, list[tuple[int, dict[str, Any]]]] = defaultdict(list)
        with ThreadPoolExecutor(max_workers=num_workers) as pool:
            futures = []
            for task_id, (candidates, test) in enumerate(zip(predictions, references, strict=True)):
                for completion_id, candidate in enumerate(candidates):
                    program = candidate + "\n" + test
                    futures.append(pool.submit(check, program, timeout, task_id, completion_id))
            for fut in as_completed(futures):
                r = fut.result()
                results[r["task_id"]].append((r["completion_id"], r))
        total, correct = [], []
        for task_id in sorted(results):
            runs = sorted(results[task_id], key=lambda x: x[0])
            total.append(len(runs))
            correct.append(sum(r[1]["passed"] for r in runs))
        n, c = np.array(total), np.array(correct)
        ks = [k] if isinstance(k, int) else k
        scores = {f"pass@{kk}": float(pass_at_k(n, c, kk).mean()) for kk in ks if (n >= kk).all()}
        return scores, results
