"""The train job as typed values: the Python side of ``runtime/src/contract/job.rs`` and the
types it holds. The Rust types are the one home of every field, its meaning and its default;
they emit ``job.schema.json`` beside this file, and ``tests/test_job.py`` checks that these
dataclasses have exactly its fields with its JSON types. The supervisor writes every field, so
nothing here has a default: a job missing one is refused, as is one with a field this worker
does not know.

``decode`` builds any of these types from parsed JSON, naming the path of a bad field.
"""

import dataclasses
import types
import typing
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

SkipOutput = Literal["zero", "input"]
DecayShape = Literal["linear", "cosine", "sqrt"]
ActivationCheckpointing = Literal["none", "full", "selective"]
Dtype = Literal["bf16", "f32"]


@dataclass(frozen=True)
class ModelConfig:
    """The ZAYA1 model a phase trains (``runtime/src/model/config.rs``)."""

    hidden_size: int
    num_blocks: int
    vocab_size: int
    num_query_heads: int
    num_kv_heads: int
    head_dim: int
    conv_kernel: int
    rope_fraction: float
    rope_base: float
    num_experts: int
    top_k: int
    expert_ffn: int
    mod_skip: bool
    skip_output: SkipOutput
    router_dim: int
    router_mlp_layers: int
    eda: bool
    residual_scaling: bool
    tie_embeddings: bool
    rms_norm_eps: float
    sliding_blocks: list[int]
    sliding_window: int
    sliding_rope_base: float


@dataclass(frozen=True)
class WsdSchedule:
    """``train.schedule`` (``runtime/src/contract/schedule.rs``)."""

    peak_lr: float
    warmup: float
    decay: float
    min_lr_ratio: float
    decay_shape: DecayShape


@dataclass(frozen=True)
class MuonSettings:
    """``train.muon`` (``runtime/src/contract/settings.rs``)."""

    momentum: float
    nesterov: bool
    ns_steps: int
    weight_decay: float
    ns_dtype: Dtype


@dataclass(frozen=True)
class AdamWSettings:
    """``train.adamw`` (``runtime/src/contract/settings.rs``)."""

    beta1: float
    beta2: float
    eps: float
    weight_decay: float


@dataclass(frozen=True)
class BalanceConfig:
    """``train.balance`` (``runtime/src/contract/balance.rs``)."""

    kp: float
    ki: float
    kd: float
    lr: float
    beta1: float
    beta2: float
    skip_share: float | None
    enabled: bool


@dataclass(frozen=True)
class SpikeGuard:
    """``train.spike`` (``runtime/src/contract/spike.rs``)."""

    enabled: bool
    window: int
    z: float
    min_jump: float
    min_history: int
    max_rollbacks: int


@dataclass(frozen=True)
class TrainSettings:
    """``train`` (``runtime/src/contract/settings.rs``)."""

    global_batch: int
    micro_batch: int
    schedule: WsdSchedule
    muon: MuonSettings
    adamw: AdamWSettings
    grad_reduce_dtype: Dtype
    grad_bucket_bytes: int
    grad_clip: float
    balance: BalanceConfig
    rope_base: float | None
    carry_optimizer: bool
    checkpoint_every: int
    keep_checkpoints: int
    eval_every: int
    eval_tokens: int
    seed: int
    engine: str
    backend: str
    async_checkpoints: bool
    spike: SpikeGuard
    loss_chunk_tokens: int


@dataclass(frozen=True)
class SourcePaths:
    """One token source (``runtime/src/contract/job.rs``)."""

    name: str
    tokens: list[str]
    heldout: list[str]


@dataclass(frozen=True)
class TrainJob:
    """Everything a worker needs to train one phase (``runtime/src/contract/job.rs``)."""

    version: int
    phase: str
    model: ModelConfig
    train: TrainSettings
    mixture: str
    sources: list[SourcePaths]
    checkpoints: str
    init: str | None
    activation_checkpointing: ActivationCheckpointing
    context_parallel: int


class DecodeError(ValueError):
    """JSON that is not the type asked for, named by the path of the bad field."""


T = TypeVar("T")


def decode(cls: type[T], value: object, where: str = "") -> T:
    """``value`` (parsed JSON) as a ``cls``, refusing missing, unknown and mistyped fields."""
    return typing.cast(T, _decode(cls, value, where or cls.__name__))


def encode(value: object) -> dict[str, Any]:
    """A job value (a dataclass instance) as a JSON object, in field order as the Rust side
    writes it."""
    if not dataclasses.is_dataclass(value) or isinstance(value, type):
        raise TypeError(f"not a job value: {value!r:.40}")
    return dataclasses.asdict(value)


def _decode(hint: object, value: object, where: str) -> object:
    origin = typing.get_origin(hint)
    if dataclasses.is_dataclass(hint):
        if not isinstance(value, dict):
            raise DecodeError(f"{where}: expected an object, found {_kind(value)}")
        cls = typing.cast(type[Any], hint)
        hints = typing.get_type_hints(cls)
        names = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(value) - set(names))
        if unknown:
            raise DecodeError(f"{where}: unknown field `{unknown[0]}` (expected one of {names})")
        missing = [n for n in names if n not in value]
        if missing:
            raise DecodeError(f"{where}: missing field `{missing[0]}`")
        return cls(**{n: _decode(hints[n], value[n], f"{where}.{n}") for n in names})
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(hint)
        if value is None and type(None) in args:
            return None
        (inner,) = [a for a in args if a is not type(None)]
        return _decode(inner, value, where)
    if origin is Literal:
        allowed = typing.get_args(hint)
        if value not in allowed:
            raise DecodeError(f"{where}: expected one of {list(allowed)}, found {value!r}")
        return value
    if origin is list:
        if not isinstance(value, list):
            raise DecodeError(f"{where}: expected an array, found {_kind(value)}")
        (item,) = typing.get_args(hint)
        return [_decode(item, v, f"{where}[{i}]") for i, v in enumerate(value)]
    if hint is bool:
        if not isinstance(value, bool):
            raise DecodeError(f"{where}: expected true or false, found {_kind(value)}")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise DecodeError(f"{where}: expected an integer, found {_kind(value)}")
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise DecodeError(f"{where}: expected a number, found {_kind(value)}")
        return float(value)
    if hint is str:
        if not isinstance(value, str):
            raise DecodeError(f"{where}: expected a string, found {_kind(value)}")
        return value
    raise TypeError(f"{where}: no decoder for {hint!r}")


def _kind(value: object) -> str:
    return "null" if value is None else f"{type(value).__name__} {value!r:.40}"
