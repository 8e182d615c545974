"""The same training step in plain transformers + PyTorch, for `zflow bench train` to compare
against: transformers 5.23's own ZayaForCausalLM (its stacked experts, its loss), built from
the recipe's model (the config mapping is `zflow_torch.model.hf_config`, the one place zflow
maps its model onto transformers'), and the optimizer loop a user of transformers would
write, by the config's ``optimizer``:

- ``adamw`` (the default): torch.optim.AdamW over every parameter;
- ``muon``: torch.optim.Muon over the 2-D matrices of the hidden layers, AdamW over the rest,
  as torch's Muon documents it. Stock ZayaForCausalLM stacks each layer's experts into one 3-D
  tensor, which torch's Muon refuses, so the experts go to AdamW here, where the engine gives
  each expert's matrices to Muon: this side does less Newton-Schulz work than the engine.

Usage: bench_train_torch.py CONFIG_JSON  -> prints one JSON line {"tokens_per_s": ..., ...}
(CONFIG_JSON: model, batch, seq_len, steps, threads, optimizer; run with workers/torch on
PYTHONPATH).
"""

import json
import sys
import time

import torch
import transformers
from transformers import ZayaForCausalLM
from zflow_torch.job import ModelConfig, decode
from zflow_torch.model import hf_config


def main() -> None:
    with open(sys.argv[1]) as f:
        cfg = json.load(f)
    torch.manual_seed(0)
    torch.set_num_threads(cfg.get("threads", torch.get_num_threads()))
    config = hf_config(decode(ModelConfig, cfg["model"], "model"))
    config._attn_implementation = "sdpa"
    net = ZayaForCausalLM(config)
    net.train()
    optimizer = cfg.get("optimizer", "adamw")
    if optimizer == "muon":
        hidden = [p for n, p in net.named_parameters() if p.ndim == 2 and "embed" not in n]
        rest = [p for n, p in net.named_parameters() if not (p.ndim == 2 and "embed" not in n)]
        muon = torch.optim.Muon(hidden, lr=3e-3, adjust_lr_fn="match_rms_adamw")
        opts: list[torch.optim.Optimizer] = [muon, torch.optim.AdamW(rest, lr=3e-3)]
    elif optimizer == "adamw":
        opts = [torch.optim.AdamW(net.parameters(), lr=3e-3)]
    else:
        raise SystemExit(f"{sys.argv[1]}: unknown optimizer {optimizer!r} (adamw or muon)")
    b, s, v = cfg["batch"], cfg["seq_len"], config.vocab_size
    data = torch.randint(0, v, (b, s), generator=torch.Generator().manual_seed(1))

    def step() -> float:
        loss = net(input_ids=data, labels=data).loss
        loss.backward()
        for opt in opts:
            opt.step()
            opt.zero_grad(set_to_none=True)
        return float(loss.item())

    step()  # warm-up
    times = []
    loss = 0.0
    for _ in range(cfg["steps"]):
        t = time.perf_counter()
        loss = step()
        times.append(time.perf_counter() - t)
    best = min(times)
    print(
        json.dumps(
            {
                "tokens_per_s": b * s / best,
                "step_s": best,
                "loss": loss,
                "optimizer": "torch.optim.Muon + AdamW" if optimizer == "muon" else "AdamW",
                "threads": torch.get_num_threads(),
                "torch": torch.__version__,
                "transformers": transformers.__version__,
            }
        )
    )


if __name__ == "__main__":
    main()
