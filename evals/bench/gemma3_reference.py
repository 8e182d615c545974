#!/usr/bin/env python3
"""An independent float64 numpy forward pass of a Gemma 3 GGUF (its weights dequantized by the
`gguf` package), to check the Rust adapter's numbers: it prints the loglikelihood of one request.

  python3 evals/bench/gemma3_reference.py MODEL.gguf REQUESTS.jsonl INDEX
(REQUESTS.jsonl as written by `bench_gguf dump`; its first line's request INDEX is scored.)
Needs `pip install gguf numpy`; takes about a minute (262k x 640 head in float64).
Written from the Gemma 3 architecture (llama.cpp's `gemma3` graph), not from the Rust code.
"""
import json, sys, math
import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize
r = GGUFReader(sys.argv[1])
T = {t.name: t for t in r.tensors}
def W(name):
    t = T[name]
    a = dequantize(t.data, t.tensor_type)
    return np.asarray(a, dtype=np.float64).reshape([int(x) for x in reversed(t.shape)]) if a.ndim == 1 and len(t.shape) > 1 else np.asarray(a, dtype=np.float64)
md = {k: f.contents() for k, f in r.fields.items() if not k.startswith('tokenizer')}
d = md['gemma3.embedding_length']; H = md['gemma3.attention.head_count']; KV = md['gemma3.attention.head_count_kv']
hd = md['gemma3.attention.key_length']; L = md['gemma3.block_count']; eps = md['gemma3.attention.layer_norm_rms_epsilon']
req = json.loads(open(sys.argv[2]).readline())['requests'][int(sys.argv[3])]
seq = req['context'] + req['continuation']; inp = seq[:-1]; n = len(inp)
emb = W('token_embd.weight')  # [vocab, d]
x = emb[inp] * math.sqrt(d)
def rms(x, w): return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w
def rope(x, base):  # x [n, h, hd], neox halves
    half = hd // 2
    inv = base ** (-np.arange(half) * 2.0 / hd)
    ang = np.arange(n)[:, None] * inv[None, :]
    c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    x1, x2 = x[..., :half], x[..., half:]
    return np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], -1)
def gelu(x): return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))
mask = np.triu(np.full((n, n), -np.inf), 1)
for i in range(L):
    p = f'blk.{i}.'
    local = i % 6 < 5
    h = rms(x, W(p + 'attn_norm.weight'))
    q = (h @ W(p + 'attn_q.weight').T).reshape(n, H, hd)
    k = (h @ W(p + 'attn_k.weight').T).reshape(n, KV, hd)
    v = (h @ W(p + 'attn_v.weight').T).reshape(n, KV, hd)
    q = rms(q, W(p + 'attn_q_norm.weight')); k = rms(k, W(p + 'attn_k_norm.weight'))
    base = 10000.0 if local else md['gemma3.rope.freq_base']
    q = rope(q, base) / math.sqrt(hd); k = rope(k, base)
    out = np.zeros((n, H, hd))
    for hh in range(H):
        kvh = hh // (H // KV)
        s = q[:, hh] @ k[:, kvh].T + mask
        s = np.exp(s - s.max(-1, keepdims=True)); s /= s.sum(-1, keepdims=True)
        out[:, hh] = s @ v[:, kvh]
    o = out.reshape(n, H * hd) @ W(p + 'attn_output.weight').T
    x = x + rms(o, W(p + 'post_attention_norm.weight'))
    h = rms(x, W(p + 'ffn_norm.weight'))
    f = (gelu(h @ W(p + 'ffn_gate.weight').T) * (h @ W(p + 'ffn_up.weight').T)) @ W(p + 'ffn_down.weight').T
    x = x + rms(f, W(p + 'post_ffw_norm.weight'))
x = rms(x, W('output_norm.weight'))
first = len(req['context']) - 1
lp = 0.0
for q_ in range(first, n):
    logits = emb @ x[q_]
    m = logits.max(); lse = m + math.log(np.exp(logits - m).sum())
    lp += logits[seq[q_ + 1]] - lse
print(json.dumps({"logprob": lp}))
