#!/usr/bin/env python3
"""Scores token-level loglikelihood requests with llama.cpp (llama-cpp-python) and prints tokens/s.

The requests file is what `cargo run -p zflow-evals --example bench_gguf -- dump ...` writes: one
JSON object per line, {"group": i, "requests": [{"context": [ids], "continuation": [ids]}, ...]},
a group being one document's requests (the choices of one question). So both sides score the
same token ids and the comparison measures the model code only, never the tokenizers.

Modes (all ask llama.cpp for logits only at the rows that predict a continuation token, as the
Rust side does, instead of `logits_all`):
  prefix   per group, the shared prefix is decoded once and each request's remainder is decoded
           on top of it (KV cache rows dropped in between): the work the Rust side does.
  naive    every request decoded from scratch (what a harness without prefix reuse does).
tokens/s counts, as the Rust side does, every request's input tokens (context + continuation - 1),
whatever the mode actually ran; tokens per CPU second (all threads) is printed too (llama.cpp's
threads spin while they wait, so on a loaded machine its wall time suffers more than its CPU time
shows).

  python evals/bench/llama_cpp_score.py --model M.gguf --requests reqs.jsonl [--mode prefix]
      [--threads 2] [--out scores.jsonl] [--compare rust_scores.jsonl]
"""
import argparse
import ctypes
import json
import math
import sys
import time

import numpy as np
import llama_cpp as L


def shared_prefix_len(reqs):
    inputs = [r["context"] + r["continuation"][:-1] for r in reqs]
    n = 0
    while all(n < len(x) for x in inputs) and len({x[n] for x in inputs}) == 1:
        n += 1
    return n


class Scorer:
    def __init__(self, model, threads, n_ctx, n_batch):
        self.llm = L.Llama(model_path=model, n_ctx=n_ctx, n_batch=n_batch, n_ubatch=n_batch,
                           n_threads=threads, n_threads_batch=threads, logits_all=False, verbose=False)
        self.ctx = self.llm._ctx.ctx
        self.mem = L.llama_get_memory(self.ctx)
        self.n_vocab = self.llm.n_vocab()
        self.n_batch = n_batch
        self.batch = L.llama_batch_init(n_batch, 0, 1)
        self.decoded_tokens = 0

    def clear_from(self, pos):
        L.llama_memory_seq_rm(self.mem, 0, pos, -1)

    def decode(self, tokens, start_pos, want):
        """Decodes tokens at positions start_pos.. ; returns {position: logits row} for `want`."""
        out = {}
        for off in range(0, len(tokens), self.n_batch):
            chunk = tokens[off:off + self.n_batch]
            b = self.batch
            b.n_tokens = len(chunk)
            for i, t in enumerate(chunk):
                p = start_pos + off + i
                b.token[i] = t
                b.pos[i] = p
                b.n_seq_id[i] = 1
                b.seq_id[i][0] = 0
                b.logits[i] = 1 if p in want else 0
            if L.llama_decode(self.ctx, b) != 0:
                raise RuntimeError("llama_decode failed")
            self.decoded_tokens += len(chunk)
            for i in range(len(chunk)):
                p = start_pos + off + i
                if p in want:
                    ptr = L.llama_get_logits_ith(self.ctx, i)
                    out[p] = np.ctypeslib.as_array(ptr, shape=(self.n_vocab,)).copy()
        return out

    @staticmethod
    def score_rows(rows, seq, first, last):
        lp, greedy = 0.0, True
        for q in range(first, last):
            row = rows[q]
            m = float(row.max())
            lse = m + math.log(float(np.exp(row - m, dtype=np.float32).sum(dtype=np.float64)))
            t = seq[q + 1]
            lp += float(row[t]) - lse
            greedy = greedy and int(row.argmax()) == t
        return lp, greedy

    def group(self, reqs, mode):
        results = []
        if mode == "naive":
            for r in reqs:
                seq = r["context"] + r["continuation"]
                inputs = seq[:-1]
                first = len(r["context"]) - 1
                self.clear_from(0)
                rows = self.decode(inputs, 0, set(range(first, len(inputs))))
                results.append(self.score_rows(rows, seq, first, len(inputs)))
            return results
        p = shared_prefix_len(reqs)
        firsts = [len(r["context"]) - 1 for r in reqs]
        prefix = (reqs[0]["context"] + reqs[0]["continuation"])[:p]
        self.clear_from(0)
        want = {q for r, first in zip(reqs, firsts)
                for q in range(first, min(p, len(r["context"]) + len(r["continuation"]) - 1))}
        prefix_rows = self.decode(prefix, 0, want)
        for r, first in zip(reqs, firsts):
            seq = r["context"] + r["continuation"]
            inputs = seq[:-1]
            self.clear_from(p)
            rows = dict(prefix_rows)
            rows.update(self.decode(inputs[p:], p, set(range(max(first, p), len(inputs)))))
            results.append(self.score_rows(rows, seq, first, len(inputs)))
        return results


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--requests", required=True)
    ap.add_argument("--mode", choices=["prefix", "naive"], default="prefix")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--n-ctx", type=int, default=4096)
    ap.add_argument("--n-batch", type=int, default=512)
    ap.add_argument("--out", help="write {group, index, logprob, is_greedy} lines here")
    ap.add_argument("--compare", help="the Rust side's scores (same format): print the largest differences")
    args = ap.parse_args()

    groups = [json.loads(line) for line in open(args.requests)]
    input_tokens = sum(len(r["context"]) + len(r["continuation"]) - 1 for g in groups for r in g["requests"])
    s = Scorer(args.model, args.threads, args.n_ctx, args.n_batch)
    # Warm up (first decode allocates buffers), then time.
    s.group(groups[0]["requests"], args.mode)
    s.decoded_tokens = 0
    t0, c0 = time.perf_counter(), time.process_time()
    scores = [s.group(g["requests"], args.mode) for g in groups]
    dt, cpu = time.perf_counter() - t0, time.process_time() - c0
    n_req = sum(len(g["requests"]) for g in groups)
    print(f"llama.cpp ({L.__version__}, mode {args.mode}, {args.threads} threads): {n_req} requests, "
          f"{input_tokens} input tokens ({s.decoded_tokens} decoded) in {dt:.2f} s: "
          f"{input_tokens / dt:.1f} input tokens/s; {cpu:.1f} CPU s: {input_tokens / cpu:.1f} input tokens per CPU s")
    if args.out:
        with open(args.out, "w") as f:
            for g, sc in zip(groups, scores):
                for i, (lp, greedy) in enumerate(sc):
                    f.write(json.dumps({"group": g["group"], "index": i, "logprob": lp, "is_greedy": greedy}) + "\n")
    if args.compare:
        theirs = {(o["group"], o["index"]): o for o in map(json.loads, open(args.compare))}
        diffs = []
        agree = total = 0
        for g, sc in zip(groups, scores):
            mine = [lp for lp, _ in sc]
            other = [theirs[(g["group"], i)]["logprob"] for i in range(len(sc))]
            diffs.extend(abs(a - b) for a, b in zip(mine, other))
            total += 1
            agree += int(np.argmax(mine) == np.argmax(other))
        diffs.sort()
        print(f"compared with {args.compare}: |logprob difference| median {diffs[len(diffs) // 2]:.4f}, "
              f"max {diffs[-1]:.4f}; same argmax choice in {agree}/{total} groups")


if __name__ == "__main__":
    sys.exit(main())
