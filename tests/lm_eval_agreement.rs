//! zflow's harness agrees with lm-evaluation-harness (0.4.13, from PyPI, hash-pinned:
//! `scripts/lm-eval/`) document by document, on the same model and the same local documents:
//! a tiny random ZAYA1 saved by transformers (`scripts/lm-eval/tiny_zaya.py`), scored by
//! lm-eval's `hf` backend and by `zflow eval` (transformers through zflow's scorer), on the
//! first 2 documents of gsm8k_cot, minerva_math_algebra, humaneval, mbpp (generation, answer
//! extraction, code run in each one's sandbox) and arc_easy, boolq (log-likelihoods). Every
//! generation is capped at 256 tokens on both sides (`--gen_kwargs max_gen_toks=256`,
//! `--max-gen-toks 256`): the random model never says a stop sequence, and HumanEval's own
//! 1,024 tokens a document took most of the test's time; the others' cap is 256 already.
//! `scripts/lm-eval/compare.py` checks the prompts, log-likelihoods (1e-4 relative), generated
//! texts, extracted answers and per-document metrics.
//!
//! The second test does the same on a real model: Gemma 3 270M, the GGUF of the Gemma tests
//! dequantized to float32 by transformers' own GGUF loader (`scripts/lm-eval/gemma_hf.py`), on
//! mbpp (real generations that end at a stop sequence, then run), arc_easy and boolq, where
//! contexts start with the tokenizer's `<bos>`. On the CPU a real model's few-shot prompts (up
//! to 1,800 tokens) and generations take each side ~2 min of a core for all six tasks, so it
//! scores three; all six agreed on 2 documents each when run by hand (`scripts/lm-eval/run.sh`
//! and `zflow eval` on the folder, then `compare.py`).

mod common;

use std::path::Path;
use std::process::Command;

const TASKS: [&str; 6] = [
    "gsm8k_cot",
    "minerva_math_algebra",
    "humaneval",
    "mbpp",
    "arc_easy",
    "boolq",
];
/// Tokens per generation on both sides.
const MAX_GEN_TOKS: usize = 256;

fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{cmd:?} failed:\n{text}");
    text
}

/// Scores `tasks` (zflow's names) on the first `limit` documents with lm-eval's hf backend and
/// with `zflow eval`, both on the Hugging Face folder `model` with its `tokenizer.json`, and
/// returns what `scripts/lm-eval/compare.py` says, having checked it says every task agrees.
fn agree(sb: &common::Sandbox, model: &Path, eos: &str, tasks: &[&str], limit: usize) -> String {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    // lm-eval: every task in one process, 8 requests per batch (its left-padded batches
    // give each request what it gets alone, as zflow's do).
    let lm_eval_tasks: Vec<String> = tasks.iter().map(|t| format!("{t}_local")).collect();
    run(Command::new("bash")
        .arg(repo.join("scripts/lm-eval/run.sh"))
        .arg(model)
        .arg(sb.path().join("lm-eval"))
        .arg(limit.to_string())
        .env("TASKS", lm_eval_tasks.join(" "))
        .env("TOGETHER", "1")
        .env("GEN_KWARGS", format!("max_gen_toks={MAX_GEN_TOKS}"))
        .env("BATCH_SIZE", "8"));

    let tokenizer = model.join("tokenizer.json");
    let data = zflow_evals::evaluate::test_data_root();
    sb.ok(&[
        "eval",
        "--model",
        model.to_str().unwrap(),
        "--tokenizer",
        tokenizer.to_str().unwrap(),
        "--eos",
        eos,
        "--tasks",
        &tasks.join(","),
        "--limit",
        &limit.to_string(),
        "--max-gen-toks",
        &MAX_GEN_TOKS.to_string(),
        "--data",
        data.to_str().unwrap(),
        "--log-samples",
        "--out",
        "zflow.json",
    ]);

    let results: serde_json::Value = serde_json::from_str(&sb.read("zflow.json")).unwrap();
    assert_eq!(
        results["max_gen_toks"], MAX_GEN_TOKS,
        "the results name the cap"
    );

    let report = run(Command::new("python3")
        .arg(repo.join("scripts/lm-eval/compare.py"))
        .arg(sb.path().join("zflow.json"))
        .arg(sb.path().join("lm-eval")));
    eprintln!("{report}");
    assert_eq!(
        report
            .matches(&format!("{limit} documents compared, agree"))
            .count(),
        tasks.len(),
        "{report}"
    );
    report
}

#[test]
#[cfg_attr(
    not(all(zflow_torch, zflow_eval_fixtures)),
    ignore = "needs the torch engine's Python and the benchmark data: scripts/test.sh sets both up"
)]
fn zflow_agrees_with_lm_eval_per_document() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let sb = common::Sandbox::new();
    let model = sb.path().join("tiny-zaya");
    let python = zflow_stages::engine::torch_python().unwrap();
    run(Command::new(&python)
        .arg(repo.join("scripts/lm-eval/tiny_zaya.py"))
        .arg(&model));
    agree(&sb, &model, "<|endoftext|>", &TASKS, 2);
}

#[test]
#[cfg_attr(
    not(all(zflow_torch, zflow_eval_fixtures)),
    ignore = "needs the torch engine's Python, Gemma 3 270M and the benchmark data: scripts/test.sh sets them up"
)]
fn zflow_agrees_with_lm_eval_on_gemma3_270m() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let fixture = |var: &str| {
        std::env::var_os(var).unwrap_or_else(|| {
            panic!("{var} is not set: `eval \"$(scripts/fixtures.sh)\"` sets it")
        })
    };
    // Made once per GGUF (the script checks its stamp), beside the other fixtures.
    let model = repo.join("target/test-fixtures/gemma3-270m-hf");
    let lm_eval_python = repo.join("target/lm-eval-venv/bin/python");
    run(Command::new("bash").arg(repo.join("scripts/lm-eval/setup.sh")));
    run(Command::new(&lm_eval_python)
        .arg(repo.join("scripts/lm-eval/gemma_hf.py"))
        .arg(fixture("ZFLOW_EVAL_GGUF"))
        .arg(fixture("ZFLOW_EVAL_TOKENIZER"))
        .arg(&model)
        .env("HF_HUB_OFFLINE", "1"));
    let sb = common::Sandbox::new();
    agree(&sb, &model, "<eos>", &["mbpp", "arc_easy", "boolq"], 2);
}
