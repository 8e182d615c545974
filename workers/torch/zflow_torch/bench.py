"""``python -m zflow_torch.bench CONFIG_JSON``: the torch engine's own training step, timed, for
``zflow bench train`` (which writes the config: the model, the training settings, batch,
sequence length, steps, threads). It builds the worker's model and optimizers through
``Trainer`` and times ``Trainer.train_step`` (forward, backward, clipping, Muon + AdamW) on
random tokens: the real worker's step, without the data plane and checkpoints. Prints one JSON
line: ``step_s`` (the best of the timed steps), ``tokens_per_s``, ``torch``.
"""

import io
import json
import sys
import tempfile
import time

import torch

from zflow_torch import model, trainer
from zflow_torch.contract import Emitter


def main(path: str) -> None:
    with open(path) as f:
        cfg = json.load(f)
    batch, seq_len, steps = cfg["batch"], cfg["seq_len"], cfg["steps"]
    torch.set_num_threads(cfg["threads"])
    with tempfile.TemporaryDirectory() as d:
        job = {
            "phase": "bench",
            "model": cfg["model"],
            "train": {**cfg["train"], "global_batch": batch, "micro_batch": batch},
            "checkpoints": d,
            "mixture": "",
            "sources": [],
        }
        t = trainer.Trainer(job, "cpu", Emitter(io.StringIO()))
        t.seq_len = seq_len
        t.build_model()
        t.new_optimizers()
        m = cfg["model"]
        routes = m["num_experts"] + 1
        model.set_biases(t.net, [[0.0] * (routes - 1) + [-1.0]] * m["num_blocks"])
        gen = torch.Generator().manual_seed(0)

        def step() -> None:
            rows = torch.randint(0, m["vocab_size"], (batch, seq_len + 1), generator=gen)
            t.train_step([(rows[:, :-1], rows[:, 1:])], 1e-3)

        step()  # warm-up: allocation, first-call costs
        times = []
        for _ in range(steps):
            started = time.perf_counter()
            step()
            times.append(time.perf_counter() - started)
        # The best step, as `zflow bench train` reports every side's.
        step_s = min(times)
    print(
        json.dumps(
            {"step_s": step_s, "tokens_per_s": batch * seq_len / step_s, "torch": torch.__version__}
        )
    )


if __name__ == "__main__":
    main(sys.argv[1])
