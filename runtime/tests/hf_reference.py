#!/usr/bin/env python3
"""A ZAYA1 forward pass over an exported Hugging Face folder, standard library only.

Written for zflow from the reference implementation's code (Zyphra's transformers fork, branch
`zaya`, src/transformers/models/zaya/modeling_zaya.py: CCA, ZayaAttention (eager),
ResidualScaling, ZayaRouter, ZayaBlock, ZayaDecoderATTLayer/MLPLayer, ZayaModel.forward), not from
zflow's model.rs: it reads the tensors by the reference's names with the reference's layouts
(nn.Linear [out, in], nn.Conv1d [out, in/groups, kernel], the `balancing_biases` buffer) and
the config by ZayaConfig's field names. `runtime/tests/hf_reference.rs` compares its logits with
zflow's own forward pass on the checkpoint the folder was exported from.

Usage: hf_reference.py HF_DIR TOKENS_JSON  -> prints {"logits": [[...], ...], "choices": [[...], ...]}
Batch of one; float64 arithmetic (zflow computes in f32, so the comparison has a tolerance).
"""

import json
import math
import struct
import sys


def load(folder):
    with open(f"{folder}/config.json") as f:
        cfg = json.load(f)
    with open(f"{folder}/model.safetensors", "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    base = 8 + n
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        assert info["dtype"] == "F32", (name, info["dtype"])
        start, end = info["data_offsets"]
        flat = list(struct.unpack(f"<{(end - start) // 4}f", raw[base + start : base + end]))
        tensors[name] = reshape(flat, info["shape"])
    return cfg, tensors


def reshape(flat, shape):
    if len(shape) <= 1:
        return flat
    step = len(flat) // shape[0]
    return [reshape(flat[i * step : (i + 1) * step], shape[1:]) for i in range(shape[0])]


def linear(xs, w, b=None):
    """nn.Linear on each vector of xs: y = W x (+ b), W stored [out, in]."""
    out = []
    for x in xs:
        y = [sum(wi * xi for wi, xi in zip(row, x)) for row in w]
        if b is not None:
            y = [v + bv for v, bv in zip(y, b)]
        out.append(y)
    return out


def rmsnorm(xs, w, eps):
    out = []
    for x in xs:
        r = 1.0 / math.sqrt(sum(v * v for v in x) / len(x) + eps)
        out.append([wv * v * r for wv, v in zip(w, x)])
    return out


def add(a, b):
    return [[x + y for x, y in zip(u, v)] for u, v in zip(a, b)]


def gelu(x):
    return 0.5 * x * (1.0 + math.erf(x / math.sqrt(2.0)))


def silu(x):
    return x / (1.0 + math.exp(-x))


def softmax(v):
    m = max(v)
    e = [math.exp(x - m) for x in v]
    s = sum(e)
    return [x / s for x in e]


def res_scale(t, p, residual, hidden, not_first_layer):
    """ResidualScaling.forward: (x + bias) * scale on the output, and on the residual after
    layer 0."""
    gate = lambda xs, b, a: [[(v + bv) * av for v, bv, av in zip(x, b, a)] for x in xs]
    hidden = gate(hidden, t[p + "hidden_states_bias"], t[p + "hidden_states_scale"])
    if not_first_layer and residual is not None:
        residual = gate(residual, t[p + "residual_bias"], t[p + "residual_scale"])
    return residual, hidden


def cca(t, p, x, cfg):
    """CCA.forward without a cache: queries [S][nq][hd], keys and values [S][nkv][hd]."""
    nq, nkv, hd = cfg["num_attention_heads"], cfg["num_query_groups"], cfg["head_dim"]
    g, lq, lk = nq // nkv, nq * hd, nkv * hd
    chans, seq = lq + lk, len(x)
    q = linear(x, t[p + "linear_q.weight"])
    k = linear(x, t[p + "linear_k.weight"])
    packed = [a + b for a, b in zip(q, k)]
    # qk_mean_q: per query head, (q + its group's k) / 2; qk_mean_k: the mean over the group.
    mean_q = [[[(q[s][h * hd + d] + k[s][(h // g) * hd + d]) / 2 for d in range(hd)] for h in range(nq)] for s in range(seq)]
    mean_k = [[[sum(mean_q[s][j * g + r][d] for r in range(g)) / g for d in range(hd)] for j in range(nkv)] for s in range(seq)]
    # conv_qk over [C, S], left-padded by (time0 - 1) + (time1 - 1): depthwise, then grouped.
    w0, b0 = t[p + "conv_qk.0.weight"], t[p + "conv_qk.0.bias"]
    w1, b1 = t[p + "conv_qk.1.weight"], t[p + "conv_qk.1.bias"]
    k0, k1 = len(w0[0][0]), len(w1[0][0])
    pad = (cfg["cca_time0"] - 1) + (cfg["cca_time1"] - 1)
    xp = [[0.0] * pad + [packed[s][c] for s in range(seq)] for c in range(chans)]
    z = [[b0[c] + sum(w0[c][0][i] * xp[c][j + i] for i in range(k0)) for j in range(len(xp[c]) - k0 + 1)] for c in range(chans)]
    groups = nq + nkv
    cg = chans // groups
    y = []
    for c in range(chans):
        first = (c // cg) * cg
        y.append([b1[c] + sum(w1[c][i][tau] * z[first + i][j + tau] for i in range(cg) for tau in range(k1)) for j in range(len(z[c]) - k1 + 1)])
    query = [[[y[h * hd + d][s] + mean_q[s][h][d] for d in range(hd)] for h in range(nq)] for s in range(seq)]
    key = [[[y[lq + j * hd + d][s] + mean_k[s][j][d] for d in range(hd)] for j in range(nkv)] for s in range(seq)]
    # Values: val_proj1 on h_t, val_proj2 on h_{t-1} (zeros before the start), viewed as heads.
    shifted = [[0.0] * len(x[0])] + x[:-1]
    v = [a + b for a, b in zip(linear(x, t[p + "val_proj1.weight"]), linear(shifted, t[p + "val_proj2.weight"]))]
    value = [[v[s][j * hd : (j + 1) * hd] for j in range(nkv)] for s in range(seq)]
    # L2 normalisation to norm sqrt(head_dim); keys times their head's temperature.
    scale = math.sqrt(hd)
    norm = lambda u: math.sqrt(sum(a * a for a in u))
    temp = t[p + "temp"]
    query = [[[a * scale / norm(hv) for a in hv] for hv in qs] for qs in query]
    key = [[[a * scale / norm(hv) * temp[j] for a in hv] for j, hv in enumerate(ks)] for ks in key]
    return query, key, value


def rope(vec, pos, cfg):
    """apply_rotary_pos_emb on one head at position `pos`: rotate-half on the first
    int(head_dim * partial_rotary_factor) channels (default RoPE: inv_freq = theta^(-2i/dim))."""
    dim = int(cfg["head_dim"] * cfg["partial_rotary_factor"])
    if dim == 0:
        return vec
    half = dim // 2
    inv = [1.0 / (cfg["rope_theta"] ** (2 * i / dim)) for i in range(half)]
    ang = [pos * f for f in inv] * 2
    rot = vec[:dim]
    rotated = [-a for a in rot[half:]] + rot[:half]
    return [a * math.cos(th) + r * math.sin(th) for a, r, th in zip(rot, rotated, ang)] + vec[dim:]


def attention(t, p, x, cfg):
    """ZayaAttention (eager) on one sequence."""
    nq, nkv, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    query, key, value = cca(t, p + "qkv.", x, cfg)
    seq = len(x)
    query = [[rope(query[s][h], s, cfg) for h in range(nq)] for s in range(seq)]
    key = [[rope(key[s][j], s, cfg) for j in range(nkv)] for s in range(seq)]
    rep = nq // nkv  # repeat_kv: query head h reads KV head h // rep
    out = []
    for s in range(seq):
        heads = []
        for h in range(nq):
            j = h // rep
            scores = [sum(a * b for a, b in zip(query[s][h], key[u][j])) / math.sqrt(hd) for u in range(s + 1)]
            w = softmax(scores)
            heads.extend(sum(w[u] * value[u][j][d] for u in range(s + 1)) for d in range(hd))
        out.append(heads)
    return linear(out, t[p + "o_proj.weight"])


def moe(t, p, x, prev, layer, cfg):
    """ZayaBlock with top-1 routing: returns output, the router state for the next MoE layer,
    and each token's route."""
    r = p + "router."
    hs = linear(x, t[r + "down_proj.weight"], t[r + "down_proj.bias"])
    if cfg["zaya_use_eda"] and layer != 1 and prev is not None:
        hs = [[a + b * c for a, b, c in zip(u, v, t[r + "router_states_scale"])] for u, v in zip(hs, prev)]
    nxt = hs
    h = rmsnorm(hs, t[r + "rmsnorm_eda.weight"], cfg["norm_epsilon"])
    h = [[gelu(a) for a in u] for u in linear(h, t[r + "router_mlp.0.weight"], t[r + "router_mlp.0.bias"])]
    h = [[gelu(a) for a in u] for u in linear(h, t[r + "router_mlp.2.weight"], t[r + "router_mlp.2.bias"])]
    probs = [softmax(u) for u in linear(h, t[r + "router_mlp.4.weight"])]
    biases = t[r + "balancing_biases"]
    out, choices = [], []
    for token, pr in zip(x, probs):
        biased = [a + b for a, b in zip(pr, biases)]
        c = max(range(len(biased)), key=lambda i: biased[i])
        choices.append(c)
        if c < cfg["num_experts"]:
            e = f"{p}experts.local_experts.{c}."
            (u,) = linear([token], t[e + "linear_fc1.weight"])
            f = len(u) // 2
            (y,) = linear([[silu(a) * b for a, b in zip(u[:f], u[f:])]], t[e + "linear_fc2.weight"])
        elif cfg.get("zflow_skip_output") == "zero":  # the MoD skip route, current semantics
            y = [0.0] * len(token)
        else:  # the MoD skip route as the reference's legacy branch has it: the token passes
            y = token
        out.append([pr[c] * a for a in y])
    return out, nxt, choices


def forward(cfg, t, tokens):
    embed = t["model.embed_tokens.weight"]
    hidden = [list(embed[i]) for i in tokens]
    residual, prev, choices = None, None, []
    eps = cfg["norm_epsilon"]
    for layer in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{layer}."
        if cfg["scale_residual_merge"]:
            residual, hidden = res_scale(t, p + "res_scale.", residual, hidden, layer != 0)
        residual = hidden if residual is None else add(hidden, residual)
        h = rmsnorm(residual, t[p + "input_norm.weight"], eps)
        if layer % 2 == 0:
            hidden = attention(t, p + "self_attn.", h, cfg)
        else:
            hidden, prev, c = moe(t, p + "zaya_block.", h, prev, layer, cfg)
            choices.append(c)
    if cfg["scale_residual_merge"]:
        residual, hidden = res_scale(t, "model.res_scale.", residual, hidden, True)
    residual = add(hidden, residual)
    h = rmsnorm(residual, t["model.final_norm.weight"], eps)
    return linear(h, embed), choices  # tied head: lm_head.weight is the embedding


def main():
    cfg, tensors = load(sys.argv[1])
    logits, choices = forward(cfg, tensors, json.loads(sys.argv[2]))
    print(json.dumps({"logits": logits, "choices": choices}))


if __name__ == "__main__":
    main()
