"""Scoring through transformers for zflow's evaluation harness (``evals/src/transformers.rs``):
``python -m zflow_torch.score FOLDER DEVICE`` loads a ZAYA1 Hugging Face folder in
transformers 5.23's layout with ``AutoModelForCausalLM.from_pretrained`` (float32) on
``DEVICE`` (``cpu``, ``cuda:N``; a ROCm build of PyTorch names its GPUs ``cuda`` too), then
answers one JSON line on stdout per JSON line on stdin:

- ``{"op": "loglikelihood", "groups": [[{"context": [ids], "continuation": [ids]}, ...], ...]}``
  -> ``{"scores": [[[logprob, is_greedy], ...], ...]}``: each request's summed log-probability
  of its continuation and whether every continuation token was the argmax, group by group. A
  group is one document's requests; for models from ``SHARE_PREFIX_MIN_HIDDEN`` wide up, their
  shared prefix runs once (``hidden_states``); smaller ones run a line's groups as one batch.
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
from transformers import AutoModelForCausalLM, DynamicCache, ZayaForCausalLM
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


def shared_prefix(rows: list[list[int]]) -> int:
    """How many leading tokens every row shares, leaving each row at least one token after
    them (the pass that continues from the prefix's cache needs one)."""
    limit = min(len(r) for r in rows) - 1
    n = 0
    while n < limit and all(r[n] == rows[0][n] for r in rows):
        n += 1
    return n


def hidden_states(
    net: ZayaForCausalLM, rows: list[list[int]], share_prefix: bool
) -> list[torch.Tensor]:
    """The last hidden state at every position of every row, ``[len(row), hidden]`` each, in
    one right-padded batch: padding after a row's tokens changes none of its positions (the
    model is causal).

    With ``share_prefix``, the rows' shared prefix runs once, batch 1, filling transformers'
    cache (attention keys and values, and the CCA convolution and delayed-value states); the
    cache is copied to every row and the rest of each row runs after it."""
    device = next(net.parameters()).device
    p = shared_prefix(rows) if share_prefix and len(rows) > 1 else 0
    cache = None
    prefix = None
    if p > 0:
        cache = DynamicCache(config=net.config)
        out = net.model(
            input_ids=torch.tensor([rows[0][:p]], device=device),
            past_key_values=cache,
            use_cache=True,
        )
        prefix = out.last_hidden_state[0]
        cache = out.past_key_values
        cache.reorder_cache(torch.zeros(len(rows), dtype=torch.long, device=device))
    width = max(len(r) for r in rows) - p
    ids = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, : len(row) - p] = torch.tensor(row[p:])
    positions = torch.arange(p, p + width, device=device)[None].expand(len(rows), -1)
    rest = net.model(
        input_ids=ids.to(device),
        past_key_values=cache,
        use_cache=cache is not None,
        position_ids=positions,
    ).last_hidden_state
    return [
        torch.cat([prefix, rest[i, : len(row) - p]]) if prefix is not None else rest[i, : len(row)]
        for i, row in enumerate(rows)
    ]


def score(
    net: ZayaForCausalLM, requests: list[dict[str, list[int]]], share_prefix: bool
) -> list[list[Any]]:
    """``[logprob, is_greedy]`` for each request, in one batch (``hidden_states``).

    Only the positions that predict a continuation token go through the output layer and the
    log-softmax, so no ``[rows, length, vocabulary]`` tensor is ever made."""
    rows = [r["context"] + r["continuation"][:-1] for r in requests]
    states = hidden_states(net, rows, share_prefix)
    picked = torch.cat(
        [
            h[len(r["context"]) - 1 : len(r["context"]) - 1 + len(r["continuation"])]
            for h, r in zip(states, requests, strict=True)
        ]
    )
    logp = torch.log_softmax(net.lm_head(picked).float(), dim=-1).cpu()
    targets = torch.tensor([t for r in requests for t in r["continuation"]])
    chosen = logp.gather(1, targets[:, None])[:, 0].double()
    hits = logp.argmax(dim=-1) == targets
    out = []
    at = 0
    for r in requests:
        n = len(r["continuation"])
        out.append([float(chosen[at : at + n].sum()), bool(hits[at : at + n].all())])
        at += n
    return out


# From this width up, a forward pass costs more than its call: each group runs on its own with
# its prefix once. Below it (the test and nano models), a call's fixed cost dominates and the
# message's groups run as one batch. A function of the model alone, so a model's scores never
# depend on how its requests were batched by timing.
SHARE_PREFIX_MIN_HIDDEN = 1024


def loglikelihood(
    net: ZayaForCausalLM, groups: list[list[dict[str, list[int]]]]
) -> list[list[list[Any]]]:
    """Scores of ``groups`` (one document's requests each), group by group."""
    with torch.inference_mode():
        if net.config.hidden_size >= SHARE_PREFIX_MIN_HIDDEN:
            return [score(net, g, share_prefix=True) if g else [] for g in groups]
        requests = [r for g in groups for r in g]
        flat = score(net, requests, share_prefix=False) if requests else []
        out = []
        for g in groups:
            out.append(flat[: len(g)])
            flat = flat[len(g) :]
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
            reply: dict[str, Any] = {"scores": loglikelihood(net, msg["groups"])}
        elif msg["op"] == "generate":
            reply = {"tokens": generate(net, msg["context"], msg["max_new_tokens"])}
        else:
            raise SystemExit(f"unknown op {msg['op']!r}")
        print(json.dumps(reply), flush=True)


if __name__ == "__main__":
    serve(Path(sys.argv[1]), sys.argv[2])
