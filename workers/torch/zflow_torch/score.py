"""Scoring through transformers for zflow's evaluation harness (``evals/src/transformers.rs``):
``python -m zflow_torch.score FOLDER DEVICE`` loads a ZAYA1 Hugging Face folder in
transformers 5.23's layout with ``AutoModelForCausalLM.from_pretrained`` (float32) on
``DEVICE`` (``cpu``, ``cuda:N``; a ROCm build of PyTorch names its GPUs ``cuda`` too), then
answers one JSON line on stdout per JSON line on stdin:

- ``{"op": "loglikelihood", "requests": [{"context": [ids], "continuation": [ids]}, ...]}``
  -> ``{"scores": [[logprob, is_greedy], ...]}``: each request's summed log-probability of its
  continuation and whether every continuation token was the argmax. All requests of a line go
  through one batched forward pass, right-padded: the model is causal (attention and the CCA
  convolutions), so padding after a row's tokens changes none of its positions.
- ``{"op": "generate", "context": [ids], "max_new_tokens": n}`` -> ``{"tokens": [ids]}``: greedy
  decoding with transformers' cache (the harness applies its stop rules to the result).

The first line it writes is ``{"ready": true, "transformers": ..., "torch": ..., "device": ...}``.
A folder that states ``"zflow_skip_output": "input"`` is scored with the older skip semantics
(``skip_input_forward``, the one place zflow changes transformers). Token ids only:
tokenization is the harness's.
"""

import json
import sys
from pathlib import Path
from typing import Any

import torch
import transformers
from torch import nn
from transformers import AutoModelForCausalLM, ZayaForCausalLM
from transformers.models.zaya import modeling_zaya

_ORIGINAL_FORWARD = modeling_zaya.ZayaSparseMoeBlock.forward


def skip_input_forward(
    self: nn.Module,
    hidden_states: torch.Tensor,
    prev_router_hidden_states: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``ZayaSparseMoeBlock.forward`` with the older skip semantics: transformers' expert output
    plus, for tokens on the skip route, the normed input times the skip route's probability.
    The skip choice and probability are recomputed exactly as ``ZayaRouter`` computes them."""
    gate: Any = self.gate
    out, state = _ORIGINAL_FORWARD(self, hidden_states, prev_router_hidden_states)
    routed = gate.down_proj(hidden_states)
    if gate.use_eda and prev_router_hidden_states is not None:
        routed = routed + prev_router_hidden_states * gate.router_states_scale
    probs = torch.softmax(gate.router_mlp(routed), dim=-1)
    choice = (probs.detach().float() + gate.balancing_biases).argmax(dim=-1)
    skip = (choice == gate.num_experts)[..., None]
    extra = torch.where(skip, hidden_states * probs[..., -1:], torch.zeros_like(hidden_states))
    return out + extra, state


def load(folder: Path, device: str) -> ZayaForCausalLM:
    """The folder's model, float32, in eval mode, with the skip semantics its config states."""
    net: ZayaForCausalLM = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    net = net.to(device)
    net.eval()
    if getattr(net.config, "zflow_skip_output", "zero") == "input":
        modeling_zaya.ZayaSparseMoeBlock.forward = skip_input_forward
    return net


def loglikelihood(net: ZayaForCausalLM, requests: list[dict[str, list[int]]]) -> list[list[Any]]:
    rows = [r["context"] + r["continuation"][:-1] for r in requests]
    width = max(len(r) for r in rows)
    ids = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = torch.tensor(row)
    device = next(net.parameters()).device
    with torch.no_grad():
        logp = torch.log_softmax(net(input_ids=ids.to(device)).logits.float(), dim=-1).cpu()
    out = []
    for i, r in enumerate(requests):
        at = len(r["context"]) - 1
        cont = torch.tensor(r["continuation"])
        dist = logp[i, at : at + len(cont)]
        total = float(dist.gather(1, cont[:, None]).double().sum())
        greedy = bool((dist.argmax(dim=-1) == cont).all())
        out.append([total, greedy])
    return out


def generate(net: ZayaForCausalLM, context: list[int], max_new_tokens: int) -> list[int]:
    device = next(net.parameters()).device
    ids = torch.tensor([context], device=device)
    with torch.no_grad():
        out = net.generate(ids, max_new_tokens=max_new_tokens, do_sample=False)
    tokens: list[int] = out[0, len(context) :].tolist()
    return tokens


def serve(folder: Path, device: str) -> None:
    # Progress bars would go to the harness's terminal, between its own.
    transformers.utils.logging.disable_progress_bar()
    net = load(folder, device)
    hello = {
        "ready": True,
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name(device) if device.startswith("cuda") else "cpu",
    }
    print(json.dumps(hello), flush=True)
    for line in sys.stdin:
        msg = json.loads(line)
        if msg["op"] == "loglikelihood":
            reply: dict[str, Any] = {"scores": loglikelihood(net, msg["requests"])}
        elif msg["op"] == "generate":
            reply = {"tokens": generate(net, msg["context"], msg["max_new_tokens"])}
        else:
            raise SystemExit(f"unknown op {msg['op']!r}")
        print(json.dumps(reply), flush=True)


if __name__ == "__main__":
    serve(Path(sys.argv[1]), sys.argv[2])
