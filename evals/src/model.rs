//! The interface every model adapter implements.
//!
//! Adapters work on token ids only; tokenization (lm-eval's rules, [`crate::tokenizer`]),
//! batching, caching and metrics are the harness's, so a new adapter (the zflow checkpoint's
//! transformers scorer, say) needs a forward pass and little else.

use anyhow::Result;

pub use crate::tokenizer::TokenRequest;
use crate::tokenizer::Tokenizer;

/// The result of one [`TokenRequest`].
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Score {
    /// Sum over the continuation of log p(token | everything before it), natural log.
    pub logprob: f64,
    /// Whether every continuation token was the model's argmax (greedy) choice.
    pub is_greedy: bool,
}

/// A language model the harness can evaluate.
pub trait LanguageModel {
    /// Names the model's weights and any code that changes its numbers (a hash of the file and
    /// an adapter version, say). Part of every cache key: change it and nothing is reused.
    fn identity(&self) -> String;

    /// The tokenizer that goes with the model.
    fn tokenizer(&self) -> &Tokenizer;

    /// The longest input (in tokens) the model accepts; longer requests are cut from the left,
    /// as lm-eval does.
    fn max_length(&self) -> usize;

    /// Scores groups of requests: one result per request, in order. Requests of one group
    /// come from one document (the choices of one question) and usually share a long prefix,
    /// which an adapter with a KV cache can compute once; others may score them one by one.
    fn loglikelihood(&mut self, groups: &[Vec<TokenRequest>]) -> Result<Vec<Vec<Score>>>;

    /// Greedy decoding after `context`: returns the generated tokens, at most `max_new_tokens`,
    /// stopping early at an end-of-sequence token or when `stop` (given all tokens generated so
    /// far) says so. The stopping token or text is included; the caller trims it.
    fn generate_greedy(
        &mut self,
        context: &[u32],
        max_new_tokens: usize,
        stop: &mut dyn FnMut(&[u32]) -> bool,
    ) -> Result<Vec<u32>>;
}
