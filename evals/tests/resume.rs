//! The harness end to end on a toy task and a toy model (no data, no GGUF): an evaluation
//! interrupted mid-way resumes at request level, recomputes nothing already scored, and the
//! results JSON is byte-identical to an uninterrupted run's.

use std::cell::Cell;
use std::path::Path;

use anyhow::{Result, bail};
use zflow_evals::engine::EngineOptions;
use zflow_evals::tokenizer::Tokenizer;
use zflow_evals::{EvalOptions, LanguageModel, Score, TaskRegistry, TokenRequest, evaluate};

/// Scores are a hash of the tokens; fails once `budget` requests have been scored.
struct ToyModel {
    tokenizer: Tokenizer,
    budget: Cell<usize>,
    scored: Cell<usize>,
}

fn toy_tokenizer() -> Tokenizer {
    let words = [
        "<bos>", "<eos>", "[UNK]", "Question", ":", "Answer", "red", "green", "blue", "is", "sky",
        "grass", "the", "color", "of", "?",
    ];
    let vocab: serde_json::Map<String, serde_json::Value> = words
        .iter()
        .enumerate()
        .map(|(i, w)| (w.to_string(), i.into()))
        .collect();
    let json = serde_json::json!({"version": "1.0", "truncation": null, "padding": null, "added_tokens": [],
        "normalizer": null, "pre_tokenizer": {"type": "Whitespace"}, "post_processor": null, "decoder": null,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "[UNK]"}});
    let inner = tokenizers::Tokenizer::from_bytes(json.to_string().as_bytes()).unwrap();
    Tokenizer::new(inner, Some(0), vec![1], true, "toy-words".into())
}

impl LanguageModel for ToyModel {
    fn identity(&self) -> String {
        "toy-model-v1".into()
    }
    fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }
    fn max_length(&self) -> usize {
        64
    }
    fn loglikelihood(&mut self, groups: &[Vec<TokenRequest>]) -> Result<Vec<Vec<Score>>> {
        let n: usize = groups.iter().map(Vec::len).sum();
        if self.scored.get() + n > self.budget.get() {
            bail!("simulated crash");
        }
        self.scored.set(self.scored.get() + n);
        Ok(groups
            .iter()
            .map(|g| {
                g.iter()
                    .map(|r| {
                        let h = r
                            .context
                            .iter()
                            .chain(&r.continuation)
                            .fold(17u64, |h, &t| h.wrapping_mul(31).wrapping_add(t as u64));
                        Score {
                            logprob: -((h % 1000) as f64) / 100.0,
                            is_greedy: h % 3 == 0,
                        }
                    })
                    .collect()
            })
            .collect())
    }
    fn generate_greedy(
        &mut self,
        _: &[u32],
        _: usize,
        _: &mut dyn FnMut(&[u32]) -> bool,
    ) -> Result<Vec<u32>> {
        Ok(vec![6])
    }
}

fn setup(dir: &Path) -> TaskRegistry {
    let data = dir.join("data");
    std::fs::create_dir_all(&data).unwrap();
    let colors = ["red", "green", "blue"];
    let rows: String = (0..40)
        .map(|i| serde_json::json!({"q": format!("the color of the {} ?", ["sky", "grass"][i % 2]), "gold": i % 3}).to_string() + "\n")
        .collect();
    std::fs::write(data.join("colors.jsonl"), rows).unwrap();
    let tasks = dir.join("tasks");
    std::fs::create_dir_all(&tasks).unwrap();
    std::fs::write(
        tasks.join("colors.yaml"),
        format!(
            "task: colors\nversion: 1\ndataset: {{format: jsonl, path: colors.jsonl}}\nsplit: test\n\
             fewshot_split: test\nnum_fewshot: 2\noutput_type: multiple_choice\n\
             doc_to_text: \"Question : {{{{q}}}} Answer :\"\ndoc_to_target: gold\ndoc_to_choice: {colors:?}\n\
             metrics: [acc, acc_norm]\n"
        ),
    )
    .unwrap();
    // A second task on the same rows (0-shot) and a group over both.
    std::fs::write(
        tasks.join("colors0.yaml"),
        format!(
            "task: colors0\nversion: 1\ndataset: {{format: jsonl, path: colors.jsonl}}\nsplit: test\n\
             output_type: multiple_choice\ndoc_to_text: \"Question : {{{{q}}}} Answer :\"\ndoc_to_target: gold\n\
             doc_to_choice: {colors:?}\nmetrics: [acc]\n"
        ),
    )
    .unwrap();
    std::fs::write(
        tasks.join("both.yaml"),
        "group: both\ntasks: [colors, colors0]\naggregate: {metrics: [acc]}\n",
    )
    .unwrap();
    TaskRegistry::load_dir(&tasks).unwrap()
}

fn opts(dir: &Path, cache: &str) -> EvalOptions {
    EvalOptions {
        data_root: dir.join("data"),
        cache_dir: dir.join(cache),
        limit: None,
        generation_limit: None,
        max_gen_toks: None,
        num_fewshot: None,
        log_samples: true,
        python: None,
        engine: EngineOptions {
            max_batch_tokens: 40,
            progress: false,
            sink: None,
        },
    }
}

#[test]
fn interrupted_evaluation_resumes_and_matches() {
    let dir = tempfile::tempdir().unwrap();
    let reg = setup(dir.path());
    let names = vec!["colors".to_string()];
    let toy = |budget| ToyModel {
        tokenizer: toy_tokenizer(),
        budget: Cell::new(budget),
        scored: Cell::new(0),
    };

    // Uninterrupted reference.
    let mut m = toy(usize::MAX);
    let reference = evaluate(&mut m, &reg, &names, &opts(dir.path(), "cache-a")).unwrap();
    // 40 documents x 3 choices, less the prompts two documents share (scored once).
    let unique = m.scored.get();
    assert!(unique > 60 && unique <= 120, "{unique}");
    let reference_json = reference.results.to_json();

    // Crash after 50 requests, then resume with the same cache.
    let mut m = toy(50);
    let err = evaluate(&mut m, &reg, &names, &opts(dir.path(), "cache-b"))
        .err()
        .unwrap();
    assert!(format!("{err:#}").contains("simulated crash"));
    let before = m.scored.get();
    assert!(before > 0 && before <= 50);
    let mut m = toy(usize::MAX);
    let resumed = evaluate(&mut m, &reg, &names, &opts(dir.path(), "cache-b")).unwrap();
    assert_eq!(m.scored.get(), unique - before, "nothing scored twice");
    assert_eq!(
        resumed.results.to_json(),
        reference_json,
        "byte-identical results"
    );

    // A third run is answered from the cache alone.
    let mut m = toy(0);
    let cached = evaluate(&mut m, &reg, &names, &opts(dir.path(), "cache-b")).unwrap();
    assert_eq!(cached.results.to_json(), reference_json);

    // Values and stderrs are present and sane.
    let t = &reference.results.tasks[0];
    assert_eq!((t.n_samples, t.n_shot), (40, 2));
    assert_eq!(t.metrics[0].metric, "acc");
    assert!(t.metrics[0].stderr.unwrap() > 0.0);
}

#[test]
fn a_cancelled_evaluation_stops_and_keeps_what_it_scored() {
    let dir = tempfile::tempdir().unwrap();
    let reg = setup(dir.path());
    let names = vec!["colors".to_string()];
    let toy = || ToyModel {
        tokenizer: toy_tokenizer(),
        budget: Cell::new(usize::MAX),
        scored: Cell::new(0),
    };
    let mut reference = toy();
    let reference_json = evaluate(&mut reference, &reg, &names, &opts(dir.path(), "cache-a"))
        .unwrap()
        .results
        .to_json();

    // The sink says stop once a few batches are done (as a pipeline stage does on Ctrl-C).
    let mut o = opts(dir.path(), "cache-b");
    o.engine.sink = Some(std::sync::Arc::new(|_: &str, done: usize, _: usize| {
        done < 20
    }));
    let mut m = toy();
    let err = evaluate(&mut m, &reg, &names, &o).err().unwrap();
    assert!(
        format!("{err:#}").contains("cancelled while scoring colors"),
        "{err:#}"
    );
    let before = m.scored.get();
    assert!(before > 0 && before < reference.scored.get(), "{before}");
    let mut m = toy();
    let resumed = evaluate(&mut m, &reg, &names, &opts(dir.path(), "cache-b")).unwrap();
    assert_eq!(
        m.scored.get(),
        reference.scored.get() - before,
        "nothing scored twice"
    );
    assert_eq!(resumed.results.to_json(), reference_json);
}

#[test]
fn groups_pool_their_members() {
    let dir = tempfile::tempdir().unwrap();
    let reg = setup(dir.path());
    let mut m = ToyModel {
        tokenizer: toy_tokenizer(),
        budget: Cell::new(usize::MAX),
        scored: Cell::new(0),
    };
    let r = evaluate(
        &mut m,
        &reg,
        &["both".to_string()],
        &opts(dir.path(), "cache"),
    )
    .unwrap()
    .results;
    assert_eq!(r.tasks.len(), 2);
    let g = &r.groups[0];
    assert_eq!((g.group.as_str(), g.n_samples), ("both", 80));
    // Size-weighted mean of equal-sized members = their plain mean; the stderr is the pooled one.
    let (a, b) = (&r.tasks[0].metrics[0], &r.tasks[1].metrics[0]);
    assert!((g.metrics[0].value - (a.value + b.value) / 2.0).abs() < 1e-12);
    let pooled =
        zflow_evals::metrics::pooled_stderr(&[a.stderr.unwrap(), b.stderr.unwrap()], &[40, 40]);
    assert_eq!(g.metrics[0].stderr, Some(pooled));
    assert!(r.table().contains("| both |"));
}
