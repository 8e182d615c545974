"""A tiny ZAYA1 for the unit tests (ZAYA1's own shape settings, small sizes), with zflow's
initial weights and balancing biases that send tokens to every route, the skip one included."""

import torch

from zflow_torch import model
from zflow_torch.job import ModelConfig


def config(**overrides: object) -> ModelConfig:
    values: dict[str, object] = {
        "hidden_size": 64,
        "num_blocks": 2,
        "vocab_size": 512,
        "num_query_heads": 2,
        "num_kv_heads": 1,
        "head_dim": 32,
        "conv_kernel": 2,
        "rope_fraction": 0.5,
        "rope_base": 10000.0,
        "num_experts": 4,
        "top_k": 1,
        "expert_ffn": 64,
        "mod_skip": True,
        "skip_output": "zero",
        "router_dim": 32,
        "router_mlp_layers": 3,
        "eda": True,
        "residual_scaling": True,
        "tie_embeddings": True,
        "rms_norm_eps": 1e-5,
        "sliding_blocks": [],
        "sliding_window": 4096,
        "sliding_rope_base": 10000.0,
    }
    values.update(overrides)
    return ModelConfig(**values)  # type: ignore[arg-type]


def build(m: ModelConfig, seed: int = 7) -> torch.nn.Module:
    net: torch.nn.Module = model.build(m, seed)
    model.set_biases(net, [[0.0] * m.num_experts + [-0.5]] * m.num_blocks)
    return net


def tokens(m: ModelConfig, batch: int, seq: int, seed: int = 0) -> torch.Tensor:
    """``[batch, seq + 1]`` random token ids."""
    return torch.randint(
        0, m.vocab_size, (batch, seq + 1), generator=torch.Generator().manual_seed(seed)
    )
