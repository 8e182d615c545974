//! `zflow eval` through the real binary on a real zflow checkpoint (a tiny ZAYA1 trained on
//! this repository's text by the real pipeline): a multiple-choice task written as data, a
//! SIGKILL mid-evaluation, and a rerun that recomputes no scored request and writes
//! byte-identical results.

mod common;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use common::{Sandbox, stage_dir, tiny_train_recipe};

/// A task over `toy/test.jsonl`: which of four lines of this repository's README follows a
/// given line.
fn write_task(sb: &Sandbox) {
    sb.write(
        "tasks/next_line.yaml",
        "task: next_line\nversion: 1\ndataset: {format: jsonl, path: \"toy/{split}.jsonl\"}\nsplit: test\noutput_type: multiple_choice\ndoc_to_text: \"{{ line }}\\n\"\ndoc_to_target: label\ndoc_to_choice: choices\nmetrics: [acc, acc_norm]\n",
    );
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/ARCHITECTURE.md")).unwrap();
    let lines: Vec<&str> = text.lines().map(str::trim).filter(|l| l.len() > 20).collect();
    let mut rows = String::new();
    for i in 0..lines.len().min(400) - 1 {
        let label = i % 4;
        let mut choices: Vec<&str> = (1..4).map(|k| lines[(i * 7 + k * 37) % lines.len()]).collect();
        choices.insert(label, lines[i + 1]);
        rows.push_str(&serde_json::json!({"line": lines[i], "choices": choices, "label": label}).to_string());
        rows.push('\n');
    }
    sb.write("data/toy/test.jsonl", &rows);
}

fn eval_args(sb: &Sandbox, cache: &str, out: &str) -> Vec<String> {
    let store = sb.path().join("zflow-store");
    let model = stage_dir(&store, "train.p1").join("final");
    let tokenizer = stage_dir(&store, "tokenizer").join("tokenizer.json");
    let p = |x: &Path| x.display().to_string();
    ["eval", "--model", &p(&model), "--tokenizer", &p(&tokenizer), "--tasks", "next_line", "--tasks-dir", "tasks", "--data", "data", "--cache", cache, "--max-length", "64", "--out", out]
        .iter()
        .map(|s| s.to_string())
        .collect()
}

#[test]
fn eval_of_a_zflow_checkpoint_resumes_after_sigkill_without_rescoring() {
    let sb = Sandbox::new();
    sb.write("r.yaml", &tiny_train_recipe(1, 3));
    sb.ok(&["run", "r.yaml"]);
    write_task(&sb);

    let args = eval_args(&sb, "cache-a", "a.json");
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let whole = sb.ok(&args);
    assert!(whole.stdout.contains("next_line") && whole.stdout.contains("acc_norm"), "{}", whole.stdout);
    // Identical requests (the same context and choice twice) are scored once and counted as cached.
    let requests = counts(&whole.stderr).0 + counts(&whole.stderr).1;
    assert!(requests > 500, "{}", whole.stderr);

    // The same evaluation, SIGKILLed once part of it is in the cache.
    let args_b = eval_args(&sb, "cache-b", "b.json");
    let args_b: Vec<&str> = args_b.iter().map(String::as_str).collect();
    let mut child = sb.cmd(&args_b).stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap();
    let cache_bytes = || dir_bytes(&sb.path().join("cache-b"));
    let deadline = Instant::now() + Duration::from_secs(120);
    while cache_bytes() < 5_000 {
        assert!(Instant::now() < deadline && child.try_wait().unwrap().is_none(), "the evaluation ended or stalled before it could be killed");
        std::thread::sleep(Duration::from_millis(5));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    let rerun = sb.ok(&args_b);
    let (scored, cached) = counts(&rerun.stderr);
    assert!(cached > 0 && scored < requests && cached + scored == requests, "cached {cached} + scored {scored} != {requests}:\n{}", rerun.stderr);
    assert_eq!(sb.read("a.json"), sb.read("b.json"), "the resumed evaluation's results differ");

    // A model path that is not a model: named.
    let bad = sb.zflow(&["eval", "--model", "r.yaml", "--tasks", "next_line", "--tasks-dir", "tasks", "--data", "data"]);
    assert!(bad.code != 0 && bad.stderr.contains("r.yaml"), "{}", bad.stderr);
}

fn dir_bytes(dir: &PathBuf) -> u64 {
    std::fs::read_dir(dir).into_iter().flatten().flatten().filter_map(|e| e.metadata().ok()).map(|m| m.len()).sum()
}

/// (requests scored, requests from the cache) from `zflow eval`'s summary line of the task.
fn counts(stderr: &str) -> (usize, usize) {
    let line = stderr.lines().find(|l| l.starts_with("next_line: ")).unwrap_or_else(|| panic!("no summary line:\n{stderr}"));
    let number = |before: &str| line.split(before).next().unwrap().rsplit(' ').next().unwrap().parse::<usize>().unwrap();
    (number(" requests scored"), number(" from the cache"))
}
