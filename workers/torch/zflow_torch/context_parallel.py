"""Context parallelism: one sequence split over the ranks of a process group.

Rank r of a group of C holds positions ``[r * L, (r + 1) * L)`` of every row (``L = seq / C``:
contiguous chunks, ``ContextParallel.chunk``). Everything in ZAYA1 works token by token except
three things that look back across a chunk's start; ``enable`` makes each exact:

- Attention: a query attends to every earlier key of the whole sequence. Each layer all-gathers
  its keys and values over the group (the backward pass reduce-scatters their gradients to
  their owners) and runs transformers' SDPA on the local queries with a mask in global
  positions: causal, and the window (``config.sliding_window``) on the sliding layers. It runs
  as transformers' attention implementation ``zflow_cp``; ``masking_utils`` builds no masks for
  an implementation it has no mask function for, so the model's own are skipped.
- CCA's convolutions: q and k go through two causal conv1d's that together look back
  ``conv_kernel_size`` tokens, zero-padded at the sequence's start.
- The delayed value: half of each value head is the previous token's ``v_proj_delayed``.

For the last two each rank sends the last ``max(conv_kernel_size, 1)`` rows of its
projection's input to the next rank (differentiably: the backward pass sends their gradient
back), which projects them itself and hands them to transformers' own projection as the
cache it reads when it continues a sequence: the conv state and the previous token's delayed
value. Rank 0 has no previous rank and keeps the zero padding, as a single rank does. The
halo rows' projections run on both ranks; their gradients add up to one rank's.

RoPE needs global positions: ``enable`` gives the decoder ``ContextParallel.positions`` when
its caller passes none, so ``CausalLmLoss`` runs unchanged on a rank's chunk. Padding masks
and the KV cache (inference) are refused. ``whole_sequences`` turns all of it off for a
block, for a rank that runs whole sequences alone (the held-out evaluation on rank 0).

Exact means the same arithmetic in another order: the loss and the gradients summed over the
group match one rank's to f32 rounding, and to f64 rounding in f64
(``workers/torch/tests/test_context_parallel.py``, 2 and 4 gloo ranks).

How a trainer uses it:

1. The CP group is a process group of its own (``dist.new_group``), even where it spans the
   world: its collectives run inside the forward and backward passes, which must not
   interleave with DistributedDataParallel's on the default group.
2. Every rank of a CP group reads the same micro-batches (the data's ranks are the DP ranks,
   ``world / C`` of them), builds ``inputs = rows[:, :-1]`` and ``targets = rows[:, 1:]`` for
   the whole sequence and keeps ``cp.chunk(inputs)`` and ``cp.chunk(targets)``.
3. ``CausalLmLoss`` on the chunks is the summed loss of the rank's ``B * L`` tokens. Divided by
   the local token count, as the trainer does, the mean of the ranks' losses over the world
   is the mean over all tokens, and DistributedDataParallel's gradient mean over the world
   (DP x CP ranks) is the mean over the DP ranks of the whole sequences' mean-loss gradients:
   one rank's result, as every chunk has the same number of tokens. (Summed over the CP
   group instead, the chunks' summed losses and their gradients are the whole sequence's.)
4. The route counts (``model.route_counts``) are each rank's chunk's: their sum over the
   world, as the trainer takes it, counts every token once.
"""

import contextlib
import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import torch
import torch.distributed as dist
from torch import nn
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.models.zaya.modeling_zaya import ZayaCCAProjection

# transformers' name for the attention implementation that ``enable`` sets.
ATTENTION = "zflow_cp"
# The attribute of each ``ZayaAttention`` that holds its ``ContextParallel``.
_ATTR = "zflow_context_parallel"
# The attribute of the model that holds the attention implementation ``enable`` replaced.
_WHOLE = "zflow_whole_sequence_attention"


@dataclass(frozen=True)
class ContextParallel:
    """This rank's place in its context-parallel group: ``rank`` of ``size`` ranks of ``group``
    (``None``: the default group)."""

    group: dist.ProcessGroup | None
    rank: int
    size: int

    @classmethod
    def over(cls, group: dist.ProcessGroup | int | None) -> "ContextParallel":
        """This rank's place in ``group``, as ``dist.new_group`` returns it (torch.distributed
        initialised; ``None``: the default group)."""
        if not (group is None or isinstance(group, dist.ProcessGroup)):
            # new_group's answer to a rank outside the group (GroupMember.NON_GROUP_MEMBER).
            raise ValueError("this rank is not a member of its context-parallel group")
        return cls(group, dist.get_rank(group), dist.get_world_size(group))

    @classmethod
    def single(cls) -> "ContextParallel":
        """No context parallelism: the whole sequence on this rank."""
        return cls(None, 0, 1)

    def chunk(self, tensor: torch.Tensor, dim: int = 1) -> torch.Tensor:
        """This rank's contiguous slice of ``tensor`` along ``dim`` (a view)."""
        whole = tensor.shape[dim]
        if whole % self.size:
            raise ValueError(f"a sequence of {whole} does not split into {self.size} equal chunks")
        local = whole // self.size
        return tensor.narrow(dim, self.rank * local, local)

    def positions(self, local: int, device: torch.device) -> torch.Tensor:
        """The global positions of this rank's ``local`` tokens, ``[1, local]``."""
        return (self.rank * local + torch.arange(local, device=device))[None]


def _gather(tensor: torch.Tensor, cp: ContextParallel) -> torch.Tensor:
    """The group's tensors concatenated along dim 0, in rank order."""
    tensor = tensor.contiguous()
    out = tensor.new_empty((cp.size * tensor.shape[0], *tensor.shape[1:]))
    dist.all_gather_into_tensor(out, tensor, group=cp.group)
    return out


def _scatter_sum(tensor: torch.Tensor, cp: ContextParallel) -> torch.Tensor:
    """Slice r of ``tensor`` along dim 0 summed over the group, on rank r: ``_gather``'s
    adjoint."""
    tensor = tensor.contiguous()
    out = tensor.new_empty((tensor.shape[0] // cp.size, *tensor.shape[1:]))
    dist.reduce_scatter_tensor(out, tensor, group=cp.group)
    return out


class _Saved(Protocol):
    """What the autograd functions below keep on their context for the backward pass."""

    cp: ContextParallel
    width: int


class _AllGather(torch.autograd.Function):
    """``_gather`` with its gradient: each rank gets the sum of the group's gradients for
    its slice."""

    @staticmethod
    def forward(ctx: _Saved, tensor: torch.Tensor, cp: ContextParallel) -> torch.Tensor:
        ctx.cp = cp
        return _gather(tensor, cp)

    @staticmethod
    def backward(ctx: _Saved, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return _scatter_sum(grad, ctx.cp), None


class _ExchangeHalo(torch.autograd.Function):
    """``(hidden, halo)``: ``hidden`` ([batch, local, hidden]) as it is, and the previous
    rank's last ``width`` rows of it (zeros on rank 0). ``hidden`` comes back too so that
    every rank's backward pass reaches this node, and runs its collective, whether or not it
    uses its halo: the gradient of a rank's halo goes back to the previous rank's rows."""

    @staticmethod
    def forward(
        ctx: _Saved, hidden: torch.Tensor, width: int, cp: ContextParallel
    ) -> tuple[torch.Tensor, torch.Tensor]:
        ctx.width, ctx.cp = width, cp
        tails = _gather(hidden[:, hidden.shape[1] - width :], cp)
        tails = tails.view(cp.size, hidden.shape[0], width, hidden.shape[2])
        halo = tails[cp.rank - 1] if cp.rank > 0 else torch.zeros_like(tails[0])
        return hidden, halo

    @staticmethod
    def backward(
        ctx: _Saved, grad_hidden: torch.Tensor, grad_halo: torch.Tensor
    ) -> tuple[torch.Tensor, None, None]:
        cp = ctx.cp
        # Each rank addresses its halo's gradient to the previous rank's slot.
        slots = grad_halo.new_zeros((cp.size, *grad_halo.shape))
        if cp.rank > 0:
            slots[cp.rank - 1] = grad_halo
        from_next = _scatter_sum(slots.flatten(0, 1), cp)
        grad = grad_hidden.clone()
        grad[:, grad.shape[1] - ctx.width :] += from_next
        return grad, None, None


class _Halo:
    """What transformers' ``ZayaCCAProjection`` reads from a cache when it continues a
    sequence, here the previous rank's tail: the conv state (the last ``conv_kernel_size``
    q/k projections before the convolutions, ``[batch, channels, kernel]``) and the previous
    token's delayed value (``[batch, channels]``). Its writes are dropped."""

    def __init__(self, conv_state: torch.Tensor, recurrent_state: torch.Tensor) -> None:
        self.conv_state = conv_state
        self.recurrent_state = recurrent_state

    def get_conv_state(self, layer_idx: int, state_idx: int = 0) -> torch.Tensor:
        return self.conv_state

    def get_recurrent_state(self, layer_idx: int, state_idx: int = 0) -> torch.Tensor:
        return self.recurrent_state

    def update_conv_state(self, *_args: object, **_kwargs: object) -> None:
        pass

    def update_recurrent_state(self, *_args: object, **_kwargs: object) -> None:
        pass


class _ContextParallelCca:
    """The forward of one layer's ``ZayaCCAProjection`` (``proj``) under context parallelism:
    transformers' own, continuing from the previous rank's tail."""

    def __init__(self, proj: nn.Module, config: object, cp: ContextParallel) -> None:
        self.proj = proj
        # transformers' config, whose attention implementation says whether CP is on.
        self.config: Any = config
        self.cp = cp

    def __call__(
        self,
        hidden_states: torch.Tensor,
        past_key_values: object | None = None,
        conv_mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        proj: Any = self.proj
        if self.config._attn_implementation == ATTENTION:
            if past_key_values is not None or conv_mask is not None:
                raise ValueError("context parallelism trains without a KV cache or padding mask")
            hidden_states, past_key_values = self._halo(hidden_states)
        # else `whole_sequences`: transformers' projection as it is.
        out: tuple[torch.Tensor, torch.Tensor, torch.Tensor] = ZayaCCAProjection.forward(
            proj, hidden_states, past_key_values, conv_mask
        )
        return out

    def _halo(self, hidden_states: torch.Tensor) -> tuple[torch.Tensor, _Halo]:
        """``hidden_states`` through the exchange, and the previous rank's tail."""
        proj: Any = self.proj
        cp = self.cp
        kernel = proj.conv_kernel_size
        # The delayed value needs one row even where the convolutions need none.
        width = max(kernel, 1)
        if hidden_states.shape[1] < width:
            raise ValueError(
                f"a chunk of {hidden_states.shape[1]} tokens is shorter than the "
                f"{width}-token halo CCA needs from the previous rank"
            )
        hidden_states, rows = _ExchangeHalo.apply(hidden_states, width, cp)
        qk = rows[:, width - kernel :]
        if cp.rank > 0:
            conv_state = torch.cat([proj.q_proj(qk), proj.k_proj(qk)], dim=-1).transpose(1, 2)
        else:
            # The sequence's start: the zero padding of a single rank (not the projections of
            # zero rows, which would carry the biases).
            channels = proj.conv_qk_depthwise.in_channels
            conv_state = hidden_states.new_zeros(hidden_states.shape[0], channels, kernel)
        # On rank 0 the rows are zeros: v_proj_delayed(0), a single rank's first value.
        delayed = proj.v_proj_delayed(rows[:, -1])
        return hidden_states, _Halo(conv_state, delayed)


def _attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    sliding_window: int | None = None,
    **kwargs: object,
) -> tuple[torch.Tensor, None]:
    """transformers' attention interface: the local queries ``[batch, heads, local, dim]``
    against the group's keys and values (``[batch, kv heads, local, dim]`` each here), causal
    in global positions, through transformers' SDPA. Returns ``[batch, local, heads, dim]``."""
    if attention_mask is not None:
        raise ValueError("context parallelism trains without an attention mask")
    cp: ContextParallel = getattr(module, _ATTR)
    local, dim = query.shape[2], key.shape[-1]
    first = cp.rank * local
    end = first + local
    # One collective for both: the sequence leads, so the ranks' chunks concatenate in order.
    kv = torch.cat([key, value], dim=-1).movedim(2, 0)
    kv = _AllGather.apply(kv, cp).movedim(0, 2)
    # Keys past the chunk's end, or before the window of its first query, are all masked.
    start = 0 if sliding_window is None else max(0, first - sliding_window + 1)
    key, value = kv[:, :, start:end].split([dim, kv.shape[-1] - dim], dim=-1)
    # The mask in global positions. A materialised mask keeps SDPA off the flash kernels (on
    # GPUs it takes the memory-efficient one): torch's lower-right `CausalBias` would not, but
    # it is a tensor subclass that selective activation checkpointing cannot make (torch 2.15).
    mask = _mask(first, start, end, sliding_window, query.dtype, query.device)
    out: tuple[torch.Tensor, None] = sdpa_attention_forward(
        module, query, key, value, mask, **kwargs
    )
    return out


@functools.lru_cache(maxsize=4)
def _mask(
    first: int, start: int, end: int, window: int | None, dtype: torch.dtype, device: torch.device
) -> torch.Tensor:
    """The additive mask (0 where allowed, -inf elsewhere; ``[1, 1, queries, keys]``) of
    queries ``[first, end)`` over keys ``[start, end)``: causal and, with ``window``, within it.
    Made once and shared by every layer: as SDPA's input each layer's backward pass keeps it,
    and at 32K one is 16K x 32K (``runtime/src/size/memory.rs`` counts it once)."""
    q_pos = torch.arange(first, end, device=device)[:, None]
    k_pos = torch.arange(start, end, device=device)[None]
    allowed = k_pos <= q_pos
    if window is not None:
        # transformers' sliding window: query i sees key j when i - window < j <= i.
        allowed &= k_pos > q_pos - window
    mask = torch.zeros(allowed.shape, dtype=dtype, device=device)
    return mask.masked_fill_(~allowed, float("-inf"))[None, None]


AttentionInterface.register(ATTENTION, _attention)


# A forward pre-hook with keyword arguments: (module, args, kwargs) -> (args, kwargs).
_PreHook = Callable[
    [nn.Module, tuple[Any, ...], dict[str, Any]], tuple[tuple[Any, ...], dict[str, Any]]
]


def _global_positions(model_config: object, cp: ContextParallel) -> _PreHook:
    """A forward pre-hook for the decoder that gives it this rank's global positions when
    its caller passes none."""
    config: Any = model_config

    def hook(
        _module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        if config._attn_implementation != ATTENTION:
            return args, kwargs
        # ZayaModel.forward(input_ids, attention_mask, position_ids, ...).
        if len(args) > 2 or kwargs.get("position_ids") is not None:
            return args, kwargs
        ids = args[0] if args else kwargs.get("input_ids")
        tokens = ids if ids is not None else kwargs["inputs_embeds"]
        kwargs["position_ids"] = cp.positions(tokens.shape[1], tokens.device)
        return args, kwargs

    return hook


def enable(net: nn.Module, cp: ContextParallel) -> None:
    """Runs ``net`` (a ``ZayaForCausalLM`` from ``model.build``) on this rank's chunk of each
    sequence, in ``cp``'s group. With one rank it leaves ``net`` as it is."""
    if cp.size == 1:
        return
    causal_lm: Any = net
    if hasattr(causal_lm, _WHOLE):
        raise ValueError("context parallelism is enabled already")
    config = causal_lm.config
    decoder = causal_lm.model
    for layer in decoder.layers:
        attention = layer.self_attn
        setattr(attention, _ATTR, cp)
        attention.qkv_proj.forward = _ContextParallelCca(attention.qkv_proj, config, cp)
    decoder.register_forward_pre_hook(_global_positions(config, cp), with_kwargs=True)
    # The one switch: the projections and the hook act while the attention is ours.
    setattr(causal_lm, _WHOLE, config._attn_implementation)
    config._attn_implementation = ATTENTION


@contextlib.contextmanager
def whole_sequences(net: nn.Module) -> Iterator[None]:
    """Runs ``net`` inside the block as if ``enable`` had not been called: whole sequences on
    this rank alone, with no collectives (rank 0's held-out evaluation). Does nothing where
    context parallelism is off."""
    causal_lm: Any = net
    config = causal_lm.config
    whole = getattr(causal_lm, _WHOLE, None)
    if whole is None or config._attn_implementation != ATTENTION:
        yield
        return
    config._attn_implementation = whole
    try:
        yield
    finally:
        config._attn_implementation = ATTENTION
