"""Scoring through transformers for zflow's evaluation harness (``evals/src/transformers.rs``):
``python -m zflow_torch.score FOLDER DEVICE [TOKENIZER_JSON]`` loads a Hugging Face folder in
transformers 5.23's layout (a ZAYA1, or another causal LM transformers knows: the lm-eval
agreement test scores Gemma 3) with ``AutoModelForCausalLM.from_pretrained`` (float32) on
``DEVICE`` (``cpu``, ``cuda:N``; a ROCm build of PyTorch names its GPUs ``cuda`` too), and the
model's ``tokenizer.json`` (a ``tokenizers`` file, used only to check stop strings), then
answers one JSON line on stdout per JSON line on stdin:

- ``{"op": "loglikelihood", "groups": [[{"context": [ids], "continuation": [ids]}, ...], ...]}``
  -> ``{"scores": [[[logprob, is_greedy], ...], ...]}``: each request's summed log-probability
  of its continuation and whether every continuation token was the argmax, group by group. A
  group is one document's requests; for models from ``SHARE_PREFIX_MIN_HIDDEN`` wide up, their
  shared prefix runs once (``hidden_states``); smaller ones run a line's groups as one batch.
- ``{"op": "generate", "contexts": [[ids], ...], "max_new_tokens": n, "until": ["stop", ...],
  "eos": [ids]}`` -> ``{"generations": [[ids], ...]}``: greedy decoding of every context at
  once, one left-padded batch through transformers' cache (``generate``). A row stops at the
  first token after which its generated tokens, decoded with special tokens kept, contain an
  ``until`` string (empty ones are ignored), or at a token of ``eos``; its generation ends with
  that token. The batch stops when every row has, or after ``max_new_tokens``. Each row's
  tokens are those it would get alone. ``until`` needs TOKENIZER_JSON.

The first line it writes is ``{"ready": true, "transformers": ..., "torch": ..., "device": ...}``,
or ``{"ready": false, "error": "..."}`` when it refuses the folder (``FolderError``): weights
that do not match the model its ``config.json`` describes. A folder is refused, before
transformers allocates the model, when the config describes more parameter values than its
safetensors hold; and after loading, when transformers reports any tensor missing, unexpected,
of another shape, or failing to load. Transformers would otherwise fill a missing tensor with
random values and score them.
A folder that states ``"zflow_skip_output": "input"`` is scored with the older skip semantics
(``skip_input_forward``, the one place zflow changes transformers). Token ids in and out: the
harness tokenizes, and decodes what is generated.
"""

import json
import math
import sys
import traceback
from pathlib import Path
from typing import Any

import torch
import transformers
from safetensors import safe_open
from tokenizers import Tokenizer
from torch import nn
from transformers import AutoConfig, AutoModelForCausalLM, DynamicCache, PreTrainedModel
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


class FolderError(Exception):
    """A Hugging Face folder whose weights are not the model its ``config.json`` describes."""


# How many names an error lists before it says how many more there are.
LISTED_NAMES = 5


def listed(names: list[str]) -> str:
    """``names``, sorted, the first ``LISTED_NAMES`` of them quoted and the rest counted."""
    names = sorted(names)
    shown = ", ".join(f"`{n}`" for n in names[:LISTED_NAMES])
    more = len(names) - LISTED_NAMES
    return shown + (f" and {more} more" if more > 0 else "")


def weight_files(folder: Path) -> list[Path]:
    """``model.safetensors``, or the shards ``model.safetensors.index.json`` names."""
    single = folder / "model.safetensors"
    if single.exists():
        return [single]
    index = folder / "model.safetensors.index.json"
    if not index.exists():
        raise FolderError(f"{folder}: neither model.safetensors nor model.safetensors.index.json")
    weight_map = json.loads(index.read_text())["weight_map"]
    return [folder / name for name in sorted(set(weight_map.values()))]


def stored_shapes(folder: Path) -> dict[str, list[int]]:
    """Every stored tensor's shape, read from the safetensors headers alone."""
    shapes: dict[str, list[int]] = {}
    for path in weight_files(folder):
        with safe_open(str(path), framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 (a safe_open handle is not a dict)
                shapes[name] = list(f.get_slice(name).get_shape())
    return shapes


def check_sizes(folder: Path) -> None:
    """Refuses a folder whose ``config.json`` describes more parameter values than its
    safetensors hold, before anything is allocated: the model is built on the meta device,
    which holds no values. A tied output head counts once, as the model holds it once; names
    may differ between a file and the model (transformers renames some on load), value counts
    do not."""
    config = AutoConfig.from_pretrained(folder)
    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(config)
    params = dict(skeleton.named_parameters())
    needed = sum(p.numel() for p in params.values())
    shapes = stored_shapes(folder)
    held = sum(math.prod(shape) for shape in shapes.values())
    if needed > held:
        absent = [n for n in params if n not in shapes]
        named = f"; by name, the files lack {listed(absent)}" if absent else ""
        raise FolderError(
            f"{folder / 'config.json'} describes a model of {needed:,} parameter values, but "
            f"the safetensors hold {held:,}{named}"
        )


def check_loading(folder: Path, info: dict[str, Any]) -> None:
    """Refuses what transformers reports of a load: a tensor the model has and the files
    lack (it would be scored with random values), one the files have and the model lacks, one
    of another shape, or an error."""
    problems = []
    if info["missing_keys"]:
        problems.append(f"missing from the safetensors: {listed(list(info['missing_keys']))}")
    if info["unexpected_keys"]:
        problems.append(f"unexpected (not in the model): {listed(list(info['unexpected_keys']))}")
    for name, stored, expected in sorted(info["mismatched_keys"]):
        problems.append(f"`{name}` is {list(stored)}, the model's is {list(expected)}")
    problems.extend(str(e) for e in info["error_msgs"])
    if problems:
        raise FolderError(
            f"{folder}: its weights are not the model config.json describes: " + "; ".join(problems)
        )


def load(folder: Path, device: str) -> PreTrainedModel:
    """The folder's model, float32, in eval mode, with the skip semantics its config states;
    ``FolderError`` when its weights are not the model its config describes."""
    check_sizes(folder)
    # Mismatched shapes are reported (and refused) below, not raised without their names.
    net, info = AutoModelForCausalLM.from_pretrained(
        folder, dtype=torch.float32, output_loading_info=True, ignore_mismatched_sizes=True
    )
    check_loading(folder, info)
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
    net: PreTrainedModel, rows: list[list[int]], share_prefix: bool
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
        out = net.base_model(
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
    rest = net.base_model(
        input_ids=ids.to(device),
        past_key_values=cache,
        use_cache=cache is not None,
        position_ids=positions,
    ).last_hidden_state
    return [
        torch.cat([prefix, rest[i, : len(row) - p]]) if prefix is not None else rest[i, : len(row)]
        for i, row in enumerate(rows)
    ]


def output_logits(net: PreTrainedModel, hidden: torch.Tensor) -> torch.Tensor:
    """The logits of last hidden states, as the model's own forward makes them: its output
    layer, then the soft cap of models that have one (Gemma 2's ``final_logit_softcapping``)."""
    logits: torch.Tensor = net.get_output_embeddings()(hidden)
    cap = getattr(net.config, "final_logit_softcapping", None)
    if cap is not None:
        logits = torch.tanh(logits / cap) * cap
    return logits


def score(
    net: PreTrainedModel, requests: list[dict[str, list[int]]], share_prefix: bool
) -> list[list[Any]]:
    """``[logprob, is_greedy]`` for each request, in one batch (``hidden_states``).

    Only the positions that predict a continuation token go through the output layer and the
    log-softmax, so no ``[rows, length, vocabulary]`` tensor is ever made; the chosen tokens'
    log-probabilities and argmax verdicts are taken on the device, and summed (float64) on the
    host."""
    rows = [r["context"] + r["continuation"][:-1] for r in requests]
    states = hidden_states(net, rows, share_prefix)
    picked = torch.cat(
        [
            h[len(r["context"]) - 1 : len(r["context"]) - 1 + len(r["continuation"])]
            for h, r in zip(states, requests, strict=True)
        ]
    )
    logp = torch.log_softmax(output_logits(net, picked).float(), dim=-1)
    targets = torch.tensor([t for r in requests for t in r["continuation"]], device=logp.device)
    # Picked and judged where they were computed: only a log-probability and a verdict per
    # token cross to the host, never the [tokens, vocabulary] log-probabilities.
    chosen = logp.gather(1, targets[:, None])[:, 0].cpu().double()
    hits = (logp.argmax(dim=-1) == targets).cpu()
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
    net: PreTrainedModel, groups: list[list[dict[str, list[int]]]]
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


# How many tokens more than the longest stop string's UTF-8 bytes a row's stop check decodes
# (``stop_window``).
STOP_MARGIN_TOKENS = 8


def stop_window(until: list[str]) -> int:
    """How many of a row's last tokens its stop check decodes: enough to hold any stop string
    that the newest token completes, exactly as decoding the whole row shows it.

    Decoded with special tokens kept, every token gives at least one byte, so such an
    occurrence (it ends within the newest token, or within the few before it whose UTF-8
    character the newest one completes) starts within the last ``bytes + 4`` tokens. Decoding a
    window rather than the whole row changes only the window's start (a UTF-8 character split
    at it shows as U+FFFD, a decoder strips a leading space): the margin keeps that away from
    the occurrence. An occurrence that does not involve the newest token would have stopped the
    row a step earlier. So each step's check costs the stop strings' length, not the row's."""
    return max(len(u.encode()) for u in until) + STOP_MARGIN_TOKENS


def generate(
    net: PreTrainedModel,
    tokenizer: Tokenizer | None,
    contexts: list[list[int]],
    max_new_tokens: int,
    until: list[str],
    eos: list[int],
) -> list[list[int]]:
    """Greedy continuations of ``contexts``, one per context, as the module docstring states.

    All rows run as one batch through transformers' cache: one pass over the contexts,
    left-padded to the longest (the attention mask keeps padding out of attention, and ZAYA's
    CCA zeroes it before its convolution, as zeros before a lone row's first token are; each
    row's positions count from its first real token), then one pass per generated token. So
    each row's tokens are those it gets alone, and the last pass is the step where the last row
    stops, not ``max_new_tokens``. A row that has stopped keeps being fed (its own argmax) until
    the batch ends, and what it makes is dropped."""
    stops = [u for u in until if u]
    if stops and tokenizer is None:
        raise ValueError("stop strings need the tokenizer (the scorer's third argument)")
    if any(not c for c in contexts):
        raise ValueError("an empty context: it has no token to continue from")
    out: list[list[int]] = [[] for _ in contexts]
    if not contexts or max_new_tokens <= 0:
        return out
    device = next(net.parameters()).device
    rows = len(contexts)
    width = max(len(c) for c in contexts)
    pad = net.config.pad_token_id
    ids = torch.full((rows, width), 0 if pad is None else pad, dtype=torch.long)
    mask = torch.zeros((rows, width), dtype=torch.long)
    for i, c in enumerate(contexts):
        ids[i, width - len(c) :] = torch.tensor(c)
        mask[i, width - len(c) :] = 1
    ids, mask = ids.to(device), mask.to(device)
    positions = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 0)
    cache = DynamicCache(config=net.config)
    done = [False] * rows
    ends = set(eos)
    window = stop_window(stops) if stops else 0
    with torch.inference_mode():
        for _ in range(max_new_tokens):
            logits = net(
                input_ids=ids,
                attention_mask=mask,
                position_ids=positions,
                past_key_values=cache,
                use_cache=True,
                logits_to_keep=1,
            ).logits
            chosen = logits[:, -1].argmax(dim=-1)
            new: list[int] = chosen.tolist()
            live = [i for i in range(rows) if not done[i]]
            for i in live:
                out[i].append(new[i])
                done[i] = new[i] in ends
            live = [i for i in live if not done[i]]
            if stops and live:
                assert tokenizer is not None
                texts = tokenizer.decode_batch(
                    [out[i][-window:] for i in live], skip_special_tokens=False
                )
                for i, text in zip(live, texts, strict=True):
                    done[i] = any(u in text for u in stops)
            if all(done):
                break
            ids = chosen[:, None]
            positions = positions[:, -1:] + 1
            mask = torch.cat([mask, mask.new_ones((rows, 1))], dim=1)
    return out


def answer(
    net: PreTrainedModel, tokenizer: Tokenizer | None, msg: dict[str, Any]
) -> dict[str, Any]:
    """The reply to one request line (the module docstring's protocol)."""
    if msg["op"] == "loglikelihood":
        return {"scores": loglikelihood(net, msg["groups"])}
    if msg["op"] == "generate":
        generations = generate(
            net, tokenizer, msg["contexts"], msg["max_new_tokens"], msg["until"], msg["eos"]
        )
        return {"generations": generations}
    raise SystemExit(f"unknown op {msg['op']!r}")


def serve(folder: Path, device: str, tokenizer_file: Path | None) -> None:
    # Progress bars would go to the harness's terminal, between its own.
    transformers.utils.logging.disable_progress_bar()
    try:
        net = load(folder, device)
    except FolderError as e:
        print(json.dumps({"ready": False, "error": str(e)}), flush=True)
        raise SystemExit(2) from e
    except Exception as e:
        # Whatever else stops transformers loading the folder (a config it cannot read, a
        # safetensors file it cannot parse): the refusal names it, the trace goes to stderr.
        traceback.print_exc()
        error = f"transformers cannot load {folder}: {type(e).__name__}: {e}"
        print(json.dumps({"ready": False, "error": error}), flush=True)
        raise SystemExit(2) from e
    tokenizer = Tokenizer.from_file(str(tokenizer_file)) if tokenizer_file is not None else None
    hello = {
        "ready": True,
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name(device) if device.startswith("cuda") else "cpu",
    }
    print(json.dumps(hello), flush=True)
    for line in sys.stdin:
        print(json.dumps(answer(net, tokenizer, json.loads(line))), flush=True)


if __name__ == "__main__":
    serve(Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3]) if len(sys.argv) > 3 else None)
