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

mod common;

use std::path::Path;
use std::process::Command;

const TASKS: &str = "gsm8k_cot,minerva_math_algebra,humaneval,mbpp,arc_easy,boolq";
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

    // lm-eval: every task in one process, 8 requests per batch (its left-padded batches
    // give each request what it gets alone, as zflow's do).
    let lm_eval_tasks: Vec<String> = TASKS.split(',').map(|t| format!("{t}_local")).collect();
    run(Command::new("bash")
        .arg(repo.join("scripts/lm-eval/run.sh"))
        .arg(&model)
        .arg(sb.path().join("lm-eval"))
        .arg("2")
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
        "<|endoftext|>",
        "--tasks",
        TASKS,
        "--limit",
        "2",
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
        report.matches("2 documents compared, agree").count(),
        6,
        "{report}"
    );
}
