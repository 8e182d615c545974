//! Scoring: instances -> cached results, with batching and request-level resume.
//!
//! 1. Every request's cache key is computed; cached requests are not scored again.
//! 2. The rest are tokenized (lm-eval's rules) and grouped by document, since a document's
//!    requests share a prefix (the question) an adapter can compute once.
//! 3. Groups are sorted longest first (lm-eval's order: similar lengths batch together, and an
//!    out-of-memory shows up at once) and packed into batches of at most
//!    [`EngineOptions::max_batch_tokens`] model inputs, counting a shared prefix once.
//! 4. Each batch's results are appended to the cache as they arrive.
//!
//! Batch composition depends only on the requests still to score, so the same inputs and the
//! same cache give the same batches, and the same results.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::cache::{Cache, Cached};
use crate::model::{LanguageModel, Score, TokenRequest};
use crate::request::{Instance, Request};

/// Told `(task, requests done, requests in all)` after every batch, for a progress bar; returns
/// false to stop scoring (the caller was cancelled). What was scored is in the cache.
pub type ProgressSink = Arc<dyn Fn(&str, usize, usize) -> bool + Send + Sync>;

/// Knobs of the scoring loop.
#[derive(Clone)]
pub struct EngineOptions {
    /// The most model inputs (tokens, a shared prefix counted once) per `loglikelihood` call.
    pub max_batch_tokens: usize,
    /// Print progress lines to stderr (at most every 10 s).
    pub progress: bool,
    /// Also report progress here after every batch (a pipeline stage's progress bar).
    pub sink: Option<ProgressSink>,
}

impl std::fmt::Debug for EngineOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EngineOptions")
            .field("max_batch_tokens", &self.max_batch_tokens)
            .field("progress", &self.progress)
            .field("sink", &self.sink.is_some())
            .finish()
    }
}

impl Default for EngineOptions {
    fn default() -> Self {
        EngineOptions {
            max_batch_tokens: 2048,
            progress: true,
            sink: None,
        }
    }
}

/// What one run of the engine did.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct EngineStats {
    /// Requests answered from the cache (or duplicates of another request in the same run).
    pub cached: usize,
    /// Requests sent to the model.
    pub scored: usize,
    /// Sum over scored token requests of their input length (context + continuation - 1):
    /// the work a model without prefix sharing would do. The tokens/s numbers use this.
    pub input_tokens: usize,
    /// The inputs actually run with shared prefixes counted once.
    pub packed_tokens: usize,
    /// Tokens generated.
    pub generated_tokens: usize,
    /// Time spent inside the model.
    pub model_time: Duration,
}

/// Length of the longest common prefix of the groups' requests' inputs (what an adapter with
/// prefix sharing runs once).
pub fn shared_prefix_len(group: &[TokenRequest]) -> usize {
    let Some(first) = group.first() else { return 0 };
    let input = |r: &TokenRequest, i: usize| -> Option<u32> {
        if i < r.context.len() {
            Some(r.context[i])
        } else {
            r.continuation
                .get(i - r.context.len())
                .copied()
                .filter(|_| i < r.input_len())
        }
    };
    let mut n = 0;
    while n < first.input_len()
        && group
            .iter()
            .all(|r| n < r.input_len() && input(r, n) == input(first, n))
    {
        n += 1;
    }
    n
}

/// Inputs a group costs with its shared prefix run once.
pub fn packed_len(group: &[TokenRequest]) -> usize {
    let p = shared_prefix_len(group);
    p + group.iter().map(|r| r.input_len() - p).sum::<usize>()
}

/// Batches of group indices: longest group first (ties in input order, so batches never depend
/// on anything but the groups), each batch at most `max_batch_tokens` packed inputs (a group
/// larger than that is a batch of its own).
pub fn plan_batches(groups: &[Vec<TokenRequest>], max_batch_tokens: usize) -> Vec<Vec<usize>> {
    let costs: Vec<usize> = groups.iter().map(|g| packed_len(g)).collect();
    let mut order: Vec<usize> = (0..groups.len()).collect();
    order.sort_by_key(|&g| std::cmp::Reverse(costs[g]));
    let mut batches = Vec::new();
    let mut current: Vec<usize> = Vec::new();
    let mut cost = 0;
    for g in order {
        if !current.is_empty() && cost + costs[g] > max_batch_tokens {
            batches.push(std::mem::take(&mut current));
            cost = 0;
        }
        cost += costs[g];
        current.push(g);
    }
    if !current.is_empty() {
        batches.push(current);
    }
    batches
}

/// Cuts a request from the left to at most `max_len` inputs, as lm-eval does.
pub fn truncate(mut r: TokenRequest, max_len: usize) -> TokenRequest {
    if r.input_len() <= max_len {
        return r;
    }
    if r.continuation.len() > max_len {
        // Even the continuation does not fit: score its last max_len tokens after the one
        // before them.
        let cut = r.continuation.len() - max_len;
        let before = r.continuation[cut - 1];
        r.continuation.drain(..cut);
        r.context = vec![before];
        return r;
    }
    let keep = max_len + 1 - r.continuation.len();
    let drop = r.context.len() - keep;
    r.context.drain(..drop);
    r
}

struct Progress {
    label: String,
    enabled: bool,
    sink: Option<ProgressSink>,
    start: Instant,
    last: Instant,
}

impl Progress {
    fn tick(&mut self, done: usize, total: usize, tokens: usize, force: bool) -> Result<()> {
        if let Some(sink) = &self.sink
            && !sink(&self.label, done, total)
        {
            bail!(
                "cancelled while scoring {} ({done} of {total} requests done and cached)",
                self.label
            );
        }
        if !self.enabled || (!force && self.last.elapsed() < Duration::from_secs(10)) {
            return Ok(());
        }
        self.last = Instant::now();
        let secs = self.start.elapsed().as_secs_f64().max(1e-9);
        eprintln!(
            "[{}] {done}/{total} requests scored, {:.0} input tokens/s, {:.0} s",
            self.label,
            tokens as f64 / secs,
            secs
        );
        Ok(())
    }
}

/// Scores instances through a model and a cache.
pub struct Engine<'a> {
    model: &'a mut dyn LanguageModel,
    cache: &'a mut Cache,
    opts: EngineOptions,
    /// Totals over every call to [`Engine::run`].
    pub stats: EngineStats,
}

enum Pending {
    /// (instance, request) -> one token request.
    Single(usize, usize),
    /// (rolling text slot, window): a rolling text's windows are summed.
    Rolling(usize, usize),
}

impl<'a> Engine<'a> {
    /// An engine over a model and its cache.
    pub fn new(
        model: &'a mut dyn LanguageModel,
        cache: &'a mut Cache,
        opts: EngineOptions,
    ) -> Self {
        Engine {
            model,
            cache,
            opts,
            stats: EngineStats::default(),
        }
    }

    /// Results for every request of every instance (same shape as the instances' requests).
    pub fn run(&mut self, instances: &[Instance], label: &str) -> Result<Vec<Vec<Cached>>> {
        let keys: Vec<Vec<_>> = instances
            .iter()
            .map(|inst| inst.requests.iter().map(|r| self.cache.key(r)).collect())
            .collect();
        let mut progress = Progress {
            label: label.to_string(),
            enabled: self.opts.progress,
            sink: self.opts.sink.clone(),
            start: Instant::now(),
            last: Instant::now(),
        };
        self.score_loglikelihoods(instances, &keys, &mut progress)?;
        self.generate(instances, &keys, &mut progress)?;
        self.cache.sync()?;
        instances
            .iter()
            .zip(&keys)
            .map(|(inst, ks)| {
                ks.iter()
                    .map(|k| {
                        self.cache.get(k).cloned().with_context(|| {
                            format!("[{label}] document {}: no result", inst.doc_index)
                        })
                    })
                    .collect()
            })
            .collect()
    }

    fn score_loglikelihoods(
        &mut self,
        instances: &[Instance],
        keys: &[Vec<crate::cache::Key>],
        progress: &mut Progress,
    ) -> Result<()> {
        let max_len = self.model.max_length();
        // Per instance: the token requests still to score and what each one answers.
        let mut groups: Vec<(Vec<TokenRequest>, Vec<Pending>)> = Vec::new();
        let mut rolling_parts: Vec<(usize, usize, Vec<Option<Score>>)> = Vec::new();
        // Identical requests (two documents rendering the same prompt) are scored once.
        let mut queued = std::collections::HashSet::new();
        let mut total = 0;
        for (i, inst) in instances.iter().enumerate() {
            let mut toks = Vec::new();
            let mut pend = Vec::new();
            for (j, req) in inst.requests.iter().enumerate() {
                if matches!(req, Request::Generate { .. }) {
                    continue;
                }
                total += 1;
                if self.cache.get(&keys[i][j]).is_some() || !queued.insert(keys[i][j]) {
                    self.stats.cached += 1;
                    continue;
                }
                let tok = self.model.tokenizer();
                match req {
                    Request::Loglikelihood {
                        context,
                        continuation,
                    } => {
                        let r = tok.encode_pair(context, continuation)?;
                        if r.continuation.is_empty() {
                            bail!(
                                "document {}: continuation {continuation:?} has no tokens",
                                inst.doc_index
                            );
                        }
                        toks.push(truncate(r, max_len));
                        pend.push(Pending::Single(i, j));
                    }
                    Request::Rolling { text } => {
                        let windows = tok.rolling_windows(text, max_len)?;
                        let slot = rolling_parts.len();
                        rolling_parts.push((i, j, vec![None; windows.len()]));
                        for (w, win) in windows.into_iter().enumerate() {
                            toks.push(win);
                            pend.push(Pending::Rolling(slot, w));
                        }
                        if rolling_parts[slot].2.is_empty() {
                            // An empty text: loglikelihood 0 over 0 tokens.
                            self.cache.put(
                                keys[i][j],
                                Cached::Score(Score {
                                    logprob: 0.0,
                                    is_greedy: true,
                                }),
                            )?;
                        }
                    }
                    Request::Generate { .. } => unreachable!(),
                }
            }
            if !toks.is_empty() {
                groups.push((toks, pend));
            }
        }
        if groups.is_empty() {
            return Ok(());
        }
        let token_groups: Vec<Vec<TokenRequest>> = groups.iter().map(|g| g.0.clone()).collect();
        let mut done = self.stats.cached;
        for batch_groups in plan_batches(&token_groups, self.opts.max_batch_tokens) {
            let cost: usize = batch_groups
                .iter()
                .map(|&g| packed_len(&token_groups[g]))
                .sum();
            let batch: Vec<Vec<TokenRequest>> = batch_groups
                .iter()
                .map(|&g| token_groups[g].clone())
                .collect();
            let t0 = Instant::now();
            let scores = self.model.loglikelihood(&batch)?;
            self.stats.model_time += t0.elapsed();
            if scores.len() != batch.len()
                || scores.iter().zip(&batch).any(|(s, b)| s.len() != b.len())
            {
                bail!("the model returned results of the wrong shape");
            }
            self.stats.packed_tokens += cost;
            for (&g, group_scores) in batch_groups.iter().zip(scores) {
                let (toks, pend) = &groups[g];
                for ((tok, p), s) in toks.iter().zip(pend).zip(group_scores) {
                    self.stats.input_tokens += tok.input_len();
                    match *p {
                        Pending::Single(i, j) => {
                            self.cache.put(keys[i][j], Cached::Score(s))?;
                            self.stats.scored += 1;
                            done += 1;
                        }
                        Pending::Rolling(slot, w) => {
                            let parts = &mut rolling_parts[slot];
                            parts.2[w] = Some(s);
                            if parts.2.iter().all(Option::is_some) {
                                let sum = parts.2.iter().flatten().fold(
                                    Score {
                                        logprob: 0.0,
                                        is_greedy: true,
                                    },
                                    |a, s| Score {
                                        logprob: a.logprob + s.logprob,
                                        is_greedy: a.is_greedy && s.is_greedy,
                                    },
                                );
                                let (i, j) = (parts.0, parts.1);
                                self.cache.put(keys[i][j], Cached::Score(sum))?;
                                self.stats.scored += 1;
                                done += 1;
                            }
                        }
                    }
                }
            }
            progress.tick(done, total, self.stats.input_tokens, false)?;
        }
        progress.tick(done, total, self.stats.input_tokens, true)?;
        Ok(())
    }

    fn generate(
        &mut self,
        instances: &[Instance],
        keys: &[Vec<crate::cache::Key>],
        progress: &mut Progress,
    ) -> Result<()> {
        // Every generation request still to run (the first of identical ones), with its
        // tokenized, windowed context.
        struct Pending<'r> {
            at: (usize, usize),
            context: Vec<u32>,
            until: &'r [String],
            max_gen_toks: usize,
        }
        let mut pending: Vec<Pending> = Vec::new();
        let mut queued = std::collections::HashSet::new();
        let (mut total, mut done) = (0, 0);
        let max_len = self.model.max_length();
        for (i, inst) in instances.iter().enumerate() {
            for (j, req) in inst.requests.iter().enumerate() {
                let Request::Generate {
                    context,
                    until,
                    max_gen_toks,
                } = req
                else {
                    continue;
                };
                total += 1;
                if self.cache.get(&keys[i][j]).is_some() || !queued.insert(keys[i][j]) {
                    self.stats.cached += 1;
                    done += 1;
                    continue;
                }
                let ctx = self.model.tokenizer().encode_context(context)?;
                // Room for the generation: cut the context from the left, keeping a token.
                let cut = (ctx.len() + max_gen_toks)
                    .saturating_sub(max_len)
                    .min(ctx.len() - 1);
                pending.push(Pending {
                    at: (i, j),
                    context: ctx[cut..].to_vec(),
                    until,
                    max_gen_toks: *max_gen_toks,
                });
            }
        }
        if pending.is_empty() {
            return Ok(());
        }
        // lm-eval's order: longest context first (ties in input order), so batches hold
        // similar lengths and an out-of-memory shows at once. A batch shares its stop
        // sequences and token limit, and holds at most `max_batch_tokens` context and
        // generated tokens (always at least one request).
        pending.sort_by_key(|p| std::cmp::Reverse(p.context.len()));
        let mut at = 0;
        while at < pending.len() {
            let (until, max_gen_toks) = (pending[at].until, pending[at].max_gen_toks);
            let mut end = at + 1;
            let mut cost = pending[at].context.len() + max_gen_toks;
            while end < pending.len()
                && pending[end].until == until
                && pending[end].max_gen_toks == max_gen_toks
                && cost + pending[end].context.len() + max_gen_toks <= self.opts.max_batch_tokens
            {
                cost += pending[end].context.len() + max_gen_toks;
                end += 1;
            }
            let batch = &pending[at..end];
            let contexts: Vec<Vec<u32>> = batch.iter().map(|p| p.context.clone()).collect();
            let t0 = Instant::now();
            let outputs = self.model.generate_batch(&contexts, max_gen_toks, until)?;
            self.stats.model_time += t0.elapsed();
            if outputs.len() != batch.len() {
                bail!(
                    "the model returned {} generations for {} contexts",
                    outputs.len(),
                    batch.len()
                );
            }
            for (p, out) in batch.iter().zip(outputs) {
                self.stats.generated_tokens += out.len();
                self.stats.input_tokens += p.context.len() + out.len();
                let text = cut_at_stop(&self.model.tokenizer().decode(&out)?, until);
                self.cache
                    .put(keys[p.at.0][p.at.1], Cached::Text { text })?;
                self.stats.scored += 1;
                done += 1;
            }
            at = end;
            progress.tick(done, total, self.stats.input_tokens, false)?;
        }
        progress.tick(done, total, self.stats.input_tokens, true)?;
        Ok(())
    }
}

/// The text before the first occurrence of any stop sequence (lm-eval splits on each in turn,
/// which amounts to the same).
pub fn cut_at_stop(text: &str, until: &[String]) -> String {
    let mut end = text.len();
    for u in until.iter().filter(|u| !u.is_empty()) {
        if let Some(p) = text.find(u.as_str()) {
            end = end.min(p);
        }
    }
    text[..end].to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tr(c: &[u32], k: &[u32]) -> TokenRequest {
        TokenRequest {
            context: c.to_vec(),
            continuation: k.to_vec(),
        }
    }

    #[test]
    fn shared_prefix_and_packed_len() {
        let g = vec![tr(&[1, 2, 3], &[4, 5]), tr(&[1, 2, 3], &[6, 7, 8])];
        assert_eq!(shared_prefix_len(&g), 3);
        assert_eq!(packed_len(&g), 3 + 1 + 2);
        // Winogrande: contexts differ after a shared start, the continuation is the same.
        let g = vec![tr(&[1, 2, 9], &[5, 6]), tr(&[1, 2, 8], &[5, 6])];
        assert_eq!(shared_prefix_len(&g), 2);
        // A continuation's first token shared by all choices extends the prefix.
        let g = vec![tr(&[1], &[4, 5]), tr(&[1], &[4, 6])];
        assert_eq!(shared_prefix_len(&g), 2);
        // The last continuation token is never an input.
        let g = vec![tr(&[1], &[4]), tr(&[1], &[5])];
        assert_eq!(shared_prefix_len(&g), 1);
    }

    #[test]
    fn batches_are_longest_first_and_bounded() {
        let g = |n: usize| vec![tr(&vec![1; n], &[2])];
        let groups = vec![g(3), g(10), g(5), g(5), g(1)];
        assert_eq!(
            plan_batches(&groups, 10),
            vec![vec![1], vec![2, 3], vec![0, 4]]
        );
        assert_eq!(
            plan_batches(&groups, 4),
            vec![vec![1], vec![2], vec![3], vec![0, 4]]
        );
    }

    #[test]
    fn truncation_keeps_the_continuation_and_the_nearest_context() {
        let r = truncate(tr(&[1, 2, 3, 4, 5], &[6, 7]), 4);
        assert_eq!(
            (r.context.clone(), r.continuation.clone()),
            (vec![3, 4, 5], vec![6, 7])
        );
        assert_eq!(r.input_len(), 4);
        let r = truncate(tr(&[1, 2], &[3, 4, 5, 6]), 2);
        assert_eq!((r.context, r.continuation), (vec![4], vec![5, 6]));
        let r = truncate(tr(&[1, 2], &[3]), 8);
        assert_eq!(r.context, vec![1, 2]);
    }

    #[test]
    fn stop_sequences_cut_at_the_first() {
        let until = vec!["Question:".to_string(), "\n\n".to_string()];
        assert_eq!(
            cut_at_stop("42 #### 42\n\nQuestion: x", &until),
            "42 #### 42"
        );
        assert_eq!(cut_at_stop("no stop", &until), "no stop");
    }
}
