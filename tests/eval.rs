//! `zflow eval` through the real binary on a real zflow checkpoint (a tiny ZAYA1 trained on
//! this repository's text by the real pipeline): a multiple-choice task written as data, a
//! SIGKILL mid-evaluation, and a rerun that recomputes no scored request and writes
//! byte-identical results.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use common::{Sandbox, stage_dir, tiny_train_recipe_on};

/// A task over `toy/test.jsonl`: which of four lines of this repository's README follows a
/// given line.
fn write_task(sb: &Sandbox) {
    sb.write(
        "tasks/next_line.yaml",
        "task: next_line\nversion: 1\ndataset: {format: jsonl, path: \"toy/{split}.jsonl\"}\nsplit: test\noutput_type: multiple_choice\ndoc_to_text: \"{{ line }}\\n\"\ndoc_to_target: label\ndoc_to_choice: choices\nmetrics: [acc, acc_norm]\n",
    );
    let text =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/ARCHITECTURE.md")).unwrap();
    let lines: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| l.len() > 20)
        .collect();
    let mut rows = String::new();
    for i in 0..lines.len().min(400) - 1 {
        let label = i % 4;
        let mut choices: Vec<&str> = (1..4)
            .map(|k| lines[(i * 7 + k * 37) % lines.len()])
            .collect();
        choices.insert(label, lines[i + 1]);
        rows.push_str(
            &serde_json::json!({"line": lines[i], "choices": choices, "label": label}).to_string(),
        );
        rows.push('\n');
    }
    sb.write("data/toy/test.jsonl", &rows);
}

/// The line of `md` that starts with `start`.
fn row_of(md: &str, start: &str) -> String {
    md.lines()
        .find(|l| l.starts_with(start))
        .unwrap_or_else(|| panic!("no row {start}:\n{md}"))
        .to_string()
}

fn json_file(path: &std::path::Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

fn eval_args(sb: &Sandbox, cache: &str, out: &str) -> Vec<String> {
    let store = sb.path().join("zflow-store");
    let model = stage_dir(&store, "train.p1").join("final");
    let tokenizer = stage_dir(&store, "tokenizer").join("tokenizer.json");
    let p = |x: &Path| x.display().to_string();
    [
        "eval",
        "--model",
        &p(&model),
        "--tokenizer",
        &p(&tokenizer),
        "--tasks",
        "next_line",
        "--tasks-dir",
        "tasks",
        "--data",
        "data",
        "--cache",
        cache,
        "--max-length",
        "64",
        "--out",
        out,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

#[test]
#[cfg_attr(
    not(zflow_torch),
    ignore = "needs the torch engine's Python: scripts/setup.sh creates it, scripts/test.sh sets ZFLOW_TORCH_PYTHON"
)]
fn eval_of_a_zflow_checkpoint_resumes_after_sigkill_without_rescoring() {
    let sb = Sandbox::new();
    sb.write("r.yaml", &tiny_train_recipe_on("torch", 1, 3));
    sb.ok(&["run", "r.yaml"]);
    write_task(&sb);

    let args = eval_args(&sb, "cache-a", "a.json");
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let whole = sb.ok(&args);
    assert!(
        whole.stdout.contains("next_line") && whole.stdout.contains("acc_norm"),
        "{}",
        whole.stdout
    );
    // Identical requests (the same context and choice twice) are scored once and counted as cached.
    let requests = counts(&whole.stderr).0 + counts(&whole.stderr).1;
    assert!(requests > 500, "{}", whole.stderr);
    // `--out` naming a folder is refused before anything is scored (nothing lost, nothing
    // written into the folder).
    std::fs::create_dir(sb.path().join("a-folder")).unwrap();
    let to_folder = eval_args(&sb, "cache-c", "a-folder");
    let to_folder: Vec<&str> = to_folder.iter().map(String::as_str).collect();
    let refused = sb.zflow(&to_folder);
    assert_eq!(refused.code, 1, "{}", refused.stderr);
    assert!(refused.stderr.contains("a folder"), "{}", refused.stderr);
    assert!(
        !sb.path().join("cache-c").exists(),
        "it scored before refusing"
    );
    assert_eq!(
        std::fs::read_dir(sb.path().join("a-folder"))
            .unwrap()
            .count(),
        0
    );

    // The same evaluation, SIGKILLed once part of it is in the cache.
    let args_b = eval_args(&sb, "cache-b", "b.json");
    let args_b: Vec<&str> = args_b.iter().map(String::as_str).collect();
    let mut child = sb
        .cmd(&args_b)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let cache_bytes = || dir_bytes(&sb.path().join("cache-b"));
    let deadline = Instant::now() + Duration::from_secs(120);
    while cache_bytes() < 5_000 {
        assert!(
            Instant::now() < deadline && child.try_wait().unwrap().is_none(),
            "the evaluation ended or stalled before it could be killed"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    let rerun = sb.ok(&args_b);
    let (scored, cached) = counts(&rerun.stderr);
    assert!(
        cached > 0 && scored < requests && cached + scored == requests,
        "cached {cached} + scored {scored} != {requests}:\n{}",
        rerun.stderr
    );
    assert_eq!(
        sb.read("a.json"),
        sb.read("b.json"),
        "the resumed evaluation's results differ"
    );

    // A model path that is not a model: named.
    let bad = sb.zflow(&[
        "eval",
        "--model",
        "r.yaml",
        "--tasks",
        "next_line",
        "--tasks-dir",
        "tasks",
        "--data",
        "data",
    ]);
    assert!(
        bad.code != 0 && bad.stderr.contains("r.yaml"),
        "{}",
        bad.stderr
    );
}

fn dir_bytes(dir: &PathBuf) -> u64 {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.metadata().ok())
        .map(|m| m.len())
        .sum()
}

/// (requests scored, requests from the cache) from `zflow eval`'s summary line of `next_line`.
fn counts(stderr: &str) -> (usize, usize) {
    task_counts(stderr, "next_line")
}

/// (requests scored, requests from the cache) from `zflow eval`'s summary line of `task`.
fn task_counts(stderr: &str, task: &str) -> (usize, usize) {
    let line = stderr
        .lines()
        .find(|l| l.starts_with(&format!("{task}: ")))
        .unwrap_or_else(|| panic!("no summary line:\n{stderr}"));
    let number = |before: &str| {
        line.split(before)
            .next()
            .unwrap()
            .rsplit(' ')
            .next()
            .unwrap()
            .parse::<usize>()
            .unwrap()
    };
    (number(" requests scored"), number(" from the cache"))
}

/// The `evals:` section on a two-phase recipe: an `eval.<phase>` per phase on a task written as
/// data (its data fetched from a local folder), then `zflow report`: the phases' rows next to
/// a published baseline's, in every format, with the training plots; a rerun runs nothing and
/// prints the same report.
#[test]
#[cfg_attr(
    not(zflow_torch),
    ignore = "needs the torch engine's Python: scripts/setup.sh creates it, scripts/test.sh sets ZFLOW_TORCH_PYTHON"
)]
fn zflow_report_scores_every_phase_next_to_the_baselines() {
    let sb = Sandbox::new();
    write_task(&sb);
    let recipe = tiny_train_recipe_on("torch", 1, 3)
        + "  p2:\n    tokens: 8000\n    seq_len: 64\n    mixture: {prose: 1.0}\n"
        + "evals:\n  tasks: [next_line]\n  tasks_dir: tasks\n  limit: 120\n  data: {toy: {url: data/toy}}\n"
        + "  decontaminate: {action: remove}\n"
        + "  report:\n    tasks: [next_line, piqa]\n    baselines: [Gemma-3-270M-PT]\n";
    sb.write("r.yaml", &recipe);
    let first = sb.ok(&["report", "r.yaml"]);
    let md = &first.stdout;
    for want in [
        "faults-test/p1",
        "faults-test/p2",
        "Gemma-3-270M-PT",
        "next_line (acc_norm, 0-shot)",
        "piqa (acc, 0-shot)",
        "67.7",
        "https://ai.google.dev/gemma/docs/core/model_card_3",
        "plots/loss.png",
        "plots/expert-load.png",
        "plots/scores.png",
    ] {
        assert!(md.contains(want), "report lacks {want:?}:\n{md}");
    }
    // The task's test documents are lines of ARCHITECTURE.md, which the `prose` source reads:
    // its paragraphs quoting them were removed before training, and the report says how many.
    let decontamination = row_of(md, "| next_line |");
    let cells: Vec<u64> = decontamination
        .split('|')
        .filter_map(|c| c.trim().parse().ok())
        .collect();
    assert!(
        cells.len() == 2 && cells[0] > 0 && cells[0] == cells[1],
        "{decontamination}"
    );
    assert!(md.contains("## Data") && md.contains("| prose |"), "{md}");
    // Kept: what the source's dedup stage kept, after the ingest's rules.
    let kept: u64 = json_file(&sb.output("dedup.prose").join("stats.json"))
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["rule"] == "kept")
        .map(|r| r["documents"].as_u64().unwrap())
        .sum();
    let prose_row: Vec<String> = row_of(md, "| prose |")
        .split('|')
        .map(|c| c.trim().to_string())
        .collect();
    assert_eq!(prose_row[3], kept.to_string(), "{prose_row:?}");
    let prose = json_file(&sb.output("ingest.prose").join("stats.json"));
    assert_eq!(
        prose["contamination"][0][1].as_u64(),
        Some(cells[0]),
        "{prose}"
    );

    // Our rows have a value ± stderr on next_line and none on piqa; the baseline the reverse.
    let row = |name: &str| {
        md.lines()
            .find(|l| l.starts_with(&format!("| {name}")))
            .unwrap_or_else(|| panic!("no row {name}:\n{md}"))
            .to_string()
    };
    assert!(
        row("faults-test/p1").contains('±') && row("faults-test/p1").ends_with("| — |"),
        "{}",
        row("faults-test/p1")
    );
    assert!(
        row("Gemma-3-270M-PT").contains("| — | 67.7 |"),
        "{}",
        row("Gemma-3-270M-PT")
    );

    let store = sb.path().join("zflow-store");
    let report = stage_dir(&store, "report");
    for f in [
        "report.md",
        "report.csv",
        "report.tex",
        "report.json",
        "scores.parquet",
        "plots/loss.svg",
        "plots/lr.png",
        "plots/scores.svg",
    ] {
        assert!(report.join(f).is_file(), "no {f} in {}", report.display());
    }
    let png = std::fs::read(report.join("plots/loss.png")).unwrap();
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
    assert!(
        std::fs::read_to_string(report.join("report.tex"))
            .unwrap()
            .contains("\\begin{tabular}")
    );
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(report.join("report.json")).unwrap())
            .unwrap();
    assert!(json.to_string().contains("faults-test/p2"), "{json}");
    // Each eval stage's results: lm-eval-like JSON with version, n-shot, stderr and config hash.
    let results: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(stage_dir(&store, "eval.p2").join("results.json")).unwrap(),
    )
    .unwrap();
    let task = &results["tasks"][0];
    assert_eq!(
        (
            task["task"].as_str(),
            task["n_samples"].as_u64(),
            task["n_shot"].as_u64()
        ),
        (Some("next_line"), Some(120), Some(0)),
        "{results}"
    );
    assert!(
        task["config_hash"].as_str().is_some_and(|h| h.len() >= 16)
            && task["metrics"][0]["stderr"].is_number(),
        "{results}"
    );
    // Each phase's row scores its own checkpoint.
    let p1: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(stage_dir(&store, "eval.p1").join("results.json")).unwrap(),
    )
    .unwrap();
    assert_ne!(p1["model"]["hash"], results["model"]["hash"]);
    // The scores are queryable.
    let q = sb.ok(&[
        "query",
        "zflow-store",
        "select model, value from \"eval.p1/scores\" where metric = 'acc'",
    ]);
    assert!(q.stdout.contains("faults-test/p1"), "{}", q.stdout);

    // Nothing runs again, and the report is the same.
    let again = sb.ok(&["report", "r.yaml"]);
    assert!(
        again.stderr.contains("0 ran") || again.stdout.contains("0 ran"),
        "{}{}",
        again.stdout,
        again.stderr
    );
    assert_eq!(first.stdout, again.stdout);

    // Bad input is named: an unknown task, an unknown key in the section.
    sb.write(
        "bad.yaml",
        &recipe.replace(
            "tasks: [next_line]\n  tasks_dir: tasks",
            "tasks: [no_such_task]",
        ),
    );
    let bad = sb.zflow(&["plan", "bad.yaml"]);
    assert!(
        bad.code != 0 && bad.stderr.contains("no_such_task"),
        "{}",
        bad.stderr
    );
    sb.write("bad2.yaml", &recipe.replace("limit: 120", "limt: 120"));
    let bad = sb.zflow(&["plan", "bad2.yaml"]);
    assert!(
        bad.code != 0
            && bad.stderr.contains("bad2.yaml:")
            && bad.stderr.contains("unknown field `limt`"),
        "{}",
        bad.stderr
    );
}

/// The arguments of `zflow eval` of `model` on the `next_line_ll` task (the loglikelihood of
/// each line's successor) with the sandbox's tokenizer, before `--cache` and `--out`.
fn next_line_ll_args(sb: &Sandbox, model: &Path) -> Vec<String> {
    let tokenizer = stage_dir(&sb.path().join("zflow-store"), "tokenizer").join("tokenizer.json");
    let (m, t) = (model.display().to_string(), tokenizer.display().to_string());
    [
        "eval",
        "--model",
        &m,
        "--tokenizer",
        &t,
        "--tasks",
        "next_line_ll",
        "--tasks-dir",
        "tasks",
        "--data",
        "data",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// `zflow eval` of `model` on `next_line_ll`: (per-document loglikelihoods, requests scored,
/// requests from the cache).
fn loglikelihoods(sb: &Sandbox, model: &Path, cache: &str, out: &str) -> (Vec<f64>, usize, usize) {
    let mut args = next_line_ll_args(sb, model);
    args.extend(
        [
            "--cache",
            cache,
            "--max-length",
            "64",
            "--log-samples",
            "--out",
            out,
        ]
        .map(String::from),
    );
    let run = sb.ok(&args.iter().map(String::as_str).collect::<Vec<_>>());
    let (scored, cached) = task_counts(&run.stderr, "next_line_ll");
    let results: serde_json::Value = serde_json::from_str(&sb.read(out)).unwrap();
    let samples = results["tasks"][0]["samples"]
        .as_array()
        .unwrap_or_else(|| panic!("no samples in {results}"));
    let lls = samples
        .iter()
        .map(|s| s["values"]["perplexity"].as_f64().unwrap())
        .collect();
    (lls, scored, cached)
}

/// A phase that overrides the RoPE base leaves a checkpoint that records it (model.json), so
/// scoring the checkpoint and scoring its Hugging Face export give the same loglikelihood per
/// request; and since the model config is part of a model's identity, the same weights under
/// another RoPE base are never answered from the other's cache. The export, sharded, and
/// damaged, then runs the checks of
/// [`hugging_face_folders_are_loaded_sharded_and_refused_when_their_weights_differ`] (here, to
/// train the model once).
#[test]
#[cfg_attr(
    not(zflow_torch),
    ignore = "needs the torch engine's Python: scripts/setup.sh creates it, scripts/test.sh sets ZFLOW_TORCH_PYTHON"
)]
fn a_rope_overridden_checkpoint_and_its_export_score_the_same() {
    let sb = Sandbox::new();
    sb.write("r.yaml", &tiny_train_recipe_on("torch", 1, 3));
    sb.ok(&["run", "r.yaml", "--set", "train.rope_base=1000000.0"]);
    write_task(&sb);
    sb.write(
        "tasks/next_line_ll.yaml",
        "task: next_line_ll\nversion: 1\ndataset: {format: jsonl, path: \"toy/{split}.jsonl\"}\nsplit: test\noutput_type: loglikelihood\ndoc_to_text: \"{{ line }}\\n\"\ndoc_to_target: \"{{ choices[label] }}\"\nmetrics: [perplexity]\n",
    );
    let store = sb.path().join("zflow-store");
    let checkpoint = stage_dir(&store, "train.p1").join("final");
    let model: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(checkpoint.join("model.json")).unwrap())
            .unwrap();
    assert_eq!(model["rope_base"].as_f64(), Some(1e6), "{model}");
    sb.ok(&[
        "ckpt",
        "export",
        "--format",
        "hf",
        checkpoint.to_str().unwrap(),
        "hf",
    ]);

    let (ours, scored, _) = loglikelihoods(&sb, &checkpoint, "shared", "ckpt.json");
    assert!(
        ours.len() > 100 && scored > 0,
        "{} documents, {scored} scored",
        ours.len()
    );
    let (exported, _, _) = loglikelihoods(&sb, &sb.path().join("hf"), "fresh", "hf.json");
    assert_eq!(ours.len(), exported.len());
    for (i, (a, b)) in ours.iter().zip(&exported).enumerate() {
        assert!(
            (a - b).abs() <= 1e-4 * a.abs().max(1e-6),
            "document {i}: checkpoint {a}, export {b}"
        );
    }
    // Through the one shared cache, the export still gets the checkpoint's scores.
    let (shared, _, _) = loglikelihoods(&sb, &sb.path().join("hf"), "shared", "hf-shared.json");
    for (a, b) in ours.iter().zip(&shared) {
        assert!((a - b).abs() <= 1e-4 * a.abs().max(1e-6));
    }
    hugging_face_folders_are_loaded_sharded_and_refused_when_their_weights_differ(&sb);

    // The same weights and biases under the recipe's RoPE base (what model.json said before the
    // fix) are another function: scored afresh, not answered from the shared cache.
    let wrong = sb.path().join("wrong-rope");
    std::fs::create_dir(&wrong).unwrap();
    for e in std::fs::read_dir(&checkpoint).unwrap().flatten() {
        std::fs::copy(e.path(), wrong.join(e.file_name())).unwrap();
    }
    let mut other = model.clone();
    other["rope_base"] = serde_json::json!(10000.0);
    std::fs::write(
        wrong.join("model.json"),
        serde_json::to_vec_pretty(&other).unwrap(),
    )
    .unwrap();
    common::reseal(&wrong, "model.json");
    let (theirs, scored, cached) = loglikelihoods(&sb, &wrong, "shared", "wrong.json");
    assert!(
        scored > 0 && cached == 0,
        "scored {scored}, cached {cached}: another model was answered from the cache"
    );
    assert!(
        ours.iter().zip(&theirs).any(|(a, b)| (a - b).abs() > 1e-3),
        "the RoPE base changed no score"
    );
}

/// The transformers adapter on a zflow checkpoint, on every shipped task and the real benchmark data: each runs to
/// completion at its own few-shot count and at the counts the published baselines use (contexts
/// longer than the model's 64 positions keep their last 64 tokens).
#[test]
#[cfg_attr(
    not(all(zflow_eval_fixtures, zflow_torch)),
    ignore = "needs the real benchmark data and the torch engine's Python: scripts/test.sh sets them up"
)]
fn every_task_runs_on_a_zflow_checkpoint_at_its_own_and_the_baselines_few_shot_counts() {
    let data = std::env::var("ZFLOW_EVAL_DATA")
        .expect("ZFLOW_EVAL_DATA is not set: scripts/test.sh fetches the data and sets it");
    let sb = Sandbox::new();
    sb.write("r.yaml", &tiny_train_recipe_on("torch", 1, 3));
    sb.ok(&["run", "r.yaml"]);
    let store = sb.path().join("zflow-store");
    let model = stage_dir(&store, "train.p1")
        .join("final")
        .display()
        .to_string();
    let tokenizer = stage_dir(&store, "tokenizer")
        .join("tokenizer.json")
        .display()
        .to_string();
    let eval = |tasks: &str, shots: Option<usize>, out: &str| -> serde_json::Value {
        let shots = shots.map(|n| n.to_string());
        let mut args = vec![
            "eval",
            "--model",
            &model,
            "--tokenizer",
            &tokenizer,
            "--tasks",
            tasks,
            "--data",
            &data,
            "--limit",
            "1",
            "--max-length",
            "64",
            "--out",
            out,
        ];
        if let Some(n) = &shots {
            args.extend(["--num-fewshot", n]);
        }
        sb.ok(&args);
        serde_json::from_str(&sb.read(out)).unwrap()
    };
    // MATH's seven subjects share one template: algebra stands for them.
    let all = "arc_easy,arc_challenge,piqa,hellaswag,winogrande,boolq,openbookqa,sciq,gsm8k_cot,\
               minerva_math_algebra,humaneval,mbpp,lambada,mmlu";
    let results = eval(all, None, "all.json");
    let tasks = results["tasks"].as_array().unwrap();
    assert!(tasks.len() >= 13 + 57, "{} tasks", tasks.len());
    for (task, shots) in [
        ("hellaswag", 10),
        ("arc_challenge", 25),
        ("winogrande", 5),
        ("mmlu_anatomy", 5),
    ] {
        let results = eval(task, Some(shots), &format!("{task}.json"));
        assert_eq!(results["tasks"][0]["n_shot"], shots, "{results}");
    }
}

/// `decontaminate: {action: flag}` keeps the overlapping documents and lists them per task, with
/// the same counts as `remove` drops (the toy task's test documents are lines of
/// ARCHITECTURE.md, which the `prose` source reads).
#[test]
fn flagged_contamination_is_kept_and_listed_with_the_tasks_it_overlaps() {
    // One sandbox (and store) per action: each holds one `ingest.prose`.
    let ingest = |action: &str| -> (Sandbox, std::path::PathBuf) {
        let sb = Sandbox::new();
        write_task(&sb);
        let evals = format!(
            "evals:\n  tasks: [next_line]\n  tasks_dir: tasks\n  data: {{toy: {{url: data/toy}}}}\n  decontaminate: {{action: {action}}}\n"
        );
        sb.write("r.yaml", &(tiny_train_recipe_on("torch", 1, 3) + &evals));
        sb.ok(&["run", "r.yaml", "--until", "ingest.prose"]);
        let out = sb.output("ingest.prose");
        (sb, out)
    };
    let (_flag_sb, flag_out) = ingest("flag");
    let flagged_stats = json_file(&flag_out.join("stats.json"));
    let flagged: Vec<(u64, Vec<String>)> =
        serde_json::from_slice(&std::fs::read(flag_out.join("contaminated.json")).unwrap())
            .unwrap();
    let overlapping = flagged_stats["contamination"][0][1].as_u64().unwrap();
    assert!(overlapping > 0, "{flagged_stats}");
    assert_eq!(flagged_stats["contamination"][0][2].as_u64(), Some(0));
    assert!(flagged.iter().all(|(_, tasks)| tasks == &["next_line"]));
    assert!(
        flagged.len() as u64 <= overlapping,
        "duplicates are dropped after the check"
    );

    let (_remove_sb, remove_out) = ingest("remove");
    let removed = json_file(&remove_out.join("stats.json"));
    assert_eq!(removed["contamination"][0][1].as_u64(), Some(overlapping));
    assert_eq!(
        removed["docs_out"].as_u64().unwrap() + flagged.len() as u64,
        flagged_stats["docs_out"].as_u64().unwrap(),
        "remove drops exactly the flagged documents"
    );
}

/// A copy of Hugging Face folder `from` at `to`, its tensors rewritten by `edit` (name ->
/// (dtype, shape, bytes)) into `model.safetensors`, or into one shard per tensor with an index
/// when `sharded`.
fn rewritten(
    from: &Path,
    to: &Path,
    sharded: bool,
    edit: impl FnOnce(&mut BTreeMap<String, (safetensors::Dtype, Vec<usize>, Vec<u8>)>),
) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap().flatten() {
        if e.file_name() != "model.safetensors" {
            std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
        }
    }
    let bytes = std::fs::read(from.join("model.safetensors")).unwrap();
    let table = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut tensors: BTreeMap<String, _> = table
        .tensors()
        .into_iter()
        .map(|(n, v)| (n, (v.dtype(), v.shape().to_vec(), v.data().to_vec())))
        .collect();
    edit(&mut tensors);
    type Tensor = (safetensors::Dtype, Vec<usize>, Vec<u8>);
    fn view((dtype, shape, data): &Tensor) -> safetensors::tensor::TensorView<'_> {
        safetensors::tensor::TensorView::new(*dtype, shape.clone(), data).unwrap()
    }
    if !sharded {
        let views = tensors.iter().map(|(n, t)| (n.as_str(), view(t)));
        safetensors::serialize_to_file(views, None, &to.join("model.safetensors")).unwrap();
        return;
    }
    let mut weight_map = serde_json::Map::new();
    for (i, (name, t)) in tensors.iter().enumerate() {
        let shard = format!("model-{i:05}.safetensors");
        safetensors::serialize_to_file([(name.as_str(), view(t))], None, &to.join(&shard)).unwrap();
        weight_map.insert(name.clone(), shard.into());
    }
    let index = serde_json::json!({"metadata": {}, "weight_map": weight_map});
    std::fs::write(to.join("model.safetensors.index.json"), index.to_string()).unwrap();
}

/// `zflow eval` of `model` on `next_line_ll`: its stderr, asserting that it failed.
fn refused(sb: &Sandbox, model: &Path) -> String {
    let mut args = next_line_ll_args(sb, model);
    args.extend(["--cache", "refused", "--out", "refused.json"].map(String::from));
    let run = sb.zflow(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert_ne!(
        run.code,
        0,
        "{} was scored:\n{}",
        model.display(),
        run.stderr
    );
    run.stderr
}

/// `zflow eval` on Hugging Face folders (the checks need the sandbox's trained, exported
/// model `hf`, its tokenizer, and the `next_line_ll` task and cache `shared` that scored it):
/// - the export sharded (`model.safetensors.index.json`) is the same model: its identity is
///   its tensors', so every request comes from the cache the single file filled;
/// - a ZAYA1 folder is checked as `ckpt import` checks it: a missing or an unexpected tensor,
///   or a config that describes more blocks or wider matrices than the weights hold, is refused
///   by name before transformers allocates anything;
/// - another model family (a tiny Llama, which transformers would fill with random values where
///   a tensor is missing) is refused by the scorer, naming the tensor.
fn hugging_face_folders_are_loaded_sharded_and_refused_when_their_weights_differ(sb: &Sandbox) {
    let hf = sb.path().join("hf");
    let sharded = sb.path().join("hf-sharded");
    rewritten(&hf, &sharded, true, |_| {});
    let (_, scored, cached) = loglikelihoods(sb, &sharded, "shared", "sharded.json");
    assert!(
        scored == 0 && cached > 0,
        "the sharded copy scored {scored}, {cached} from the cache"
    );

    let gone = "model.layers.1.self_attn.o_proj.weight";
    let missing = sb.path().join("hf-missing");
    rewritten(&hf, &missing, true, |t| {
        t.remove(gone).unwrap_or_else(|| panic!("no {gone}"));
    });
    let err = refused(sb, &missing);
    assert!(
        err.contains(&format!("tensor `{gone}` is missing")),
        "{err}"
    );

    let extra = sb.path().join("hf-extra");
    rewritten(&hf, &extra, false, |t| {
        t.insert(
            "model.extra".into(),
            (safetensors::Dtype::F32, vec![1], vec![0; 4]),
        );
    });
    let err = refused(sb, &extra);
    assert!(err.contains("unexpected tensor `model.extra`"), "{err}");

    let config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(hf.join("config.json")).unwrap()).unwrap();
    let with_config = |name: &str, fields: serde_json::Value| {
        let folder = sb.path().join(name);
        rewritten(&hf, &folder, false, |_| {});
        let mut edited = config.clone();
        zflow_files::json::merge(&mut edited, fields);
        std::fs::write(folder.join("config.json"), edited.to_string()).unwrap();
        refused(sb, &folder)
    };
    // One block more: its two layers (attention, then experts) in the count and the types.
    let layers = config["num_hidden_layers"].as_u64().unwrap();
    let mut types = config["layer_types"].as_array().unwrap().clone();
    types.extend_from_slice(&types.clone()[..2]);
    let deeper = serde_json::json!({"num_hidden_layers": layers + 2, "layer_types": types});
    let err = with_config("hf-deeper", deeper);
    assert!(err.contains("is missing (config.json implies it)"), "{err}");
    let err = with_config("hf-wider", serde_json::json!({"hidden_size": 1u64 << 20}));
    assert!(
        err.contains("config.json: the sizes give a") && err.contains("matrix of"),
        "{err}"
    );

    let llama = sb.path().join("llama");
    let code = format!(
        "import torch, safetensors.torch as st\n\
         from transformers import LlamaConfig, LlamaForCausalLM\n\
         c = LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1)\n\
         LlamaForCausalLM(c).save_pretrained({dir:?})\n\
         w = st.load_file({dir:?} + '/model.safetensors')\n\
         del w['model.layers.1.mlp.down_proj.weight']\n\
         st.save_file(w, {dir:?} + '/model.safetensors')\n",
        dir = llama.display().to_string()
    );
    common::torch_code_stdout(&code);
    let err = refused(sb, &llama);
    assert!(
        err.contains("describes a model of")
            && err.contains("the files lack `model.layers.1.mlp.down_proj.weight`"),
        "{err}"
    );
}
