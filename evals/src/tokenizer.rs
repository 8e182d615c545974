//! Tokenization the way lm-eval does it, for any adapter.
//!
//! - A (context, continuation) pair moves the context's trailing whitespace into the
//!   continuation, tokenizes `context + continuation` as a whole, and takes the continuation's
//!   tokens as what follows the context's own tokens (lm-eval's `_encode_pair`), so the scored
//!   tokens are the ones the model would really see.
//! - Models that want a BOS token get it in front of every context; an empty context gets the
//!   BOS (or, failing that, the end-of-text) token so the first continuation token has something
//!   to be predicted from.
//! - Rolling loglikelihood splits a text into disjoint windows of at most the model's length
//!   (lm-eval's `get_rolling_token_windows` + `make_disjoint_window`, context length 1).

use std::path::Path;

use anyhow::{Result, bail};

/// Score `continuation` after `context` (both token ids; `context` is never empty).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TokenRequest {
    /// What the model reads first (BOS included when the model wants one).
    pub context: Vec<u32>,
    /// The tokens whose log-probabilities are summed.
    pub continuation: Vec<u32>,
}

impl TokenRequest {
    /// Tokens the model reads: the context and all but the last continuation token.
    pub fn input_len(&self) -> usize {
        self.context.len() + self.continuation.len().saturating_sub(1)
    }
}

/// A Hugging Face tokenizer plus the special tokens scoring needs.
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    /// The beginning-of-sequence token.
    pub bos: Option<u32>,
    /// Tokens that end generation.
    pub eos: Vec<u32>,
    /// Whether every context starts with BOS (Gemma, Llama 2/3: yes; GPT-2 style: no).
    pub add_bos: bool,
    identity: String,
}

impl Tokenizer {
    /// Wraps a tokenizer. `identity` should change whenever tokenization could (a hash of the
    /// tokenizer file, say); it becomes part of every cache key.
    pub fn new(
        inner: tokenizers::Tokenizer,
        bos: Option<u32>,
        eos: Vec<u32>,
        add_bos: bool,
        identity: String,
    ) -> Self {
        Tokenizer {
            inner,
            bos,
            eos,
            add_bos,
            identity,
        }
    }

    /// Reads a `tokenizer.json`; the identity is the blake3 of its bytes and the BOS settings.
    pub fn from_file(path: &Path, bos: Option<u32>, eos: Vec<u32>, add_bos: bool) -> Result<Self> {
        let bytes = zflow_files::read::bounded(path, zflow_runtime::hf::MAX_TOKENIZER_BYTES)?;
        let inner = tokenizers::Tokenizer::from_bytes(&bytes)
            .map_err(|e| anyhow::anyhow!("{}: not a tokenizer.json: {e}", path.display()))?;
        let identity = format!(
            "tokenizer.json:{}:bos={bos:?}:add_bos={add_bos}",
            blake3::hash(&bytes).to_hex()
        );
        Ok(Self::new(inner, bos, eos, add_bos, identity))
    }

    /// The wrapped tokenizer.
    pub fn inner(&self) -> &tokenizers::Tokenizer {
        &self.inner
    }

    /// What identifies this tokenizer's behaviour.
    pub fn identity(&self) -> &str {
        &self.identity
    }

    /// Token ids of `text`, without special tokens.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        let enc = self
            .inner
            .encode_fast(text, false)
            .map_err(|e| anyhow::anyhow!("tokenizing: {e}"))?;
        Ok(enc.get_ids().to_vec())
    }

    /// Text of `ids` (special tokens skipped).
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        self.inner
            .decode(ids, true)
            .map_err(|e| anyhow::anyhow!("decoding: {e}"))
    }

    /// The token an otherwise empty context starts with.
    pub fn prefix_token(&self) -> Result<u32> {
        match (self.bos, self.eos.first()) {
            (Some(b), _) => Ok(b),
            (None, Some(e)) => Ok(*e),
            (None, None) => bail!("the tokenizer has neither a BOS nor an EOS token"),
        }
    }

    /// Context tokens for a prompt: BOS (if wanted) + the prompt's tokens; never empty.
    pub fn encode_context(&self, context: &str) -> Result<Vec<u32>> {
        let mut ids = Vec::new();
        if self.add_bos {
            ids.push(self.prefix_token()?);
        }
        ids.extend(self.encode(context)?);
        if ids.is_empty() {
            ids.push(self.prefix_token()?);
        }
        Ok(ids)
    }

    /// lm-eval's `_encode_pair` (see the module docs).
    pub fn encode_pair(&self, context: &str, continuation: &str) -> Result<TokenRequest> {
        let trimmed = context.trim_end();
        let (context, continuation) = if trimmed.len() < context.len() {
            (
                trimmed.to_string(),
                format!("{}{continuation}", &context[trimmed.len()..]),
            )
        } else {
            (context.to_string(), continuation.to_string())
        };
        let ctx = self.encode_context(&context)?;
        let whole = self.encode_context(&format!("{context}{continuation}"))?;
        // The whole text's tokens normally start with the context's; when a merge crosses the
        // boundary they do not, and lm-eval still cuts at the context's length. Do the same.
        let continuation = whole.get(ctx.len()..).unwrap_or_default().to_vec();
        Ok(TokenRequest {
            context: ctx,
            continuation,
        })
    }

    /// A text as disjoint windows of at most `max_len` model inputs each (see the module docs).
    pub fn rolling_windows(&self, text: &str, max_len: usize) -> Result<Vec<TokenRequest>> {
        Ok(rolling_windows(
            &self.encode(text)?,
            self.prefix_token()?,
            max_len,
        ))
    }
}

/// lm-eval's `get_rolling_token_windows(tokens, prefix, max_len, context_len=1)` followed by
/// `make_disjoint_window`: every token is predicted exactly once, each window's input is at most
/// `max_len` tokens, and later windows see up to `max_len - n` earlier tokens as context.
pub fn rolling_windows(tokens: &[u32], prefix: u32, max_len: usize) -> Vec<TokenRequest> {
    assert!(max_len >= 1);
    let mut out = Vec::new();
    if tokens.is_empty() {
        return out;
    }
    let first = max_len.min(tokens.len());
    out.push(TokenRequest {
        context: vec![prefix],
        continuation: tokens[..first].to_vec(),
    });
    let mut predicted = first;
    while predicted < tokens.len() {
        let n = (tokens.len() - predicted).min(max_len);
        let end = predicted + n;
        // The input window is tokens[end - max_len - 1 .. end - 1] (never negative here: the
        // first window already predicted max_len tokens); its last n - 1 tokens are the
        // continuation's own, so the disjoint context is what precedes them.
        let ctx_start = end - max_len - 1;
        out.push(TokenRequest {
            context: tokens[ctx_start..end - n].to_vec(),
            continuation: tokens[end - n..end].to_vec(),
        });
        predicted = end;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Independent restatement of lm-eval's two functions, index for index.
    fn reference(tokens: &[u32], prefix: u32, max_len: usize) -> Vec<(Vec<u32>, Vec<u32>)> {
        let mut windows = Vec::new();
        let pred_len = max_len; // max_seq_len - context_len + 1 with context_len = 1
        let first = max_len.min(tokens.len());
        let mut a = vec![prefix];
        a.extend_from_slice(&tokens[..first - 1]);
        windows.push((a, tokens[..first].to_vec()));
        let mut predicted = first;
        while predicted < tokens.len() {
            let wpl = (tokens.len() - predicted).min(pred_len);
            let end = predicted + wpl;
            let start = end as i64 - max_len as i64 - 1;
            let a = tokens[start.max(0) as usize..end - 1].to_vec();
            windows.push((a, tokens[end - wpl..end].to_vec()));
            predicted += wpl;
        }
        // make_disjoint_window: a[: len(a) - (len(b) - 1)]
        windows
            .into_iter()
            .map(|(a, b)| (a[..a.len() - (b.len() - 1)].to_vec(), b))
            .collect()
    }

    #[test]
    fn rolling_windows_match_lm_eval() {
        for n in [1usize, 2, 5, 7, 8, 9, 16, 17, 30] {
            let tokens: Vec<u32> = (10..10 + n as u32).collect();
            for max_len in [1usize, 2, 3, 4, 8] {
                let ours: Vec<(Vec<u32>, Vec<u32>)> = rolling_windows(&tokens, 0, max_len)
                    .into_iter()
                    .map(|r| (r.context, r.continuation))
                    .collect();
                assert_eq!(
                    ours,
                    reference(&tokens, 0, max_len),
                    "n={n} max_len={max_len}"
                );
                let scored: Vec<u32> = ours.iter().flat_map(|w| w.1.clone()).collect();
                assert_eq!(scored, tokens);
                for (c, k) in &ours {
                    assert!(c.len() + k.len() - 1 <= max_len);
                }
            }
        }
    }

    fn toy() -> Tokenizer {
        // A word-level toy vocabulary with whitespace pre-tokenization (no network, no files).
        let json = r#"{"version":"1.0","truncation":null,"padding":null,"added_tokens":[],
            "normalizer":null,"pre_tokenizer":{"type":"Whitespace"},"post_processor":null,"decoder":null,
            "model":{"type":"WordLevel","vocab":{"<bos>":0,"<eos>":1,"a":2,"b":3,"c":4,"[UNK]":5},"unk_token":"[UNK]"}}"#;
        let inner = tokenizers::Tokenizer::from_bytes(json.as_bytes()).unwrap();
        Tokenizer::new(inner, Some(0), vec![1], true, "toy".into())
    }

    #[test]
    fn encode_pair_moves_trailing_space_and_adds_bos() {
        let t = toy();
        let r = t.encode_pair("a b ", "c").unwrap();
        assert_eq!(r.context, vec![0, 2, 3]);
        assert_eq!(r.continuation, vec![4]);
        let r = t.encode_pair("", "a").unwrap();
        assert_eq!(r.context, vec![0]);
        assert_eq!(r.continuation, vec![2]);
    }
}
