//! Per-document scores, their aggregates, and a standard error for every aggregate.
//!
//! - Means (`acc`, `acc_norm`, `exact_match`): the sample standard error of the mean,
//!   `sqrt(var / n)` with `ddof = 1` (lm-eval's `mean_stderr`).
//! - `perplexity` = `exp(-mean ll)`: delta method, `ppl * stderr(ll)`.
//! - Ratios (`bits_per_byte` = `-sum ll / sum bytes / ln 2`, `word_perplexity`,
//!   `byte_perplexity`): the ratio estimator's delta-method stderr,
//!   `sqrt(var(a - R b) / n) / mean(b)` (lm-eval bootstraps these instead; the analytic form
//!   is deterministic and agrees to the precision anyone reads).
//! - Groups weighted by size (mmlu): the size-weighted mean and lm-eval's pooled stderr.

use std::collections::BTreeMap;

use anyhow::{Context, Result, bail};

use crate::cache::Cached;
use crate::filters::{Extractor, Normalizer};
use crate::request::Instance;
use crate::task::{Metric, OutputType, TaskSpec};

/// One aggregate.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct MetricValue {
    /// `acc`, `acc_norm`, or `exact_match,<filter>`.
    pub metric: String,
    /// The value.
    pub value: f64,
    /// Its standard error (`None` with fewer than two documents).
    pub stderr: Option<f64>,
}

/// Mean and sample stderr of the mean (ddof = 1).
pub fn mean_stderr(xs: &[f64]) -> (f64, Option<f64>) {
    let n = xs.len() as f64;
    if xs.is_empty() {
        return (f64::NAN, None);
    }
    let mean = xs.iter().sum::<f64>() / n;
    if xs.len() < 2 {
        return (mean, None);
    }
    let var = xs.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / (n - 1.0);
    (mean, Some((var / n).sqrt()))
}

/// `sum a / sum b` and its delta-method stderr.
pub fn ratio_stderr(a: &[f64], b: &[f64]) -> (f64, Option<f64>) {
    let n = a.len() as f64;
    let (sa, sb) = (a.iter().sum::<f64>(), b.iter().sum::<f64>());
    let r = sa / sb;
    if a.len() < 2 {
        return (r, None);
    }
    let resid: Vec<f64> = a.iter().zip(b).map(|(x, y)| x - r * y).collect();
    let (_, se) = mean_stderr(&resid);
    (r, se.map(|se| se / (sb / n)))
}

/// lm-eval's `pooled_sample_stderr`: the stderr of the mean over all members' documents.
pub fn pooled_stderr(stderrs: &[f64], sizes: &[usize]) -> f64 {
    let n: usize = sizes.iter().sum();
    let var = sizes
        .iter()
        .zip(stderrs)
        .map(|(&s, se)| (s as f64 - 1.0) * se * se * s as f64)
        .sum::<f64>()
        / (n as f64 - sizes.len() as f64);
    (var / n as f64).sqrt()
}

fn argmax(xs: impl Iterator<Item = f64>) -> usize {
    // The first of equal maxima, as numpy's argmax.
    let mut best = (0, f64::NEG_INFINITY);
    for (i, x) in xs.enumerate() {
        if x > best.1 {
            best = (i, x);
        }
    }
    best.0
}

fn score_of(c: &Cached) -> Result<crate::model::Score> {
    match c {
        Cached::Score(s) => Ok(*s),
        Cached::Text { .. } => bail!("expected a loglikelihood, found a generation in the cache"),
    }
}

/// What the harness keeps per document for the results' samples (`--log-samples`): what
/// lm-eval's samples hold, so a person (or a comparison with lm-eval) reads each document's
/// exact prompts and the model's raw answers.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct DocScores {
    /// Document index.
    pub doc: usize,
    /// The reference: the gold choice, the scored text, the target answer, or a code task's
    /// tests.
    pub target: String,
    /// Each request as sent (the exact prompt) with the model's raw response.
    pub requests: Vec<SampleRequest>,
    /// Metric name -> per-document value (`acc`: 0/1, `perplexity`: the loglikelihood, ...).
    pub values: BTreeMap<String, f64>,
    /// Generation tasks: the filtered answers by filter name.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub answers: BTreeMap<String, String>,
    /// Code tasks: how the program ran in the sandbox.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub run: Option<crate::sandbox::Run>,
}

/// One request of a sample and its raw response.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum SampleRequest {
    /// A (context, continuation) pair and its score.
    Loglikelihood {
        /// The prompt, few-shot examples included.
        context: String,
        /// The scored text.
        continuation: String,
        /// Its log-likelihood.
        logprob: f64,
        /// Whether every token of it was the model's greedy choice.
        is_greedy: bool,
    },
    /// A whole text scored in windows.
    Rolling {
        /// The text.
        text: String,
        /// Its log-likelihood.
        logprob: f64,
    },
    /// A generation.
    Generate {
        /// The prompt, few-shot examples included.
        context: String,
        /// The stop sequences.
        until: Vec<String>,
        /// The token limit.
        max_gen_toks: usize,
        /// The generated text, cut before the first stop sequence.
        text: String,
    },
}

fn sample_requests(inst: &Instance, res: &[Cached]) -> Vec<SampleRequest> {
    use crate::request::Request;
    inst.requests
        .iter()
        .zip(res)
        .map(|(req, c)| match (req, c) {
            (
                Request::Loglikelihood {
                    context,
                    continuation,
                },
                Cached::Score(s),
            ) => SampleRequest::Loglikelihood {
                context: context.clone(),
                continuation: continuation.clone(),
                logprob: s.logprob,
                is_greedy: s.is_greedy,
            },
            (Request::Rolling { text }, Cached::Score(s)) => SampleRequest::Rolling {
                text: text.clone(),
                logprob: s.logprob,
            },
            (
                Request::Generate {
                    context,
                    until,
                    max_gen_toks,
                },
                Cached::Text { text },
            ) => SampleRequest::Generate {
                context: context.clone(),
                until: until.clone(),
                max_gen_toks: *max_gen_toks,
                text: text.clone(),
            },
            _ => unreachable!("results have their requests' kinds (checked by scoring)"),
        })
        .collect()
}

/// The task's answer extraction pipelines, compiled.
fn extractors(spec: &TaskSpec) -> Result<Vec<Extractor>> {
    spec.filters.iter().map(Extractor::new).collect()
}

/// A code task's program for one generation: the answer is the generation after the task's
/// first filter, if it has one.
fn program_of(extractors: &[Extractor], inst: &Instance, text: &str) -> String {
    let answer = extractors
        .first()
        .map_or_else(|| text.to_string(), |e| e.apply(text));
    inst.program(&answer)
}

/// Code tasks: each document's program ([`program_of`]), to be run in [`crate::sandbox`].
pub fn programs(
    spec: &TaskSpec,
    instances: &[Instance],
    results: &[Vec<Cached>],
) -> Result<Vec<String>> {
    let extractors = extractors(spec)?;
    instances
        .iter()
        .zip(results)
        .map(|(inst, res)| {
            let Some(Cached::Text { text }) = res.first() else {
                bail!("expected a generation in the cache")
            };
            Ok(program_of(&extractors, inst, text))
        })
        .collect()
}

/// Tasks with an `exact_match.equivalence`: every (answer, reference) pair, both normalised,
/// that differs as text, for that equivalence to judge (each pair once, in document order).
pub fn equivalence_candidates(
    spec: &TaskSpec,
    instances: &[Instance],
    results: &[Vec<Cached>],
) -> Result<Vec<(String, String)>> {
    let extractors = extractors(spec)?;
    let normalizer = Normalizer::new(&spec.exact_match)?;
    let mut seen = std::collections::HashSet::new();
    let mut pairs = Vec::new();
    for (inst, res) in instances.iter().zip(results) {
        let Some(Cached::Text { text }) = res.first() else {
            continue;
        };
        let answers: Vec<String> = if extractors.is_empty() {
            vec![text.clone()]
        } else {
            extractors.iter().map(|e| e.apply(text)).collect()
        };
        for a in answers {
            let pair = (normalizer.apply(&a), normalizer.apply(&inst.target));
            if pair.0 != pair.1 && seen.insert(pair.clone()) {
                pairs.push(pair);
            }
        }
    }
    Ok(pairs)
}

/// `math_verify` tasks: every instance's (gold, raw generation) pair, in instance order, for
/// math-verify to judge.
pub fn math_verify_pairs(
    instances: &[Instance],
    results: &[Vec<Cached>],
) -> Result<Vec<(String, String)>> {
    instances
        .iter()
        .zip(results)
        .map(|(inst, res)| {
            let (Some(gold), Some(Cached::Text { text })) = (&inst.math_verify_gold, res.first())
            else {
                bail!("a math_verify task is scored with one gold text and one generation")
            };
            Ok((gold.clone(), text.clone()))
        })
        .collect()
}

/// What was judged outside the harness, by programs the task names, before scoring.
#[derive(Debug, Clone, Default)]
pub struct Judgments {
    /// Code tasks: each instance's program run ([`programs`], in [`crate::sandbox`]).
    pub runs: Option<Vec<crate::sandbox::Run>>,
    /// The (answer, reference) pairs, both normalised, that `exact_match.equivalence` judged
    /// equal ([`equivalence_candidates`]).
    pub equivalent: std::collections::HashSet<(String, String)>,
    /// `math_verify` tasks: each instance's verdict ([`math_verify_pairs`]).
    pub verified: Option<Vec<bool>>,
}

/// Scores every document and aggregates, in the order of `spec.metrics` (then filters), with
/// what `judged` holds for the metrics that need it.
pub fn compute(
    spec: &TaskSpec,
    instances: &[Instance],
    results: &[Vec<Cached>],
    judged: &Judgments,
) -> Result<(Vec<MetricValue>, Vec<DocScores>)> {
    let per_instance = |v: Option<usize>| v == Some(instances.len());
    if spec.code_eval.is_some() && !per_instance(judged.runs.as_ref().map(Vec::len)) {
        bail!("a code task is scored with one program run per document");
    }
    if spec.math_verify.is_some() && !per_instance(judged.verified.as_ref().map(Vec::len)) {
        bail!("a math_verify task is scored with one verdict per document");
    }
    let equivalent = &judged.equivalent;
    let mut docs = Vec::with_capacity(instances.len());
    // Per metric name: per-document values, and for ratios the denominators.
    let mut cols: BTreeMap<String, (Vec<f64>, Vec<f64>)> = BTreeMap::new();
    let extractors = extractors(spec)?;
    let normalizer = Normalizer::new(&spec.exact_match)?;
    for (k, (inst, res)) in instances.iter().zip(results).enumerate() {
        let run = judged.runs.as_ref().map(|r| r[k].clone());
        let mut values = BTreeMap::new();
        let mut answers = BTreeMap::new();
        let mut push = |name: &str, v: f64, d: f64, values: &mut BTreeMap<String, f64>| {
            let e = cols.entry(name.to_string()).or_default();
            e.0.push(v);
            e.1.push(d);
            values.insert(name.to_string(), v);
        };
        match spec.output_type {
            OutputType::MultipleChoice => {
                let lls: Vec<f64> = res
                    .iter()
                    .map(|c| score_of(c).map(|s| s.logprob))
                    .collect::<Result<_>>()?;
                let gold = inst
                    .gold
                    .context("a multiple-choice instance without gold")?;
                for m in &spec.metrics {
                    let pred = match m {
                        Metric::Acc => argmax(lls.iter().copied()),
                        // lm-eval: len() of the Python str, i.e. characters.
                        Metric::AccNorm => argmax(
                            lls.iter()
                                .zip(&inst.choices)
                                .map(|(l, c)| l / c.chars().count() as f64),
                        ),
                        _ => unreachable!("validated"),
                    };
                    push(
                        m.name(),
                        f64::from(u8::from(pred == gold)),
                        1.0,
                        &mut values,
                    );
                }
            }
            OutputType::Loglikelihood | OutputType::LoglikelihoodRolling => {
                let s = score_of(&res[0])?;
                let bytes = inst.target.len() as f64;
                let words = inst.target.split_whitespace().count() as f64;
                for m in &spec.metrics {
                    match m {
                        Metric::Acc => {
                            push("acc", f64::from(u8::from(s.is_greedy)), 1.0, &mut values)
                        }
                        Metric::Perplexity => push("perplexity", s.logprob, 1.0, &mut values),
                        Metric::BitsPerByte => push(
                            "bits_per_byte",
                            -s.logprob / std::f64::consts::LN_2,
                            bytes,
                            &mut values,
                        ),
                        Metric::BytePerplexity => {
                            push("byte_perplexity", -s.logprob, bytes, &mut values)
                        }
                        Metric::WordPerplexity => {
                            push("word_perplexity", -s.logprob, words, &mut values)
                        }
                        _ => unreachable!("validated"),
                    }
                }
            }
            OutputType::GenerateUntil => {
                let Cached::Text { text } = &res[0] else {
                    bail!("expected a generation in the cache")
                };
                if let Some(run) = &run {
                    let passed = f64::from(u8::from(run.outcome.passed()));
                    push(Metric::PassAt1.name(), passed, 1.0, &mut values);
                    answers.insert("program".to_string(), program_of(&extractors, inst, text));
                }
                if let Some(verified) = &judged.verified {
                    let v = f64::from(u8::from(verified[k]));
                    push(Metric::MathVerify.name(), v, 1.0, &mut values);
                }
                // A code task's filters shape its program, not an exact match.
                if spec.metrics.contains(&Metric::ExactMatch) {
                    if extractors.is_empty() {
                        push(
                            "exact_match",
                            normalizer.score(text, &inst.target, equivalent),
                            1.0,
                            &mut values,
                        );
                    }
                    for ex in &extractors {
                        let answer = ex.apply(text);
                        push(
                            &format!("exact_match,{}", ex.name),
                            normalizer.score(&answer, &inst.target, equivalent),
                            1.0,
                            &mut values,
                        );
                        answers.insert(ex.name.clone(), answer);
                    }
                }
            }
        }
        docs.push(DocScores {
            doc: inst.doc_index,
            target: inst.target.clone(),
            requests: sample_requests(inst, res),
            values,
            answers,
            run,
        });
    }
    // Aggregate in the spec's metric order (then filter order), not name order.
    let mut names: Vec<String> = Vec::new();
    for m in &spec.metrics {
        if *m == Metric::ExactMatch && !extractors.is_empty() {
            names.extend(extractors.iter().map(|e| format!("exact_match,{}", e.name)));
        } else {
            names.push(m.name().to_string());
        }
    }
    let mut out = Vec::new();
    for name in names {
        let Some((v, d)) = cols.get(&name) else {
            continue;
        };
        let (value, stderr) = match name.as_str() {
            "perplexity" => {
                let (m, se) = mean_stderr(v);
                let ppl = (-m).exp();
                (ppl, se.map(|se| ppl * se))
            }
            "bits_per_byte" => ratio_stderr(v, d),
            "byte_perplexity" | "word_perplexity" => {
                let (r, se) = ratio_stderr(v, d);
                (r.exp(), se.map(|se| r.exp() * se))
            }
            _ => mean_stderr(v),
        };
        out.push(MetricValue {
            metric: name,
            value,
            stderr,
        });
    }
    Ok((out, docs))
}

/// Combines members' aggregates: size-weighted mean with pooled stderr, or a plain mean.
pub fn aggregate(values: &[(f64, Option<f64>, usize)], weight_by_size: bool) -> (f64, Option<f64>) {
    if weight_by_size {
        let n: usize = values.iter().map(|v| v.2).sum();
        let mean = values.iter().map(|v| v.0 * v.2 as f64).sum::<f64>() / n as f64;
        let se = values.iter().all(|v| v.1.is_some()).then(|| {
            let ses: Vec<f64> = values.iter().map(|v| v.1.unwrap_or_default()).collect();
            let sizes: Vec<usize> = values.iter().map(|v| v.2).collect();
            pooled_stderr(&ses, &sizes)
        });
        (mean, se)
    } else {
        let k = values.len() as f64;
        let mean = values.iter().map(|v| v.0).sum::<f64>() / k;
        let se = values.iter().all(|v| v.1.is_some()).then(|| {
            values
                .iter()
                .map(|v| v.1.unwrap_or_default().powi(2))
                .sum::<f64>()
                .sqrt()
                / k
        });
        (mean, se)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Score;

    #[test]
    fn stderr_of_the_mean_uses_ddof_1() {
        let (m, se) = mean_stderr(&[1.0, 0.0, 1.0, 1.0]);
        assert_eq!(m, 0.75);
        // var (ddof=1) = 0.25, /4 -> sqrt(0.0625) = 0.25
        assert!((se.unwrap() - 0.25).abs() < 1e-15);
        assert_eq!(mean_stderr(&[1.0]).1, None);
    }

    #[test]
    fn pooled_stderr_equals_stderr_of_the_concatenation() {
        let a = [1.0, 0.0, 1.0, 1.0, 0.0];
        let b = [0.0, 0.0, 1.0];
        let all: Vec<f64> = a.iter().chain(&b).copied().collect();
        let (ma, sa) = mean_stderr(&a);
        let (mb, sb) = mean_stderr(&b);
        let (m, s) = aggregate(&[(ma, sa, 5), (mb, sb, 3)], true);
        let (m_all, s_all) = mean_stderr(&all);
        assert!((m - m_all).abs() < 1e-12);
        // lm-eval's pooled formula ignores the between-group variance, so it is close, not equal.
        assert!(
            (s.unwrap() - s_all.unwrap()).abs() < 0.02,
            "{s:?} vs {s_all:?}"
        );
    }

    #[test]
    fn multiple_choice_acc_and_acc_norm() {
        let spec: TaskSpec = serde_json::from_value(serde_json::json!({
            "task": "t", "version": 1, "dataset": {"format": "jsonl", "path": "x"}, "split": "s",
            "output_type": "multiple_choice", "doc_to_text": "q", "doc_to_target": "g", "doc_to_choice": "c",
            "metrics": ["acc", "acc_norm"]})).unwrap();
        let inst = |gold| Instance {
            doc_index: 0,
            requests: vec![],
            choices: vec!["ab".into(), "abcdef".into()],
            gold: Some(gold),
            target: String::new(),
            program_prefix: None,
            math_verify_gold: None,
        };
        let sc = |l| {
            Cached::Score(Score {
                logprob: l,
                is_greedy: false,
            })
        };
        // Raw: choice 0 wins (-2 > -3); per character: -1 vs -0.5, choice 1 wins.
        let (vals, docs) = compute(
            &spec,
            &[inst(0), inst(1)],
            &[vec![sc(-2.0), sc(-3.0)], vec![sc(-2.0), sc(-3.0)]],
            &Judgments::default(),
        )
        .unwrap();
        assert_eq!(vals[0].metric, "acc");
        assert_eq!(vals[0].value, 0.5);
        assert_eq!(vals[1].metric, "acc_norm");
        assert_eq!(vals[1].value, 0.5);
        assert_eq!(docs[0].values["acc"], 1.0);
        assert_eq!(docs[0].values["acc_norm"], 0.0);
    }

    #[test]
    fn bits_per_byte_is_a_ratio_of_sums() {
        let (r, se) = ratio_stderr(&[2.0, 4.0], &[1.0, 2.0]);
        assert_eq!(r, 2.0);
        assert_eq!(se, Some(0.0));
    }
}
