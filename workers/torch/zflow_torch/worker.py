"""One rank of the torch engine: ``python -m zflow_torch.worker --job JOB --backend
cpu|cuda|rocm``, or ``--probe --backend B`` for the preflight device check (of the device
``ZFLOW_DEVICE`` names, or ``--device D``).

This entry point imports only the standard library before it starts heartbeats: loading
torch and transformers takes seconds, longer than a supervisor's hang timeout may allow
without a sign of life. The trainer itself is ``zflow_torch.trainer``.
"""

import argparse
import os
import sys
import threading
import time
import traceback

from zflow_torch import faults
from zflow_torch.contract import HEARTBEAT_S, Emitter


def heartbeat(emit: Emitter, every: float) -> None:
    """Liveness for the supervisor's hang detection, while a step or a load takes long."""
    while True:
        time.sleep(max(every, 1.0))
        emit.heartbeat(emit.last_step)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m zflow_torch.worker", description=__doc__)
    ap.add_argument("--job", help="the train job (job.json)")
    ap.add_argument("--backend", default="cpu", help="cpu, cuda or rocm")
    ap.add_argument(
        "--device", type=int, default=None, help="the GPU to probe (default: ZFLOW_DEVICE)"
    )
    ap.add_argument("--probe", action="store_true", help="only measure the device")
    args = ap.parse_args(argv)
    emit = Emitter(silenced=faults.HUNG)
    if not args.probe:
        if not args.job:
            return emit.error("--job JOB is required (or --probe)", "fatal")
        every = float(os.environ.get(HEARTBEAT_S, "15"))
        threading.Thread(target=heartbeat, args=(emit, every), daemon=True).start()
    try:
        from zflow_torch import trainer
    except ImportError as e:
        # No relaunch installs a missing package.
        print_traceback()
        return emit.error(f"the torch engine cannot load its packages: {e}", "fatal")
    try:
        trainer.prepare()
        if args.probe:
            trainer.probe_only(args.backend, args.device, emit)
        else:
            trainer.train(args.job, args.backend, emit)
        return 0
    except Exception as e:
        print_traceback()
        return emit.error(f"{type(e).__name__}: {e}", trainer.failure_class(e))


def print_traceback() -> None:
    """The exception being handled, on stderr (the stage's log), if it can be written: on a
    full disk the log cannot, and the typed error sent after it must still reach the
    supervisor (it names the cause; a bare exit status does not)."""
    try:
        traceback.print_exc(file=sys.stderr)
        sys.stderr.flush()
    except OSError:
        pass


if __name__ == "__main__":
    code = main()
    # Everything is committed and reported: leave without the interpreter's teardown, which
    # can take seconds with torch loaded, with no heartbeats, longer than a hang timeout.
    # The exit code is the contract's whatever a flush meets (a log on a full disk).
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except OSError:
            pass
    os._exit(code)
