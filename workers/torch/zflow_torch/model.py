"""ZAYA1 for the torch engine: transformers 5.23's ``ZayaForCausalLM``, built from zflow's
model config (the train job's ``model``), with zflow's routing in its MoE layers, and the map
between its parameters and zflow's checkpoint names.

What is transformers' and what is ours:

- transformers: the embedding, CCA attention (projections, convolutions, QK norm, partial
  RoPE, SDPA), the norms, the residual scaling, the router's projection, EDA and MLP, the tied
  output head. Attention runs through SDPA (``attn_implementation="sdpa"``).
- ours (``RoutedMoe``): the expert dispatch. The router's choice is the argmax of the detached
  probabilities plus the balancing biases that zflow's controller sets each step; every
  route's token count is kept for the controller; the output is scaled by the chosen route's
  probability. A token on the skip route gets what the model config's ``skip_output`` says:
  zero (transformers 5.23's semantics, the default) or the normed input (Zyphra's older
  code). Each expert's two matrices are separate 2-D parameters, not transformers' stacked
  ``[experts, out, in]`` tensors, because Muon orthogonalises whole 2-D matrices (torch's
  ``Muon`` takes 2-D parameters only) and ZeRO-1 shards whole tensors, one per expert matrix
  as zflow's checkpoints hold them.

The initial weights are drawn as the retired native engine drew them (SplitMix64, Box-Muller,
in the tensor list's order, GPT-2 scales), so a seed gives the model it always gave;
``tests/torch_model.rs`` checks the tensor list and parameter ids against the Rust formats
(``runtime/src/model``).
"""

import math
import sys
from dataclasses import dataclass
from typing import Any

import blake3
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from transformers import ZayaConfig, ZayaForCausalLM

from zflow_torch.job import ModelConfig, decode

# SplitMix64's increment (runtime/src/rng.rs).
GOLDEN = np.uint64(0x9E3779B97F4A7C15)
MASK64 = (1 << 64) - 1


class UnsupportedModel(ValueError):
    """A model config that transformers' ZAYA cannot express (named with the field)."""


def check_supported(model: ModelConfig) -> None:
    """Refuses the configs transformers 5.23's ZAYA has no switch for."""
    fixed = {
        "top_k": 1,
        "mod_skip": True,
        "router_mlp_layers": 3,
        "eda": True,
        "residual_scaling": True,
        "tie_embeddings": True,
    }
    for field, value in fixed.items():
        have = getattr(model, field)
        if have != value:
            raise UnsupportedModel(
                f"model.{field} = {have!r}: the torch engine trains transformers 5.23's "
                f"ZayaForCausalLM, which has {field} = {value!r} only"
            )


def hf_config(model: ModelConfig) -> ZayaConfig:
    """transformers' config for zflow's ``model``."""
    check_supported(model)
    return ZayaConfig(
        vocab_size=model.vocab_size,
        hidden_size=model.hidden_size,
        num_hidden_layers=model.num_blocks,
        num_attention_heads=model.num_query_heads,
        num_key_value_heads=model.num_kv_heads,
        head_dim=model.head_dim,
        cca_time0=model.conv_kernel,
        cca_time1=model.conv_kernel,
        # Blocks listed in `sliding_blocks` are transformers' `hybrid_sliding` layers, with
        # their own RoPE base; the phase's base is the full-attention layers'.
        layer_types=[
            "hybrid_sliding" if i in model.sliding_blocks else "hybrid"
            for i in range(model.num_blocks)
        ],
        sliding_window=model.sliding_window if model.sliding_blocks else None,
        rope_parameters={
            "hybrid": {
                "rope_type": "default",
                "rope_theta": model.rope_base,
                "partial_rotary_factor": model.rope_fraction,
            },
            "hybrid_sliding": {
                "rope_type": "default",
                "rope_theta": model.sliding_rope_base,
                "partial_rotary_factor": model.rope_fraction,
            },
        },
        num_experts=model.num_experts,
        num_experts_per_tok=model.top_k,
        moe_intermediate_size=model.expert_ffn,
        router_hidden_size=model.router_dim,
        rms_norm_eps=model.rms_norm_eps,
        tie_word_embeddings=True,
        # No padding row: zflow trains every embedding row (nn.Embedding's padding_idx would
        # freeze one).
        pad_token_id=None,
        bos_token_id=None,
        eos_token_id=None,
        use_cache=False,
    )


# How ``RoutedMoe`` runs its experts (``set_expert_path``; ``build`` gives ``loop``). Every path
# gives the same output, gradients and route counts: on the CPU ``grouped`` bit for bit, the
# padded ones to f32 rounding (``bmm``'s kernels are not ``mm``'s), see
# ``workers/torch/tests/test_experts.py``; ``python -m zflow_torch.experts_bench`` times them.
#
# - ``loop``: each expert on its slice of the tokens grouped by route, one ``F.linear`` pair
#   per expert, the slices cut at the route counts (``counts.tolist()``: one host sync per MoE
#   layer per forward).
# - ``grouped``: ``torch._grouped_mm`` over the grouped tokens with the experts' matrices
#   stacked (``[E, out, in]``), cut at cumulative int32 offsets computed on the device: no host
#   sync. On the CPU (f32, bf16, f16) torch runs it as one ``mm`` per expert; on CUDA bf16 on
#   sm90/sm100 has a CUTLASS kernel, other dtypes or GPUs may take that same fallback, which
#   copies the offsets to the host there (a sync again).
# - ``padded``: the grouped tokens gathered into ``[E, capacity, H]`` with capacity = the
#   number of tokens (an upper bound that needs no host sync), one ``torch.bmm`` per matrix,
#   gathered back: no host sync, but E times the loop's expert FLOPs and activation memory
#   (zero rows).
# - ``padded_max``: ``padded`` with capacity = the largest expert's token count, read with one
#   host sync (``.item()``), as ``loop`` has.
#
# The stacked paths copy the expert matrices into one tensor per forward (``torch.stack``,
# differentiable: every expert's parameter gets a gradient, zero where it had no tokens, as
# DistributedDataParallel expects) and the gradients out of it in the backward pass. A token on
# the skip route costs no expert FLOPs on any path.
EXPERT_PATHS = ("loop", "grouped", "padded", "padded_max")


def grouped_mm_available() -> bool:
    """Whether this torch has ``torch._grouped_mm`` (the ``grouped`` path)."""
    return hasattr(torch, "_grouped_mm")


class Experts(nn.Module):
    """One SwiGLU expert per route: ``gate_up[e]`` is ``[2F, H]`` (gate rows, then up rows),
    ``down[e]`` is ``[H, F]``, as nn.Linear weights."""

    def __init__(self, num_experts: int, hidden: int, ffn: int) -> None:
        super().__init__()
        self.gate_up = nn.ParameterList(
            [nn.Parameter(torch.zeros(2 * ffn, hidden)) for _ in range(num_experts)]
        )
        self.down = nn.ParameterList(
            [nn.Parameter(torch.zeros(hidden, ffn)) for _ in range(num_experts)]
        )

    def forward(self, expert: int, rows: torch.Tensor) -> torch.Tensor:
        gate, up = F.linear(rows, self.gate_up[expert]).chunk(2, dim=-1)
        out: torch.Tensor = F.linear(F.silu(gate) * up, self.down[expert])
        return out

    def stacked(self, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """Every expert's matrices in one tensor each, transposed for ``x @ w``:
        ``[E, H, 2F]`` and ``[E, F, H]`` (views of a copy made each call; differentiable)."""
        gate_up = torch.stack(list(self.gate_up)).to(dtype)
        down = torch.stack(list(self.down)).to(dtype)
        return gate_up.transpose(1, 2), down.transpose(1, 2)


def _compute_dtype(x: torch.Tensor) -> torch.dtype:
    """The dtype the experts' matrix multiplies run in: autocast's where it is on (it does not
    cover ``_grouped_mm``, so the stacked paths cast themselves, as autocast casts ``linear``)."""
    device = x.device.type
    if torch.is_autocast_enabled(device):
        return torch.get_autocast_dtype(device)
    return x.dtype


class RoutedMoe(nn.Module):
    """The MoE sub-layer with zflow's routing (see the module page); replaces
    ``ZayaSparseMoeBlock`` in each decoder layer, keeping its router (``gate``)."""

    def __init__(
        self,
        gate: nn.Module,
        experts: Experts,
        num_experts: int,
        skip_zero: bool,
        expert_path: str = "loop",
    ) -> None:
        super().__init__()
        # transformers' ZayaRouter: down_proj, router_states_scale (EDA), router_mlp, and the
        # balancing_biases buffer.
        self.gate: Any = gate
        self.experts = experts
        self.num_experts = num_experts
        # The skip route's output: zero (transformers' semantics, ``skip_output: zero``) or
        # the normed input (``input``, the older one); see ``runtime/src/model/config.rs``.
        self.skip_zero = skip_zero
        # How the experts run (``EXPERT_PATHS``, ``set_expert_path``).
        self.expert_path = expert_path
        # Tokens per route in the last forward (experts, then skip), on the device.
        self.counts: torch.Tensor | None = None

    def forward(
        self, hidden_states: torch.Tensor, prev_router_hidden_states: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        gate: Any = self.gate
        batch, seq, hidden = hidden_states.shape
        state = gate.down_proj(hidden_states)
        if gate.use_eda and prev_router_hidden_states is not None:
            state = state + prev_router_hidden_states * gate.router_states_scale
        probs = torch.softmax(gate.router_mlp(state), dim=-1).reshape(batch * seq, -1)
        routes = probs.shape[-1]
        biased = probs.detach().float() + gate.balancing_biases
        # argmax returns the first of equal maxima (a strict `>` scan).
        choice = biased.argmax(dim=-1)
        # Group the tokens by route (stable), run the experts on their groups, put them back.
        order = torch.argsort(choice, stable=True)
        flat = hidden_states.reshape(batch * seq, hidden)
        grouped = flat.index_select(0, order)
        if self.expert_path == "loop":
            counts = torch.bincount(choice, minlength=routes)
            self.counts = counts
            routed_out = self._loop(grouped, counts)
        else:
            # The same counts, from the sorted routes: CUDA's bincount reads its input's
            # largest value on the host, searchsorted needs no sync.
            route = choice.index_select(0, order)
            ends = torch.searchsorted(route, torch.arange(1, routes + 1, device=route.device))
            counts = torch.diff(ends, prepend=ends.new_zeros(1))
            self.counts = counts
            routed_out = self._stacked(grouped, route, counts)
        inverse = torch.empty_like(order)
        inverse[order] = torch.arange(order.numel(), device=order.device)
        out = routed_out.index_select(0, inverse)
        out = out * probs.gather(1, choice[:, None])
        return out.reshape(batch, seq, hidden), state

    def _loop(self, grouped: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        pieces = torch.split(grouped, counts.tolist())
        # Every expert runs, on an empty slice if need be, so that every parameter has a
        # gradient in every step (DistributedDataParallel's buckets expect all of them).
        outputs = [self.experts(e, pieces[e]) for e in range(self.num_experts)]
        skipped = pieces[self.num_experts]
        outputs.append(torch.zeros_like(skipped) if self.skip_zero else skipped)
        return torch.cat(outputs)

    def _stacked(
        self, grouped: torch.Tensor, route: torch.Tensor, counts: torch.Tensor
    ) -> torch.Tensor:
        """The stacked paths: ``grouped`` holds the tokens sorted by ``route`` (the skip
        route's last)."""
        experts = self.num_experts
        # The rows an expert takes; the rest are the skip route's.
        routed = (route < experts)[:, None]
        dtype = _compute_dtype(grouped)
        gate_up, down = self.experts.stacked(dtype)
        if self.expert_path == "grouped":
            ends = torch.cumsum(counts[:experts], 0, dtype=torch.int32)
            # `_grouped_mm` leaves the rows past the last offset unset, in its output and in
            # its input's gradient: the skip rows go in as zeros, which also keeps whatever its
            # backward leaves there out of their gradient, and come out masked below.
            rows = torch.where(routed, grouped, 0.0).to(dtype)
            gate, up = torch._grouped_mm(rows, gate_up, offs=ends).chunk(2, dim=-1)
            out = torch._grouped_mm(F.silu(gate) * up, down, offs=ends)
        elif self.expert_path in ("padded", "padded_max"):
            out = self._padded(grouped.to(dtype), route, counts, gate_up, down)
        else:
            raise ValueError(
                f"expert path `{self.expert_path}`: expected one of {', '.join(EXPERT_PATHS)}"
            )
        # In `loop`'s dtype: its `cat` promotes the experts' outputs (autocast's dtype) and the
        # skip rows (the input's) to a common one.
        out = out.to(torch.promote_types(out.dtype, grouped.dtype))
        return torch.where(routed, out, 0.0 if self.skip_zero else grouped)

    def _padded(
        self,
        grouped: torch.Tensor,
        route: torch.Tensor,
        counts: torch.Tensor,
        gate_up: torch.Tensor,
        down: torch.Tensor,
    ) -> torch.Tensor:
        experts = self.num_experts
        tokens, hidden = grouped.shape
        if self.expert_path == "padded":
            capacity = tokens
        else:
            capacity = max(int(counts[:experts].max().item()), 1) if tokens else 0
        starts = torch.cumsum(counts, 0) - counts
        # Slot (e, p) of the batch takes grouped row starts[e] + p when p < counts[e], else the
        # zero row appended at `tokens`.
        place = torch.arange(capacity, device=grouped.device)
        source = torch.where(place < counts[:experts, None], starts[:experts, None] + place, tokens)
        padded = torch.cat([grouped, grouped.new_zeros(1, hidden)])
        batch = padded.index_select(0, source.reshape(-1)).view(experts, capacity, hidden)
        gate, up = torch.bmm(batch, gate_up).chunk(2, dim=-1)
        out = torch.bmm(F.silu(gate) * up, down).reshape(experts * capacity, hidden)
        # A routed row's slot; the skip rows read slot 0 and are masked by the caller.
        rank = torch.arange(tokens, device=grouped.device) - starts.index_select(0, route)
        slot = torch.where(route < experts, route * capacity + rank, 0)
        return out.index_select(0, slot)


def set_expert_path(net: nn.Module, path: str) -> None:
    """Runs every ``RoutedMoe`` of ``net`` on ``path`` (one of ``EXPERT_PATHS``)."""
    if path not in EXPERT_PATHS:
        raise ValueError(f"expert path `{path}`: expected one of {', '.join(EXPERT_PATHS)}")
    if path == "grouped" and not grouped_mm_available():
        raise ValueError(f"expert path `grouped`: torch {torch.__version__} has no _grouped_mm")
    for module in net.modules():
        if isinstance(module, RoutedMoe):
            module.expert_path = path


def build(model: ModelConfig, seed: int | None) -> ZayaForCausalLM:
    """The model, f32, with zflow's initial weights for ``seed`` (None: left to
    the caller, who loads or initialises them)."""
    config = hf_config(model)
    config._attn_implementation = "sdpa"
    net = ZayaForCausalLM(config)
    for layer in net.model.layers:
        experts = Experts(model.num_experts, model.hidden_size, model.expert_ffn)
        skip_zero = model.skip_output == "zero"
        layer.mlp = RoutedMoe(layer.mlp.gate, experts, model.num_experts, skip_zero)
    if seed is not None:
        with torch.no_grad():
            initialise(net, model, seed)
    return net


def set_biases(net: ZayaForCausalLM, biases: list[list[float]]) -> None:
    """Sets every router's balancing biases (one list per MoE layer)."""
    with torch.no_grad():
        for layer, b in zip(net.model.layers, biases, strict=True):
            layer.mlp.gate.balancing_biases.copy_(torch.tensor(b, dtype=torch.float32))


def route_counts(net: nn.Module) -> torch.Tensor:
    """Tokens per route per MoE layer of the last forward, ``[layers, routes]``."""
    causal_lm: Any = net
    layers = causal_lm.model.layers
    return torch.stack([layer.mlp.counts for layer in layers])


@dataclass
class Tensor:
    """One parameter as zflow names it (``runtime/src/model/tensors.rs``)."""

    name: str
    # zflow's shape: linear weights ``[in, out]``, the transpose of torch's.
    shape: list[int]
    linear: bool


def zflow_tensors(m: ModelConfig) -> list[Tensor]:
    """zflow's parameter list, in its order (``model::tensors``; a Rust test compares them)."""
    h, d = m.hidden_size, m.router_dim
    lq, lk = m.num_query_heads * m.head_dim, m.num_kv_heads * m.head_dim
    ch, k = lq + lk, m.conv_kernel
    routes = m.num_experts + int(m.mod_skip)
    out: list[Tensor] = [Tensor("embed_tokens", [m.vocab_size, h], False)]

    def add(name: str, *shape: int) -> None:
        out.append(Tensor(name, list(shape), False))

    def linear(path: str, d_in: int, d_out: int, bias: bool) -> None:
        out.append(Tensor(f"{path}.weight", [d_in, d_out], True))
        if bias:
            add(f"{path}.bias", d_out)

    def res_scale(path: str, with_residual: bool) -> None:
        add(f"{path}.hidden_states_scale", h)
        add(f"{path}.hidden_states_bias", h)
        if with_residual:
            add(f"{path}.residual_scale", h)
            add(f"{path}.residual_bias", h)

    for i in range(m.num_blocks):
        b = f"blocks.{i}"
        res_scale(f"{b}.attn_res_scale", i > 0)
        add(f"{b}.attn_norm.weight", h)
        q = f"{b}.self_attn.qkv"
        linear(f"{q}.linear_q", h, lq, False)
        linear(f"{q}.linear_k", h, lk, False)
        linear(f"{q}.val_proj1", h, lk // 2, False)
        linear(f"{q}.val_proj2", h, lk - lk // 2, False)
        add(f"{q}.conv0_weight", ch, 1, k)
        add(f"{q}.conv0_bias", ch)
        add(f"{q}.conv1_weight", ch, m.head_dim, k)
        add(f"{q}.conv1_bias", ch)
        add(f"{q}.temp", m.num_kv_heads)
        linear(f"{b}.self_attn.o_proj", lq, h, False)
        res_scale(f"{b}.moe_res_scale", True)
        add(f"{b}.moe_norm.weight", h)
        r = f"{b}.moe.router"
        linear(f"{r}.down_proj", h, d, True)
        if i > 0:
            add(f"{r}.router_states_scale", d)
        add(f"{r}.rmsnorm_eda.weight", d)
        for j in range(3):
            last = j == 2
            linear(f"{r}.router_mlp.{j}", d, routes if last else d, not last)
        for e in range(m.num_experts):
            x = f"{b}.moe.local_experts.{e}"
            linear(f"{x}.linear_fc1", h, 2 * m.expert_ffn, False)
            linear(f"{x}.linear_fc2", m.expert_ffn, h, False)
    res_scale("res_scale", True)
    add("final_norm.weight", h)
    return out


def torch_name(name: str, num_blocks: int) -> str:
    """The torch parameter (in our ``ZayaForCausalLM``) that holds zflow's tensor ``name``."""
    if name == "embed_tokens":
        return "model.embed_tokens.weight"
    if name == "final_norm.weight":
        return "model.norm.weight"
    if name.startswith("res_scale."):
        return f"model.layers.{num_blocks - 1}.post_mlp_residual_scale.{name[10:]}"
    _, block, rest = name.split(".", 2)
    i = int(block)
    layer = f"model.layers.{i}"
    if rest.startswith("attn_res_scale."):
        tail = rest.split(".", 1)[1]
        # Block 0's pair gates the embeddings; block i's the output of block i - 1.
        return (
            f"model.input_{tail}"
            if i == 0
            else f"model.layers.{i - 1}.post_mlp_residual_scale.{tail}"
        )
    qkv = {
        "linear_q.weight": "q_proj.weight",
        "linear_k.weight": "k_proj.weight",
        "val_proj1.weight": "v_proj_current.weight",
        "val_proj2.weight": "v_proj_delayed.weight",
        "conv0_weight": "conv_qk_depthwise.weight",
        "conv0_bias": "conv_qk_depthwise.bias",
        "conv1_weight": "conv_qk_grouped.weight",
        "conv1_bias": "conv_qk_grouped.bias",
    }
    simple = {
        "attn_norm.weight": "input_layernorm.weight",
        "self_attn.qkv.temp": "self_attn.qk_norm.temp",
        "self_attn.o_proj.weight": "self_attn.o_proj.weight",
        "moe_norm.weight": "post_attention_layernorm.weight",
        "moe.router.rmsnorm_eda.weight": "mlp.gate.router_mlp.norm.weight",
        "moe.router.router_states_scale": "mlp.gate.router_states_scale",
    }
    if rest in simple:
        return f"{layer}.{simple[rest]}"
    if rest.startswith("self_attn.qkv."):
        return f"{layer}.self_attn.qkv_proj.{qkv[rest[14:]]}"
    if rest.startswith("moe_res_scale."):
        return f"{layer}.post_attention_residual_scale.{rest[14:]}"
    if rest.startswith("moe.router.down_proj."):
        return f"{layer}.mlp.gate.down_proj.{rest[21:]}"
    if rest.startswith("moe.router.router_mlp."):
        j, tail = rest[22:].split(".", 1)
        return f"{layer}.mlp.gate.router_mlp.{['fc1', 'fc2', 'out_proj'][int(j)]}.{tail}"
    if rest.startswith("moe.local_experts."):
        e, which, _ = rest[18:].split(".", 2)
        return f"{layer}.mlp.experts.{'gate_up' if which == 'linear_fc1' else 'down'}.{e}"
    raise KeyError(f"no torch parameter for zflow tensor `{name}`")


def init_path(name: str) -> str:
    """The path a parameter's id derives from (zflow's name, except that
    the router MLP's linears are numbered as in the reference's Sequential, 0, 2, 4)."""
    marker = ".router_mlp."
    if marker in name:
        head, rest = name.split(marker)
        j, tail = rest.split(".", 1)
        return f"{head}{marker}{2 * int(j)}.{tail}"
    return name


def param_id(name: str) -> int:
    """The stable id of zflow tensor ``name`` (``model::param_id``): the
    first 8 bytes of the BLAKE3 hash of its init path, little-endian."""
    return int.from_bytes(blake3.blake3(init_path(name).encode()).digest()[:8], "little")


def bind(net: nn.Module, m: ModelConfig) -> list[tuple[Tensor, nn.Parameter]]:
    """zflow's tensors paired with the torch parameters that hold them; every torch
    parameter is used exactly once and every shape agrees."""
    params = dict(net.named_parameters())
    out = []
    for t in zflow_tensors(m):
        p = params.pop(torch_name(t.name, m.num_blocks))
        shape = list(reversed(t.shape)) if t.linear else t.shape
        if list(p.shape) != shape:
            raise ValueError(f"{t.name}: torch holds {list(p.shape)}, zflow expects {shape}")
        out.append((t, p))
    # The tied output head is the embedding; nothing else may be left over.
    params.pop("lm_head.weight", None)
    if params:
        raise ValueError(f"torch parameters zflow does not name: {sorted(params)}")
    return out


class Draws:
    """The initialisation stream: SplitMix64 over ``seed ^ 0x5a594131``, each
    normal from two uniforms by Box-Muller, vectorised (state k is ``seed + k * golden``)."""

    def __init__(self, seed: int) -> None:
        self.state = (seed ^ 0x5A594131) & MASK64

    def normals(self, n: int) -> np.ndarray:
        k = np.arange(1, 2 * n + 1, dtype=np.uint64)
        with np.errstate(over="ignore"):
            z = np.uint64(self.state) + k * GOLDEN
            z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
            z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
            z = z ^ (z >> np.uint64(31))
        self.state = (self.state + 2 * n * int(GOLDEN)) & MASK64
        u = ((z >> np.uint64(11)).astype(np.float64) + 0.5) / float(1 << 53)
        u1, u2 = u[0::2], u[1::2]
        return np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * math.pi * u2)

    def normal(self, shape: list[int], std: float) -> np.ndarray:
        n = int(np.prod(shape))
        return (self.normals(n) * std).astype(np.float32).reshape(shape)

    def conv_near_identity(self, c: int, per_group: int, k: int) -> np.ndarray:
        values = (self.normals(c * per_group * k) * 0.02).astype(np.float32)
        values = values.reshape(c, per_group, k)
        if per_group == 1:
            values[:, 0, k - 1] += np.float32(1.0)
        else:
            o = np.arange(c)
            values[o, o % per_group, k - 1] += np.float32(1.0)
        return values


def initialise(net: nn.Module, m: ModelConfig, seed: int) -> None:
    """The initial weights: normal draws in the tensor list's order, the
    rest constants (norms, scales, temperatures 1; biases 0)."""
    bound = {t.name: (t, p) for t, p in bind(net, m)}
    for t, p in bound.values():
        zero = t.name.endswith("bias") or t.name.endswith("_bias")
        p.fill_(0.0 if zero else 1.0)
    draws = Draws(seed)
    std, out_std = 0.02, 0.02 / math.sqrt(2 * m.num_blocks)

    def router_std(fan_in: int) -> float:
        return 1.0 / math.sqrt(3.0 * fan_in)

    def put(name: str, values: np.ndarray) -> None:
        t, p = bound[name]
        tensor = torch.from_numpy(values)
        p.copy_(tensor.T if t.linear else tensor)

    def normal(name: str, s: float) -> None:
        put(name, draws.normal(bound[name][0].shape, s))

    normal("embed_tokens", std)
    lq, lk = m.num_query_heads * m.head_dim, m.num_kv_heads * m.head_dim
    k = m.conv_kernel
    for i in range(m.num_blocks):
        q = f"blocks.{i}.self_attn.qkv"
        put(f"{q}.conv0_weight", draws.conv_near_identity(lq + lk, 1, k))
        put(f"{q}.conv1_weight", draws.conv_near_identity(lq + lk, m.head_dim, k))
        for proj in ["linear_q", "linear_k", "val_proj1", "val_proj2"]:
            normal(f"{q}.{proj}.weight", std)
        normal(f"blocks.{i}.self_attn.o_proj.weight", out_std)
        r = f"blocks.{i}.moe.router"
        for j in range(3):
            normal(f"{r}.router_mlp.{j}.weight", router_std(m.router_dim))
        normal(f"{r}.down_proj.weight", router_std(m.hidden_size))
        for e in range(m.num_experts):
            x = f"blocks.{i}.moe.local_experts.{e}"
            normal(f"{x}.linear_fc1.weight", std)
            normal(f"{x}.linear_fc2.weight", out_std)


def zflow_state(net: nn.Module, m: ModelConfig) -> dict[str, torch.Tensor]:
    """The weights under zflow's names and shapes (f32, contiguous, on the CPU), in zflow's
    order: what ``model.safetensors`` holds."""
    return {
        t.name: (p.detach().T if t.linear else p.detach()).float().cpu().contiguous()
        for t, p in bind(net, m)
    }


def load_zflow_state(net: nn.Module, m: ModelConfig, tensors: dict[str, torch.Tensor]) -> None:
    """Loads weights under zflow's names, naming the first tensor that is missing or has
    another shape."""
    with torch.no_grad():
        for t, p in bind(net, m):
            if t.name not in tensors:
                raise ValueError(f"tensor `{t.name}` is missing")
            value = tensors[t.name]
            if list(value.shape) != t.shape or value.dtype != torch.float32:
                raise ValueError(
                    f"tensor `{t.name}`: expected f32 {t.shape}, "
                    f"found {value.dtype} {list(value.shape)}"
                )
            p.copy_(value.T if t.linear else value)


def _dump(argv: list[str]) -> None:
    """``python -m zflow_torch.model MODEL_JSON``: the tensor list (name, shape, id, torch
    name) as JSON lines, what the Rust test compares with ``model::tensors``."""
    import json

    with open(argv[0]) as f:
        m = decode(ModelConfig, json.load(f))
    for t in zflow_tensors(m):
        print(
            json.dumps(
                {
                    "name": t.name,
                    "shape": t.shape,
                    "linear": t.linear,
                    "id": param_id(t.name),
                    "torch": torch_name(t.name, m.num_blocks),
                }
            )
        )


if __name__ == "__main__":
    _dump(sys.argv[1:])
