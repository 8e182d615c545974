"""The transformers side of zflow's parity tests with transformers 5.23
(``tests/transformers_parity.rs``):

- ``python -m zflow_torch.parity make DIR SKIP_OUTPUT [sliding]`` writes a random tiny
  ``ZayaForCausalLM`` (with ``sliding``, its second layer a ``hybrid_sliding`` one: a window of
  6 tokens and RoPE base 1e4)
  with ``save_pretrained`` (every parameter perturbed, so no scale is 1 and no bias 0;
  non-zero balancing biases, the skip one -1.0 as transformers loads it; RoPE base 1e6) and
  ``DIR/requests.json``: groups of (context, continuation) token ids, contexts longer than the
  convolution kernels.
- ``python -m zflow_torch.parity generate DIR PROMPT`` loads an exported folder and its
  tokenizer with ``AutoTokenizer`` / ``AutoModelForCausalLM.from_pretrained`` and prints the 8
  tokens ``generate`` adds to ``PROMPT`` (``tests/train.rs``, on a trained model's export).
- ``python -m zflow_torch.parity score DIR REQUESTS`` loads ``DIR`` with
  ``AutoModelForCausalLM.from_pretrained`` and prints one JSON line: each request's summed
  log-probability and whether it is greedy, the tokens each router sent to each route, and
  8 tokens that ``generate`` decodes greedily after the first context.

transformers 5.23 gives a token on the skip route a zero MoE output. A folder whose
``config.json`` says ``"zflow_skip_output": "input"`` (the older semantics: the normed input,
scaled by the skip route's probability) is scored with the MoE block's forward patched to add
that term (``score.skip_input_forward``), the one place zflow changes transformers.
"""

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn
from transformers import AutoModelForCausalLM, AutoTokenizer, ZayaConfig, ZayaForCausalLM

from zflow_torch.score import load

VOCAB = 97


def _config(skip_output: str, sliding: bool) -> ZayaConfig:
    return ZayaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        moe_intermediate_size=16,
        num_experts=4,
        router_hidden_size=16,
        layer_types=["hybrid", "hybrid_sliding" if sliding else "hybrid"],
        sliding_window=6 if sliding else None,
        rope_parameters={
            "hybrid": {"rope_type": "default", "rope_theta": 1e6, "partial_rotary_factor": 0.5},
            "hybrid_sliding": {
                "rope_type": "default",
                "rope_theta": 1e4,
                "partial_rotary_factor": 0.5,
            },
        },
        tie_word_embeddings=True,
        pad_token_id=None,
        bos_token_id=None,
        eos_token_id=None,
        zflow_skip_output=skip_output,
    )


def make(out: Path, skip_output: str, sliding: bool) -> None:
    torch.manual_seed(0)
    net = ZayaForCausalLM(_config(skip_output, sliding))
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in net.parameters():
            p.add_(0.2 * torch.randn(p.shape, generator=gen))
        # Routers whose choice varies from token to token (not one route for all of them).
        for layer in net.model.layers:
            layer.mlp.gate.router_mlp.out_proj.weight.mul_(8.0)
    groups = []
    for g in range(6):
        context = torch.randint(0, VOCAB, (10 + g,), generator=gen).tolist()
        choices = [
            torch.randint(0, VOCAB, (1 + (g + c) % 5,), generator=gen).tolist() for c in range(4)
        ]
        groups.append([{"context": context, "continuation": c} for c in choices])
    _balance(net, groups)
    net.save_pretrained(out)
    (out / "requests.json").write_text(json.dumps(groups))


def _balance(net: ZayaForCausalLM, groups: list[list[dict[str, list[int]]]]) -> None:
    """Sets balancing biases that send at least 5% of the requests' tokens to every route
    (skip included) in every layer: a few steps of a proportional controller on the realised
    shares, then each router's biases shifted so that its skip bias is -1.0."""
    ids = [torch.tensor([r["context"] + r["continuation"]]) for g in groups for r in g]
    gates = [layer.mlp.gate for layer in net.model.layers]
    routes = gates[0].balancing_biases.numel()
    with torch.no_grad():
        for _ in range(200):
            shares = torch.zeros(len(gates), routes)
            hooks = [g.register_forward_hook(_counter(shares[i])) for i, g in enumerate(gates)]
            for x in ids:
                net(input_ids=x)
            for h in hooks:
                h.remove()
            shares /= shares.sum(dim=1, keepdim=True)
            if bool((shares >= 0.05).all()):
                break
            for i, g in enumerate(gates):
                g.balancing_biases.sub_(0.01 * torch.sign(shares[i] - 1.0 / routes))
        else:
            raise RuntimeError(f"could not balance the random routers: shares {shares.tolist()}")
        for g in gates:
            g.balancing_biases.sub_(g.balancing_biases[-1].item() + 1.0)


Hook = Callable[[nn.Module, object, tuple[torch.Tensor, ...]], None]


def _counter(into: torch.Tensor) -> Hook:
    """A forward hook on a ``ZayaRouter`` that adds the tokens it sends to each route (its
    choice: the argmax of the probabilities plus the balancing biases) into ``into``."""

    def hook(module: nn.Module, _args: object, output: tuple[torch.Tensor, ...]) -> None:
        biases = module.get_buffer("balancing_biases")
        choice = (torch.softmax(output[0], dim=-1) + biases).argmax(dim=-1)
        into.add_(torch.bincount(choice, minlength=into.numel()).float())

    return hook


def score(folder: Path, requests: Path) -> dict[str, Any]:
    torch.set_num_threads(1)
    net = load(folder, "cpu")
    skip_output = getattr(net.config, "zflow_skip_output", "zero")

    counts = torch.zeros(len(net.model.layers), net.config.num_experts + 1)
    for i, layer in enumerate(net.model.layers):
        layer.mlp.gate.register_forward_hook(_counter(counts[i]))
    scores = []
    with torch.no_grad():
        for group in json.loads(requests.read_text()):
            for r in group:
                context, continuation = r["context"], r["continuation"]
                ids = torch.tensor([context + continuation[:-1]])
                logp = torch.log_softmax(net(input_ids=ids).logits[0].float(), dim=-1)
                total, greedy = 0.0, True
                for j, token in enumerate(continuation):
                    dist = logp[len(context) - 1 + j]
                    total += float(dist[token])
                    greedy = greedy and int(dist.argmax()) == token
                scores.append([total, greedy])
    routes = [[int(n) for n in layer] for layer in counts.tolist()]
    # `generate` runs on the folder: 8 greedy tokens after the first request's context, with
    # transformers' decode cache.
    first = json.loads(requests.read_text())[0][0]["context"]
    generated = net.generate(torch.tensor([first]), max_new_tokens=8, do_sample=False)
    return {
        "scores": scores,
        "routes": routes,
        "skip_output": skip_output,
        "generated": generated[0, len(first) :].tolist(),
    }


def generate(folder: Path, prompt: str) -> dict[str, Any]:
    """An exported folder with its tokenizer, as a user loads it: ``AutoTokenizer`` and
    ``AutoModelForCausalLM.from_pretrained``, then 8 greedy tokens of ``generate``."""
    tok = AutoTokenizer.from_pretrained(folder)
    net = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    ids = tok(prompt, return_tensors="pt").input_ids
    out = net.generate(ids, max_new_tokens=8, do_sample=False)
    new = out[0, ids.shape[1] :].tolist()
    return {"model": type(net).__name__, "tokens": new, "text": tok.decode(out[0])}


def main(argv: list[str]) -> None:
    if argv[0] == "generate":
        print(json.dumps(generate(Path(argv[1]), argv[2])))
    elif argv[0] == "make":
        make(Path(argv[1]), argv[2], sliding=argv[3:] == ["sliding"])
    elif argv[0] == "score":
        print(json.dumps(score(Path(argv[1]), Path(argv[2]))))
    else:
        raise SystemExit(
            f"usage: python -m zflow_torch.parity make DIR SKIP [sliding] | score DIR REQUESTS "
            f"| generate DIR PROMPT (got {argv})"
        )


if __name__ == "__main__":
    main(sys.argv[1:])
