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

    /// Greedy decoding after each of `contexts`, every one stopping at an end-of-sequence
    /// token, at `max_new_tokens`, or once its decoded text holds one of `until` (that token
    /// included; the caller trims). Each result must equal [`LanguageModel::generate_greedy`]'s
    /// for its context alone. The default runs them one by one; an adapter with batched
    /// decoding (the transformers scorer) runs them together.
    fn generate_batch(
        &mut self,
        contexts: &[Vec<u32>],
        max_new_tokens: usize,
        until: &[String],
    ) -> Result<Vec<Vec<u32>>> {
        // The stop check decodes while the model is borrowed for generation: it gets its own
        // copy of the tokenizer.
        let tokenizer = self.tokenizer().inner().clone();
        let mut stop = |generated: &[u32]| -> bool {
            let text = tokenizer.decode(generated, true).unwrap_or_default();
            until.iter().any(|u| text.contains(u.as_str()))
        };
        contexts
            .iter()
            .map(|c| self.generate_greedy(c, max_new_tokens, &mut stop))
            .collect()
    }
}
