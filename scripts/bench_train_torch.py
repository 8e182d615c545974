#!/usr/bin/env python3
"""The same tiny ZAYA1 training step in PyTorch, for `zflow bench train` to compare against.

Written for zflow from ZAYA1's description (the ZAYA1 report, arXiv 2511.17127), mirroring runtime/src/model/:
CCA attention (latent q/k, time-shifted value head, depthwise + grouped causal convs, QK-mean
skip, L2-normalised q/k, key temperature, partial RoPE, GQA), the EDA router with a GELU MLP and
top-1 choice with balancing biases, sorted dispatch to SwiGLU experts, the MoD skip route,
residual scaling and a tied head. Optimizer: torch.optim.Muon (AdamW-matched learning rate) for
2-D matrices when this torch has it, AdamW for the rest.

Usage: bench_train_torch.py CONFIG_JSON  -> prints one JSON line {"tokens_per_s": ..., ...}
"""

import json
import math
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class ResidualScaling(nn.Module):
    def __init__(self, dim, with_residual):
        super().__init__()
        self.hidden_states_scale = nn.Parameter(torch.ones(dim))
        self.hidden_states_bias = nn.Parameter(torch.zeros(dim))
        self.with_residual = with_residual
        if with_residual:
            self.residual_scale = nn.Parameter(torch.ones(dim))
            self.residual_bias = nn.Parameter(torch.zeros(dim))

    def forward(self, residual, hidden):
        hidden = (hidden + self.hidden_states_bias) * self.hidden_states_scale
        if residual is not None and self.with_residual:
            residual = (residual + self.residual_bias) * self.residual_scale
        return residual, hidden


class Attention(nn.Module):
    def __init__(self, c):
        super().__init__()
        h, nq, nkv, hd = c["hidden_size"], c["num_query_heads"], c["num_kv_heads"], c["head_dim"]
        self.nq, self.nkv, self.hd = nq, nkv, hd
        lq, lk = nq * hd, nkv * hd
        self.linear_q = nn.Linear(h, lq, bias=False)
        self.linear_k = nn.Linear(h, lk, bias=False)
        self.val_proj1 = nn.Linear(h, lk // 2, bias=False)
        self.val_proj2 = nn.Linear(h, lk - lk // 2, bias=False)
        ch = lq + lk
        self.conv0 = nn.Conv1d(ch, ch, 2, groups=ch)
        self.conv1 = nn.Conv1d(ch, ch, 2, groups=nq + nkv)
        self.temp = nn.Parameter(torch.ones(nkv))
        self.o_proj = nn.Linear(lq, h, bias=False)
        self.rope_dim = int(hd * c.get("rope_fraction", 0.5)) & ~1
        self.rope_base = c.get("rope_base", 10000.0)

    def rope(self, x):
        s, d = x.shape[2], self.rope_dim
        if d == 0:
            return x
        inv = self.rope_base ** (-torch.arange(0, d, 2, dtype=torch.float32) / d)
        ang = torch.arange(s, dtype=torch.float32)[:, None] * inv[None, :]
        cos, sin = torch.cat([ang.cos(), ang.cos()], -1), torch.cat([ang.sin(), ang.sin()], -1)
        rot, rest = x[..., :d], x[..., d:]
        x1, x2 = rot[..., : d // 2], rot[..., d // 2 :]
        rot = rot * cos + torch.cat([-x2, x1], -1) * sin
        return torch.cat([rot, rest], -1)

    def forward(self, x):
        b, s, _ = x.shape
        nq, nkv, hd, g = self.nq, self.nkv, self.hd, self.nq // self.nkv
        q, k = self.linear_q(x), self.linear_k(x)
        mean_q = (q.view(b, s, nq, hd) + k.view(b, s, nkv, 1, hd).expand(b, s, nkv, g, hd).reshape(b, s, nq, hd)) / 2
        mean_k = mean_q.view(b, s, nkv, g, hd).mean(3)
        qk = F.pad(torch.cat([q, k], -1).transpose(1, 2), (2, 0))
        qk = self.conv1(self.conv0(qk)).transpose(1, 2)
        query = qk[..., : nq * hd].reshape(b, s, nq, hd) + mean_q
        key = qk[..., nq * hd :].reshape(b, s, nkv, hd) + mean_k
        prev = F.pad(x[:, :-1], (0, 0, 1, 0))
        value = torch.cat([self.val_proj1(x), self.val_proj2(prev)], -1).view(b, s, nkv, hd)
        query = F.normalize(query, dim=-1) * math.sqrt(hd)
        key = F.normalize(key, dim=-1) * math.sqrt(hd) * self.temp.view(1, 1, nkv, 1)
        query, key, value = (self.rope(query.transpose(1, 2)), self.rope(key.transpose(1, 2)), value.transpose(1, 2))
        out = F.scaled_dot_product_attention(query, key, value, is_causal=True, enable_gqa=True)
        return self.o_proj(out.transpose(1, 2).reshape(b, s, nq * hd))


class Expert(nn.Module):
    def __init__(self, h, f):
        super().__init__()
        self.linear_fc1 = nn.Linear(h, 2 * f, bias=False)
        self.linear_fc2 = nn.Linear(f, h, bias=False)

    def forward(self, x):
        gate, up = self.linear_fc1(x).chunk(2, -1)
        return self.linear_fc2(F.silu(gate) * up)


class Moe(nn.Module):
    def __init__(self, c, eda):
        super().__init__()
        h, d, e = c["hidden_size"], c["router_dim"], c["num_experts"]
        self.routes = e + (1 if c.get("mod_skip", True) else 0)
        self.num_experts = e
        self.down_proj = nn.Linear(h, d)
        self.router_states_scale = nn.Parameter(torch.ones(d)) if eda else None
        self.rmsnorm_eda = RMSNorm(d, c.get("rms_norm_eps", 1e-5))
        self.router_mlp = nn.Sequential(nn.Linear(d, d), nn.GELU(), nn.Linear(d, d), nn.GELU(), nn.Linear(d, self.routes, bias=False))
        self.local_experts = nn.ModuleList(Expert(h, c["expert_ffn"]) for _ in range(e))
        biases = torch.zeros(self.routes)
        if self.routes > e:
            biases[-1] = -1.0
        self.register_buffer("balancing_biases", biases)

    def forward(self, x, prev):
        b, s, h = x.shape
        x = x.reshape(b * s, h)
        r = self.down_proj(x)
        if self.router_states_scale is not None and prev is not None:
            r = r + prev * self.router_states_scale
        probs = torch.softmax(self.router_mlp(self.rmsnorm_eda(r)), -1)
        choice = (probs.detach() + self.balancing_biases).argmax(-1)
        order = torch.sort(choice, stable=True).indices
        counts = torch.bincount(choice, minlength=self.routes).tolist()
        rows = x[order].split(counts)
        outs = [self.local_experts[i](t) if i < self.num_experts else t for i, t in enumerate(rows)]
        out = torch.empty_like(x)
        out[order] = torch.cat(outs)
        out = out * probs.gather(1, choice[:, None])
        return out.view(b, s, h), r


class Zaya(nn.Module):
    def __init__(self, c):
        super().__init__()
        h, n = c["hidden_size"], c["num_blocks"]
        eps = c.get("rms_norm_eps", 1e-5)
        self.embed_tokens = nn.Parameter(torch.randn(c["vocab_size"], h) * 0.02)
        self.attn_scale = nn.ModuleList(ResidualScaling(h, i > 0) for i in range(n))
        self.attn_norm = nn.ModuleList(RMSNorm(h, eps) for _ in range(n))
        self.attn = nn.ModuleList(Attention(c) for _ in range(n))
        self.moe_scale = nn.ModuleList(ResidualScaling(h, True) for _ in range(n))
        self.moe_norm = nn.ModuleList(RMSNorm(h, eps) for _ in range(n))
        self.moe = nn.ModuleList(Moe(c, i > 0) for i in range(n))
        self.res_scale = ResidualScaling(h, True)
        self.final_norm = RMSNorm(h, eps)

    def forward(self, tokens, targets):
        hidden, residual, state = F.embedding(tokens, self.embed_tokens), None, None
        for i in range(len(self.attn)):
            residual, hidden = self.attn_scale[i](residual, hidden)
            x = hidden if residual is None else residual + hidden
            hidden, residual = self.attn[i](self.attn_norm[i](x)), x
            residual, hidden = self.moe_scale[i](residual, hidden)
            x = residual + hidden
            hidden, state = self.moe[i](self.moe_norm[i](x), state)
            residual = x
        residual, hidden = self.res_scale(residual, hidden)
        logits = self.final_norm(residual + hidden) @ self.embed_tokens.t()
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.reshape(-1))


def main():
    cfg = json.loads(open(sys.argv[1]).read())
    torch.manual_seed(0)
    torch.set_num_threads(cfg.get("threads", torch.get_num_threads()))
    model = Zaya(cfg["model"])
    matrices = [p for n, p in model.named_parameters() if p.ndim == 2 and n != "embed_tokens"]
    others = [p for n, p in model.named_parameters() if not (p.ndim == 2 and n != "embed_tokens")]
    lr = 3e-3
    if hasattr(torch.optim, "Muon"):
        opts = [torch.optim.Muon(matrices, lr=lr, adjust_lr_fn="match_rms_adamw"), torch.optim.AdamW(others, lr=lr)]
        optimizer = "muon+adamw"
    else:
        opts = [torch.optim.AdamW(matrices + others, lr=lr)]
        optimizer = "adamw"
    b, s, v = cfg["batch"], cfg["seq_len"], cfg["model"]["vocab_size"]
    gen = torch.Generator().manual_seed(1)
    data = torch.randint(0, v, (b, s + 1), generator=gen)

    def step():
        loss = model(data[:, :-1], data[:, 1:])
        loss.backward()
        for o in opts:
            o.step()
            o.zero_grad(set_to_none=True)
        return loss.item()

    for _ in range(cfg.get("warmup", 1)):
        step()
    times = []
    for _ in range(cfg["steps"]):
        t = time.perf_counter()
        loss = step()
        times.append(time.perf_counter() - t)
    best = min(times)
    print(json.dumps({"tokens_per_s": b * s / best, "step_s": best, "loss": loss, "optimizer": optimizer,
                      "threads": torch.get_num_threads(), "torch": torch.__version__}))


if __name__ == "__main__":
    main()
