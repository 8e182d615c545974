//! Decontamination: training documents that share an n-gram (13 words by default) with a test
//! document of one of the recipe's eval tasks are removed, or flagged.
//!
//! `evals: {decontaminate: {action: remove}}` adds a `contamination` stage (this module's
//! [`Contamination`]) that writes the n-grams of every test document of the recipe's tasks
//! (each request's context and continuation, and the target, with no few-shot examples), and
//! has every ingest stage read it: a document with one of those n-grams is counted per task it
//! overlaps and, with `action: remove`, dropped (rule `decontaminate`). With `action: flag` it
//! is kept and its id listed in the ingest's `contaminated.json`. The report tabulates both.
//!
//! Text is compared as lm-evaluation-harness's decontamination compares it: lowercased, every
//! character that is not a letter or digit a separator, so n-grams are of words.
//! N-grams are hashed to 64 bits (a polynomial over FNV-1a word hashes, rolled one word at a
//! time); two different n-grams share a hash with probability ~2^-64 per pair.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};
use zflow_evals::TaskRegistry;
use zflow_evals::request::{PreparedTask, Request};
use zflow_pipeline::{ConfigError, Stage, StageContext};

/// The `contamination` stage kind: the n-grams of the eval tasks' test documents.
pub struct Contamination;

/// `contamination` settings (the recipe's `evals:` section sets them).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ContaminationConfig {
    /// Task or group names, as `evals.tasks`.
    pub tasks: Vec<String>,
    /// Data prefix -> the fetch stage holding it, as the eval stages have them.
    #[serde(default)]
    pub data: BTreeMap<String, String>,
    /// A folder of task files besides the built-in ones (relative to where zflow runs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tasks_dir: Option<String>,
    /// Words per n-gram.
    #[serde(default = "default_ngram")]
    pub ngram: usize,
}

/// What an ingest stage does with a training document that overlaps a test document.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Action {
    /// Drop it (counted under the rule `decontaminate`).
    Remove,
    /// Keep it, and list its id in `contaminated.json`.
    Flag,
}

/// An ingest stage's `decontaminate:` setting.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Decontaminate {
    /// The `contamination` stage it reads (one of its `needs`).
    pub stage: String,
    /// Remove or flag.
    pub action: Action,
}

/// The recipe's `evals.decontaminate:` section.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DecontaminateSpec {
    /// Remove or flag.
    pub action: Action,
    /// Words per n-gram (13, as GPT-3 and lm-evaluation-harness).
    #[serde(default = "default_ngram")]
    pub ngram: usize,
}

fn default_ngram() -> usize {
    13
}

/// The n-gram table a `contamination` stage writes: `ngrams.bin`, (hash: u64, task: u32) pairs,
/// little-endian, sorted, no pair twice.
pub const NGRAMS: &str = "ngrams.bin";
/// Its tasks, in index order: `tasks.json`, `[{"task", "documents", "ngrams", "ngram"}]`.
pub const TASKS: &str = "tasks.json";

/// One task's line of `tasks.json`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct TaskNgrams {
    /// Task name.
    pub task: String,
    /// Test documents read.
    pub documents: u64,
    /// Distinct n-grams of them.
    pub ngrams: u64,
    /// Words per n-gram.
    pub ngram: usize,
}

/// Calls `each` with the hash of every `n`-word n-gram of `text` (normalised as the module docs
/// say), in order. A text of fewer than `n` words has none.
pub fn for_each_ngram(text: &str, n: usize, mut each: impl FnMut(u64)) {
    // h(w_1..w_n) = sum w_i * B^(n-i) (mod 2^64); rolling: h' = (h - w_1 B^(n-1)) B + w_new.
    const B: u64 = 0x100_0000_01b3;
    let top = (1..n).fold(1u64, |p, _| p.wrapping_mul(B));
    let mut window = std::collections::VecDeque::with_capacity(n);
    let mut h = 0u64;
    for word in words(text) {
        if window.len() == n {
            let old: u64 = window.pop_front().expect("full");
            h = h.wrapping_sub(old.wrapping_mul(top));
        }
        h = h.wrapping_mul(B).wrapping_add(word);
        window.push_back(word);
        if window.len() == n {
            each(h);
        }
    }
}

/// FNV-1a hashes of the lowercased words of `text` (runs of letters and digits).
fn words(text: &str) -> impl Iterator<Item = u64> + '_ {
    text.split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .map(|w| {
            let mut h: u64 = 0xcbf2_9ce4_8422_2325;
            for c in w.chars().flat_map(char::to_lowercase) {
                let mut buf = [0u8; 4];
                for b in c.encode_utf8(&mut buf).bytes() {
                    h ^= u64::from(b);
                    h = h.wrapping_mul(0x100_0000_01b3);
                }
            }
            h
        })
}

/// The test n-grams an ingest stage checks documents against.
pub struct NgramSet {
    /// Words per n-gram.
    pub ngram: usize,
    /// Task names, by index.
    pub tasks: Vec<String>,
    by_hash: HashMap<u64, Vec<u32>>,
}

impl NgramSet {
    /// Reads a `contamination` stage's output folder.
    pub fn load(dir: &Path) -> Result<NgramSet> {
        let tasks: Vec<TaskNgrams> = serde_json::from_slice(
            &std::fs::read(dir.join(TASKS)).with_context(|| format!("reading {TASKS}"))?,
        )?;
        let bytes = std::fs::read(dir.join(NGRAMS)).with_context(|| format!("reading {NGRAMS}"))?;
        if bytes.len() % 12 != 0 {
            bail!("{}: not a whole number of 12-byte records", NGRAMS);
        }
        let mut by_hash: HashMap<u64, Vec<u32>> = HashMap::with_capacity(bytes.len() / 12);
        for rec in bytes.chunks_exact(12) {
            let hash = u64::from_le_bytes(rec[..8].try_into().expect("8 bytes"));
            let task = u32::from_le_bytes(rec[8..].try_into().expect("4 bytes"));
            by_hash.entry(hash).or_default().push(task);
        }
        Ok(NgramSet {
            ngram: tasks.first().map_or(default_ngram(), |t| t.ngram),
            tasks: tasks.into_iter().map(|t| t.task).collect(),
            by_hash,
        })
    }

    /// The tasks (indices, ascending) one of whose test documents shares an n-gram with `text`.
    pub fn overlaps(&self, text: &str) -> Vec<u32> {
        let mut hit = Vec::new();
        for_each_ngram(text, self.ngram, |h| {
            if let Some(tasks) = self.by_hash.get(&h) {
                hit.extend_from_slice(tasks);
            }
        });
        hit.sort_unstable();
        hit.dedup();
        hit
    }
}

/// Every string of a test document's requests, and its target.
fn document_texts(inst: &zflow_evals::request::Instance) -> Vec<&str> {
    let mut out = vec![inst.target.as_str()];
    for r in &inst.requests {
        match r {
            Request::Loglikelihood {
                context,
                continuation,
            } => out.extend([context.as_str(), continuation.as_str()]),
            Request::Rolling { text } => out.push(text),
            Request::Generate { context, .. } => out.push(context),
        }
    }
    out
}

impl Stage for Contamination {
    type Config = ContaminationConfig;
    const KIND: &'static str = "contamination";
    const VERSION: u32 = 1;

    fn validate(&self, c: &ContaminationConfig, needs: &[String]) -> Result<(), ConfigError> {
        if c.tasks.is_empty() {
            return Err(ConfigError::new(
                "tasks",
                "no tasks to decontaminate against",
            ));
        }
        if !(4..=64).contains(&c.ngram) {
            return Err(ConfigError::new(
                "ngram",
                format!(
                    "{} words per n-gram: expected 4 to 64 (13 is usual)",
                    c.ngram
                ),
            ));
        }
        if let Some(stage) = c.data.values().find(|s| !needs.contains(s)) {
            return Err(ConfigError::new(
                "needs",
                format!("data stage `{stage}` must be among the stage's needs"),
            ));
        }
        Ok(())
    }

    fn run(&self, c: &ContaminationConfig, ctx: &StageContext) -> Result<()> {
        let dir = crate::eval::tasks_dir(c.tasks_dir.as_deref(), ctx.cwd());
        let registry = TaskRegistry::load_dir(&dir)?;
        let data_root = crate::eval::link_data_root(ctx, &c.data)?;
        let mut names: Vec<String> = Vec::new();
        for n in &c.tasks {
            for t in registry.tasks_of(n)? {
                if !names.contains(&t) {
                    names.push(t);
                }
            }
        }
        ctx.progress().set_length(names.len() as u64);
        let mut pairs: Vec<(u64, u32)> = Vec::new();
        let mut table = Vec::new();
        for (index, name) in names.iter().enumerate() {
            ctx.check_cancelled()?;
            ctx.progress().set_message(name.clone());
            let task = PreparedTask::prepare(&registry.tasks[name], data_root.path(), Some(0))?;
            let instances = task.instances(None)?;
            let start = pairs.len();
            for inst in &instances {
                for text in document_texts(inst) {
                    for_each_ngram(text, c.ngram, |h| pairs.push((h, index as u32)));
                }
            }
            pairs[start..].sort_unstable();
            let mut task_pairs = pairs.split_off(start);
            task_pairs.dedup();
            table.push(TaskNgrams {
                task: name.clone(),
                documents: instances.len() as u64,
                ngrams: task_pairs.len() as u64,
                ngram: c.ngram,
            });
            pairs.extend(task_pairs);
            ctx.progress().inc(1);
        }
        pairs.sort_unstable();
        let mut bytes = Vec::with_capacity(pairs.len() * 12);
        for (h, t) in &pairs {
            bytes.extend(h.to_le_bytes());
            bytes.extend(t.to_le_bytes());
        }
        std::fs::write(ctx.out_dir().join(NGRAMS), bytes)?;
        std::fs::write(
            ctx.out_dir().join(TASKS),
            serde_json::to_vec_pretty(&table)?,
        )?;
        tracing::info!(
            "{} distinct {}-grams of {} tasks' test documents",
            pairs.len(),
            c.ngram,
            names.len()
        );
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grams(text: &str, n: usize) -> Vec<u64> {
        let mut v = Vec::new();
        for_each_ngram(text, n, |h| v.push(h));
        v
    }

    #[test]
    fn ngrams_ignore_case_and_punctuation_and_roll_like_a_fresh_hash() {
        let a = grams("The quick brown fox jumps over the lazy dog.", 4);
        assert_eq!(a.len(), 6);
        assert_eq!(
            a,
            grams("the QUICK, brown -- fox jumps; over the lazy DOG", 4)
        );
        // Each rolled hash equals the hash of its window computed from scratch.
        let words = [
            "the", "quick", "brown", "fox", "jumps", "over", "the", "lazy", "dog",
        ];
        for (i, h) in a.iter().enumerate() {
            assert_eq!(*h, grams(&words[i..i + 4].join(" "), 4)[0]);
        }
        assert!(grams("too few words here", 13).is_empty());
        assert_ne!(grams("a b c d", 4), grams("a b c e", 4));
    }

    #[test]
    fn a_training_document_overlaps_the_tasks_whose_text_it_quotes() {
        let dir = tempfile::tempdir().unwrap();
        let test_doc = "Which of these would let the most heat travel through? A new pair of \
                        jeans, a steel spoon in a cafeteria, a cotton candy at a store";
        let mut pairs: Vec<(u64, u32)> = Vec::new();
        for_each_ngram(test_doc, 13, |h| pairs.push((h, 1)));
        pairs.sort_unstable();
        let bytes: Vec<u8> = pairs
            .iter()
            .flat_map(|(h, t)| h.to_le_bytes().into_iter().chain(t.to_le_bytes()))
            .collect();
        std::fs::write(dir.path().join(NGRAMS), bytes).unwrap();
        let tasks = ["piqa", "arc_easy"].map(|t| TaskNgrams {
            task: t.into(),
            documents: 1,
            ngrams: 0,
            ngram: 13,
        });
        std::fs::write(dir.path().join(TASKS), serde_json::to_vec(&tasks).unwrap()).unwrap();
        let set = NgramSet::load(dir.path()).unwrap();
        let quoting = "Exam prep. which of these would LET the most heat travel through: a new \
                       pair of jeans, a steel spoon... and more.";
        assert_eq!(set.overlaps(quoting), vec![1]);
        assert!(
            set.overlaps("Heat travels through a steel spoon faster than through jeans.")
                .is_empty()
        );
    }
}
