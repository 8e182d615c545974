//! zflow's Hugging Face export and import and its evaluation adapter keep transformers' own
//! scores (5.23.0, `transformers.models.zaya`), for both skip semantics (`skip_output`) and both
//! layouts. The plain transformers side is `workers/torch/zflow_torch/parity.py`; zflow's is
//! its evaluation adapter (`zflow_evals::transformers`: a zflow checkpoint exported, a legacy
//! folder converted, each group's shared prefix run once through transformers' cache, only the
//! scored positions through the output layer).
//!
//! - transformers -> zflow: a random tiny `ZayaForCausalLM` (every parameter perturbed,
//!   balancing biases that send tokens to every route, skip included; RoPE base 1e6; contexts
//!   longer than the convolution kernels), saved with `save_pretrained`, scored by plain
//!   transformers and by zflow's adapter from the folder.
//! - zflow -> transformers: that model imported (`zflow ckpt import`), its biases moved by a
//!   constant per router (the skip bias no longer -1.0, which the export must undo), scored by
//!   the adapter (bit for bit as before the move), exported (`zflow ckpt export`), and scored
//!   by plain transformers' `from_pretrained`.
//! - the legacy layout: the same checkpoint exported with `--layout legacy` and read back by
//!   zflow scores bit for bit the same.
//!
//! The model with the current skip semantics has a sliding-window layer (transformers'
//! `hybrid_sliding`: a 6-token window, its own RoPE base), so the export's sliding attention
//! and per-layer-type RoPE are checked against transformers' too.

mod common;

use std::path::{Path, PathBuf};

use zflow_evals::model::{LanguageModel, Score, TokenRequest};

/// Per-request log-likelihoods must agree to this, relative.
const TOLERANCE: f64 = 1e-4;

fn run_parity(args: &[&str]) -> String {
    common::torch_module_stdout("zflow_torch.parity", args.iter().map(Into::into).collect())
}

/// What transformers made of a folder: the scores, in request order, and tokens per route.
struct Theirs {
    scores: Vec<(f64, bool)>,
    routes: Vec<Vec<u64>>,
    /// `generate`'s 8 greedy tokens after the first request's context.
    generated: Vec<u32>,
}

fn transformers_scores(folder: &Path, requests: &Path) -> Theirs {
    let v: serde_json::Value = serde_json::from_str(
        run_parity(&[
            "score",
            folder.to_str().unwrap(),
            requests.to_str().unwrap(),
        ])
        .trim(),
    )
    .unwrap();
    Theirs {
        scores: serde_json::from_value(v["scores"].clone()).unwrap(),
        routes: serde_json::from_value(v["routes"].clone()).unwrap(),
        generated: serde_json::from_value(v["generated"].clone()).unwrap(),
    }
}

/// A word-level tokenizer over the model's ids (the adapter wants one; requests are ids).
fn tokenizer(dir: &Path, vocab: usize) -> PathBuf {
    let words: serde_json::Map<String, serde_json::Value> = (0..vocab)
        .map(|i| (format!("t{i}"), serde_json::json!(i)))
        .collect();
    let path = dir.join("tokenizer.json");
    let json = serde_json::json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": [],
        "normalizer": null, "pre_tokenizer": {"type": "WhitespaceSplit"}, "post_processor": null,
        "decoder": null, "model": {"type": "WordLevel", "vocab": words, "unk_token": "t0"}
    });
    std::fs::write(&path, serde_json::to_vec(&json).unwrap()).unwrap();
    path
}

/// zflow's scores of the requests (its evaluation adapter: a zflow checkpoint exported, a
/// legacy folder converted, each group's shared prefix run once), and its 8 greedy tokens
/// after the first context.
fn zflow_scores(
    model: &Path,
    tokenizer: &Path,
    groups: &[Vec<TokenRequest>],
) -> (Vec<Score>, Vec<u32>) {
    let mut m = zflow_stages::eval::open_transformers(model, tokenizer, "t0", 64, "cpu", &[0])
        .unwrap_or_else(|e| panic!("{}: {e:#}", model.display()));
    let scores = m.loglikelihood(groups).unwrap().concat();
    let generated = m
        .generate_greedy(&groups[0][0].context, 8, &mut |_| false)
        .unwrap();
    (scores, generated)
}

/// Two scorers (as on two GPUs; here two CPU processes) with every call split between them
/// give what one gives: the same scores, and in one batch, the same greedy tokens per context.
fn split_between_two_scorers_changes_nothing(
    model: &Path,
    tokenizer: &Path,
    groups: &[Vec<TokenRequest>],
    one: &[Score],
) {
    let mut two =
        zflow_stages::eval::open_transformers(model, tokenizer, "t0", 64, "cpu", &[0, 1]).unwrap();
    let scores = two.loglikelihood(groups).unwrap().concat();
    assert_eq!(scores.len(), one.len());
    for (a, b) in scores.iter().zip(one) {
        assert!((a.logprob - b.logprob).abs() <= TOLERANCE * b.logprob.abs().max(1e-9));
        assert_eq!(a.is_greedy, b.is_greedy);
    }
    let contexts: Vec<Vec<u32>> = groups.iter().map(|g| g[0].context.clone()).collect();
    let batched = two.generate_batch(&contexts, 6, &[]).unwrap();
    for (c, b) in contexts.iter().zip(&batched) {
        assert_eq!(&two.generate_greedy(c, 6, &mut |_| false).unwrap(), b);
    }
}

/// Compares per request and per group's argmax choice; returns the worst relative difference.
fn compare(what: &str, ours: &[Score], theirs: &Theirs, groups: &[Vec<TokenRequest>]) -> f64 {
    assert_eq!(ours.len(), theirs.scores.len(), "{what}");
    let mut worst = 0.0f64;
    for (i, (o, (t, greedy))) in ours.iter().zip(&theirs.scores).enumerate() {
        let rel = (o.logprob - t).abs() / t.abs().max(1e-9);
        worst = worst.max(rel);
        assert!(
            rel <= TOLERANCE,
            "{what}: request {i}: zflow {} transformers {t} ({rel:.1e})",
            o.logprob
        );
        assert_eq!(o.is_greedy, *greedy, "{what}: request {i} greedy");
    }
    let argmax = |s: &[f64]| (0..s.len()).max_by(|&a, &b| s[a].total_cmp(&s[b])).unwrap();
    let mut at = 0;
    for g in groups {
        let o: Vec<f64> = ours[at..at + g.len()].iter().map(|s| s.logprob).collect();
        let t: Vec<f64> = theirs.scores[at..at + g.len()]
            .iter()
            .map(|s| s.0)
            .collect();
        assert_eq!(
            argmax(&o),
            argmax(&t),
            "{what}: the choice of group at {at}"
        );
        at += g.len();
    }
    // The random model uses every route, skip included, in every layer.
    for (layer, counts) in theirs.routes.iter().enumerate() {
        assert!(
            counts.iter().all(|&n| n > 0),
            "{what}: layer {layer} routes {counts:?}"
        );
    }
    worst
}

fn zflow(sb: &common::Sandbox, args: &[&str]) {
    sb.ok(args);
}

/// The checks of the module page, on a random model with skip semantics `skip_output`, whose
/// second layer is a sliding-window one when `sliding`.
fn parity(skip_output: &str, sliding: bool) {
    let sb = common::Sandbox::new();
    let dir = sb.path();
    let made = dir.join("made");
    let mut make = vec!["make", made.to_str().unwrap(), skip_output];
    if sliding {
        make.push("sliding");
    }
    run_parity(&make);
    let requests = made.join("requests.json");
    let raw: Vec<Vec<serde_json::Value>> =
        serde_json::from_slice(&std::fs::read(&requests).unwrap()).unwrap();
    let groups: Vec<Vec<TokenRequest>> = raw
        .iter()
        .map(|g| {
            g.iter()
                .map(|r| TokenRequest {
                    context: serde_json::from_value(r["context"].clone()).unwrap(),
                    continuation: serde_json::from_value(r["continuation"].clone()).unwrap(),
                })
                .collect()
        })
        .collect();
    let config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(made.join("config.json")).unwrap()).unwrap();
    let tok = tokenizer(dir, config["vocab_size"].as_u64().unwrap() as usize);

    // transformers -> zflow.
    let theirs = transformers_scores(&made, &requests);
    let (ours, generated) = zflow_scores(&made, &tok, &groups);
    assert_eq!(
        generated, theirs.generated,
        "{skip_output}: greedy decoding"
    );
    if sliding {
        split_between_two_scorers_changes_nothing(&made, &tok, &groups, &ours);
    }
    let a = compare(
        &format!("{skip_output}: transformers -> zflow"),
        &ours,
        &theirs,
        &groups,
    );

    // zflow -> transformers: imported, biases moved, exported.
    let ck = dir.join("ck");
    zflow(&sb, &["ckpt", "import", made.to_str().unwrap(), "ck"]);
    let state_path = ck.join("trainer.json");
    let mut state: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&state_path).unwrap()).unwrap();
    for b in state["balance"].as_array_mut().unwrap() {
        for v in b["biases"].as_array_mut().unwrap() {
            *v = serde_json::json!(v.as_f64().unwrap() + 0.75);
        }
    }
    std::fs::write(&state_path, serde_json::to_vec_pretty(&state).unwrap()).unwrap();
    common::reseal(&ck, "trainer.json");
    let (moved, _) = zflow_scores(&ck, &tok, &groups);
    assert_eq!(
        moved, ours,
        "{skip_output}: a constant added to each router's biases changed a score"
    );
    zflow(&sb, &["ckpt", "export", "ck", "exported"]);
    let exported = transformers_scores(&dir.join("exported"), &requests);
    assert_eq!(
        exported.generated, generated,
        "{skip_output}: generate on the export"
    );
    let b = compare(
        &format!("{skip_output}: zflow -> transformers"),
        &moved,
        &exported,
        &groups,
    );

    // The legacy layout reads back to the same scores, bit for bit; it has no sliding-window
    // layers, and the export says so.
    let legacy_export = sb.zflow(&["ckpt", "export", "ck", "legacy", "--layout", "legacy"]);
    if sliding {
        assert!(
            legacy_export.code != 0 && legacy_export.stderr.contains("model.sliding_blocks"),
            "{}",
            legacy_export.stderr
        );
    } else {
        assert_eq!(legacy_export.code, 0, "{}", legacy_export.stderr);
        let (legacy, _) = zflow_scores(&dir.join("legacy"), &tok, &groups);
        assert_eq!(legacy, ours, "{skip_output}: legacy layout");
    }
    eprintln!(
        "skip_output {skip_output}, sliding layer {sliding}: worst relative log-likelihood difference, transformers -> zflow {a:.1e}, zflow -> transformers {b:.1e}; routes {:?}",
        theirs.routes
    );
}

#[test]
#[cfg_attr(
    not(zflow_torch),
    ignore = "needs the torch engine's Python: scripts/setup.sh creates it, scripts/test.sh sets ZFLOW_TORCH_PYTHON"
)]
fn transformers_and_zflow_score_alike_with_a_zero_skip_output_and_a_sliding_window_layer() {
    parity("zero", true);
}

#[test]
#[cfg_attr(
    not(zflow_torch),
    ignore = "needs the torch engine's Python: scripts/setup.sh creates it, scripts/test.sh sets ZFLOW_TORCH_PYTHON"
)]
fn transformers_and_zflow_score_alike_with_the_older_skip_output_in_both_layouts() {
    parity("input", false);
}
