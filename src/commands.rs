//! The subcommands: each loads what it needs, calls the engine, prints.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use zflow_pipeline::lease;
use zflow_pipeline::plan::{self, Engine, StageState};
use zflow_pipeline::progress::Progress;
use zflow_pipeline::records::{self, Status};
use zflow_pipeline::run::{self, RunOptions};
use zflow_pipeline::store::now_ms;
use zflow_pipeline::{CancelToken, LoadOptions, recipe};

use crate::RecipeArgs;

/// Loads the recipe (with every stage kind registered) and opens its store.
pub fn open(args: &RecipeArgs) -> Result<Engine> {
    let opts = LoadOptions {
        sets: args.sets.clone(),
        store: args.store.clone(),
    };
    let recipe = recipe::load(&args.recipe, &opts, &zflow_stages::registry())?;
    Engine::open(recipe)
}

fn indices(engine: &Engine, names: &[String]) -> Result<BTreeSet<usize>> {
    names
        .iter()
        .map(|n| {
            engine.graph.position(n).with_context(|| {
                format!("no stage named `{n}` in {}", engine.recipe.path.display())
            })
        })
        .collect()
}

/// `zflow run` flags.
pub struct RunFlags {
    pub only: Vec<String>,
    pub from: Vec<String>,
    pub until: Vec<String>,
    pub force: Vec<String>,
    pub jobs: Option<u32>,
    pub gpus: u32,
    pub memory_gb: Option<f64>,
}

pub async fn run(args: &RecipeArgs, flags: RunFlags, progress: Progress) -> Result<ExitCode> {
    let engine = open(args)?;
    let selected = run::select(&engine, &flags.only, &flags.from, &flags.until)?;
    let force = indices(&engine, &flags.force)?;
    let cores = std::thread::available_parallelism()
        .map(|n| n.get() as u32)
        .unwrap_or(1);
    let cancel = CancelToken::default();
    watch_signals(cancel.clone());
    let opts = RunOptions {
        selected,
        force,
        cpus: flags.jobs.unwrap_or(cores),
        gpus: flags.gpus,
        memory_gb: flags.memory_gb.unwrap_or_else(total_memory_gb),
        progress: progress.clone(),
        cancel,
    };
    if matches!(
        engine.recipe.executor,
        zflow_pipeline::recipe::ExecutorConfig::Slurm(_)
    ) {
        let states = engine.plan(&opts.force)?;
        if opts
            .selected
            .iter()
            .any(|&i| !matches!(states[i], StageState::Cached { .. }))
        {
            zflow_pipeline::slurm::check_reachable()?;
        }
    }
    let started = Instant::now();
    progress.println(&format!(
        "zflow run {} ({} stages selected, store {})",
        engine.recipe.name,
        opts.selected.len(),
        engine.store.root().display()
    ));
    let summary = run::run(Arc::new(engine), opts).await?;
    let secs = started.elapsed().as_secs_f64();
    let line = format!(
        "{} ran, {} cached, {} failed, {} skipped in {secs:.1}s",
        summary.ran.len(),
        summary.cached.len(),
        summary.failed.len(),
        summary.skipped.len()
    );
    if summary.success() {
        progress.println(&line);
        return Ok(ExitCode::SUCCESS);
    }
    eprintln!("{line}");
    for (name, error, log) in &summary.failed {
        eprintln!("stage `{name}` failed: {error}");
        if !log.as_os_str().is_empty() {
            eprintln!("  log: {}", log.display());
        }
    }
    if !summary.skipped.is_empty() {
        eprintln!("not run: {}", summary.skipped.join(", "));
    }
    if summary.cancelled {
        eprintln!("cancelled; run the same command again to continue");
        return Ok(ExitCode::from(130));
    }
    Ok(ExitCode::from(1))
}

/// `zflow report RECIPE`: runs the recipe's `report` stage and what it needs (nothing, when
/// all of it is in the store), then prints `report.md` and where the tables and plots are.
pub async fn report(args: &RecipeArgs, flags: RunFlags, progress: Progress) -> Result<ExitCode> {
    let engine = open(args)?;
    if engine.graph.position("report").is_none() {
        bail!(
            "{} has no `report` stage: add an `evals:` section (or a stage of kind `report`)",
            args.recipe.display()
        );
    }
    let code = run(
        args,
        RunFlags {
            until: vec!["report".into()],
            ..flags
        },
        progress,
    )
    .await?;
    if code != ExitCode::SUCCESS {
        return Ok(code);
    }
    let engine = open(args)?;
    let i = engine.graph.position("report").expect("checked above");
    let states = engine.plan(&BTreeSet::new())?;
    let StageState::Cached { manifest } = &states[i] else {
        bail!("the report stage did not complete")
    };
    let dir = engine.store.output_dir("report", &manifest.identity);
    let md = dir.join("report.md");
    print!(
        "{}",
        std::fs::read_to_string(&md).with_context(|| format!("reading {}", md.display()))?
    );
    println!(
        "
report: {} (also report.csv, report.tex, report.json, plots/)",
        md.display()
    );
    Ok(ExitCode::SUCCESS)
}

/// `zflow exec-stage SPEC`: one stage attempt inside a Slurm job (see `zflow_pipeline::slurm`).
pub async fn exec_stage(spec: &Path) -> Result<ExitCode> {
    let cancel = CancelToken::default();
    watch_signals(cancel.clone());
    let spec = spec.to_path_buf();
    tokio::task::spawn_blocking(move || {
        zflow_pipeline::slurm::exec_stage(&spec, &zflow_stages::registry(), cancel)
    })
    .await??;
    Ok(ExitCode::SUCCESS)
}

/// First SIGINT/SIGTERM: cancel (stages stop, store stays consistent). Second: exit now.
fn watch_signals(cancel: CancelToken) {
    tokio::spawn(async move {
        use tokio::signal::unix::{SignalKind, signal};
        let (Ok(mut int), Ok(mut term)) = (
            signal(SignalKind::interrupt()),
            signal(SignalKind::terminate()),
        ) else {
            return;
        };
        let mut count = 0;
        loop {
            tokio::select! {
                _ = int.recv() => {},
                _ = term.recv() => {},
            }
            count += 1;
            if count == 1 {
                eprintln!("stopping: cancelling running stages (signal again to exit at once)");
                cancel.cancel();
            } else {
                std::process::exit(130);
            }
        }
    });
}

fn total_memory_gb() -> f64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            let line = s.lines().find(|l| l.starts_with("MemTotal:"))?.to_string();
            line.split_whitespace().nth(1)?.parse::<f64>().ok()
        })
        .map(|kb| kb / (1024.0 * 1024.0))
        .unwrap_or(f64::MAX)
}

pub fn plan(args: &RecipeArgs, force: &[String]) -> Result<ExitCode> {
    let engine = open(args)?;
    let force = indices(&engine, force)?;
    let states = engine.plan(&force)?;
    println!(
        "plan for {} (store {})",
        engine.recipe.name,
        engine.store.root().display()
    );
    print!("{}", plan::render(&engine, &states));
    Ok(ExitCode::SUCCESS)
}

pub fn why(args: &RecipeArgs, stage: &str) -> Result<ExitCode> {
    let engine = open(args)?;
    let Some(i) = engine.graph.position(stage) else {
        bail!("no stage named `{stage}` in {}", args.recipe.display())
    };
    let states = engine.plan(&BTreeSet::new())?;
    explain(&engine, &states, i, 0);
    Ok(ExitCode::SUCCESS)
}

fn explain(engine: &Engine, states: &[StageState], i: usize, depth: usize) {
    let pad = "  ".repeat(depth);
    let node = &engine.graph.nodes()[i];
    match &states[i] {
        StageState::Cached { manifest } => println!(
            "{pad}{}: cached ({}), output {}",
            node.name,
            ago(manifest.finished_ms),
            engine.output_dir(&node.name, &manifest.identity).display()
        ),
        StageState::WillRun {
            reason, resumes, ..
        } => {
            println!(
                "{pad}{}: will run{}",
                node.name,
                if *resumes {
                    " (resuming its partial output)"
                } else {
                    ""
                }
            );
            match reason {
                plan::Reason::Changed(changes) if !changes.is_empty() => {
                    for c in changes {
                        println!("{pad}  - {c}");
                    }
                }
                other => println!("{pad}  - {other}"),
            }
        }
        StageState::Broken { error } => println!("{pad}{}: cannot be planned: {error}", node.name),
        StageState::Waits { on } => {
            println!(
                "{pad}{}: will run after its inputs {}; its identity depends on their new contents",
                node.name,
                on.join(", ")
            );
            for name in on {
                if let Some(j) = engine.graph.position(name) {
                    explain(engine, states, j, depth + 1);
                }
            }
        }
    }
}

fn ago(ms: i64) -> String {
    let s = (now_ms() - ms).max(0) / 1000;
    match s {
        0..=59 => format!("{s}s ago"),
        60..=3599 => format!("{}m ago", s / 60),
        3600..=86399 => format!("{}h ago", s / 3600),
        _ => format!("{}d ago", s / 86400),
    }
}

pub fn status(args: &RecipeArgs) -> Result<ExitCode> {
    let engine = open(args)?;
    let states = engine.plan(&BTreeSet::new())?;
    let records = records::read_all(&engine.store.records_dir())?;
    let nodes = engine.graph.nodes();
    let width = nodes.iter().map(|n| n.name.len()).max().unwrap_or(5);
    println!(
        "{} (store {})",
        engine.recipe.name,
        engine.store.root().display()
    );
    let mut counts = std::collections::BTreeMap::<&str, usize>::new();
    for &i in engine.graph.topo_order() {
        let node = &nodes[i];
        let (word, detail) = match &states[i] {
            StageState::Cached { manifest } => (
                "done",
                format!(
                    "{}, took {:.1}s",
                    ago(manifest.finished_ms),
                    (manifest.finished_ms - manifest.started_ms) as f64 / 1000.0
                ),
            ),
            StageState::WillRun {
                identity,
                reason,
                resumes,
                ..
            } => {
                let lease_info = lease::read(&engine.store.lease_path(&node.name, identity));
                let last = records
                    .iter()
                    .rev()
                    .find(|r| r.stage == node.name && &r.identity == identity);
                match (lease_info, last) {
                    (Some(l), _) if !l.is_stale(lease::lease_timeout()) => (
                        "running",
                        format!(
                            "pid {} on {}, heartbeat {}",
                            l.pid,
                            l.host,
                            ago(l.heartbeat_ms)
                        ),
                    ),
                    (_, Some(r)) if r.status == Status::Failed => (
                        "failed",
                        format!(
                            "{}: {} (log: {})",
                            ago(r.end_ms),
                            r.error
                                .as_deref()
                                .unwrap_or("")
                                .lines()
                                .next()
                                .unwrap_or(""),
                            r.log
                        ),
                    ),
                    (_, Some(r)) if r.status == Status::Cancelled || *resumes => (
                        "stopped",
                        format!("interrupted {}; `zflow run` continues it", ago(r.end_ms)),
                    ),
                    _ => ("pending", reason.to_string()),
                }
            }
            StageState::Waits { on } => ("pending", format!("after {}", on.join(", "))),
            StageState::Broken { error } => ("error", error.clone()),
        };
        *counts.entry(word).or_default() += 1;
        println!("  {word:<8} {:<width$}  {detail}", node.name);
        // Training interruptions (restarts, loss-spike rollbacks) from the stage's run records.
        let identity = match &states[i] {
            StageState::Cached { manifest } => Some(manifest.identity.clone()),
            StageState::WillRun { identity, .. } => Some(identity.clone()),
            _ => None,
        };
        if let Some(identity) = identity {
            if let Ok(job) = std::fs::read_to_string(zflow_pipeline::slurm::job_file(
                &engine.store.log_path(&node.name, &identity),
            )) {
                println!("  {:<8} {:<width$}    job: {job}", "", "");
            }
            let dirs = [
                engine.store.output_dir(&node.name, &identity),
                engine.store.partial_dir(&node.name, &identity),
            ];
            if let Some(text) = dirs
                .iter()
                .find_map(|d| std::fs::read_to_string(d.join("events.jsonl")).ok())
            {
                for line in interruptions(&text) {
                    println!("  {:<8} {:<width$}    {line}", "", "");
                }
            }
        }
    }
    let summary: Vec<String> = counts.iter().map(|(k, v)| format!("{v} {k}")).collect();
    println!("{}", summary.join(", "));
    Ok(ExitCode::SUCCESS)
}

/// One line per restart or loss-spike rollback in a train stage's `events.jsonl`.
fn interruptions(events: &str) -> Vec<String> {
    events
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|e| e["kind"] != "launch")
        .map(|e| {
            let downtime = match (e["detected_ms"].as_u64(), e["training_again_ms"].as_u64()) {
                (Some(a), Some(b)) => format!(
                    ", training again after {:.1}s",
                    b.saturating_sub(a) as f64 / 1000.0
                ),
                _ if e["backoff_s"].is_null() && e["kind"] == "failure" => {
                    ", not relaunched".to_string()
                }
                _ => String::new(),
            };
            let what = match e["kind"].as_str() {
                Some("loss_spike") => "rollback",
                Some("preflight") => "preflight",
                _ => "restart",
            };
            format!(
                "{what} (attempt {}): {}{downtime}",
                e["attempt"],
                e["cause"].as_str().unwrap_or("")
            )
        })
        .collect()
}

pub fn graph(args: &RecipeArgs, format: &str) -> Result<ExitCode> {
    let engine = open(args)?;
    let label = |n: &zflow_pipeline::recipe::StageNode| format!("{}\\n{}", n.name, n.stage.kind());
    match format {
        "mermaid" => print!(
            "{}",
            engine
                .graph
                .to_mermaid(|n| format!("{} ({})", n.name, n.stage.kind()))
        ),
        _ => print!("{}", engine.graph.to_dot(label)),
    }
    Ok(ExitCode::SUCCESS)
}

pub fn logs(args: &RecipeArgs, stage: &str, path_only: bool) -> Result<ExitCode> {
    let engine = open(args)?;
    let Some(i) = engine.graph.position(stage) else {
        bail!("no stage named `{stage}` in {}", args.recipe.display())
    };
    // Prefer the log of the identity the recipe asks for now; else the newest of any identity.
    let states = engine.plan(&BTreeSet::new())?;
    let current = match &states[i] {
        StageState::Cached { manifest } => Some(engine.store.log_path(stage, &manifest.identity)),
        StageState::WillRun { identity, .. } => Some(engine.store.log_path(stage, identity)),
        StageState::Waits { .. } | StageState::Broken { .. } => None,
    };
    let path = current
        .filter(|p| p.exists())
        .or_else(|| engine.latest_log(stage));
    let Some(path) = path else {
        bail!(
            "stage `{stage}` has no log yet (it has not run in {})",
            engine.store.root().display()
        )
    };
    if path_only {
        println!("{}", path.display());
    } else {
        print!(
            "{}",
            std::fs::read_to_string(&path)
                .with_context(|| format!("reading {}", path.display()))?
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// `zflow path`: the output folder of `stage` at the identity the recipe asks for now, if complete.
pub fn output_path(args: &RecipeArgs, stage: &str) -> Result<ExitCode> {
    let engine = open(args)?;
    let Some(i) = engine.graph.position(stage) else {
        bail!("no stage named `{stage}` in {}", args.recipe.display())
    };
    match &engine.plan(&BTreeSet::new())?[i] {
        StageState::Cached { manifest } => {
            println!("{}", engine.output_dir(stage, &manifest.identity).display())
        }
        _ => bail!(
            "stage `{stage}` has no complete output in {} for this recipe (`zflow run {} --until {stage}` makes it)",
            engine.store.root().display(),
            args.recipe.display()
        ),
    }
    Ok(ExitCode::SUCCESS)
}

pub fn gc(store: &Path, recipes: &[PathBuf], dry_run: bool) -> Result<ExitCode> {
    // Opening a recipe creates its store's folders: check first, so that gc never writes into
    // (let alone deletes from) a folder that is not a store.
    if !zflow_pipeline::store::Store::is_store(store) {
        bail!(
            "{} is not a zflow store (no .zflow/ folder from a run): gc removes only what a store made, so it refuses other folders",
            store.display()
        );
    }
    let engines = recipes
        .iter()
        .map(|r| {
            open(&RecipeArgs {
                recipe: r.clone(),
                sets: vec![],
                store: Some(store.to_path_buf()),
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let report = zflow_pipeline::gc::gc(&engines, dry_run)?;
    let verb = if dry_run { "would remove" } else { "removed" };
    for p in &report.removed {
        println!("{verb} {}", p.display());
    }
    println!(
        "{verb} {} folders ({:.1} MiB), kept {}",
        report.removed.len(),
        report.bytes as f64 / (1024.0 * 1024.0),
        report.kept
    );
    Ok(ExitCode::SUCCESS)
}

pub fn size(
    args: &RecipeArgs,
    dp: usize,
    micro_batch: usize,
    hardware: Option<&str>,
    gpus: Option<usize>,
) -> Result<ExitCode> {
    let engine = open(args)?;
    let doc = &engine.recipe.document;
    let model = zflow_stages::model::ModelSection::config(doc)
        .map_err(|e| anyhow::anyhow!("{}: {}", e.path, e.message))?;
    // One report per phase (sequence length differs); without phases, ZAYA1's 4K context.
    let mut phases: Vec<(String, usize)> = zflow_stages::phases::parse(doc)
        .map_err(|e| anyhow::anyhow!("{}: {}", e.path, e.message))?
        .into_iter()
        .map(|(name, phase)| (name, phase.seq_len))
        .collect();
    if phases.is_empty() {
        phases.push(("(no phases)".into(), 4096));
    }
    for (i, (phase, seq_len)) in phases.iter().enumerate() {
        if i > 0 {
            println!();
        }
        println!(
            "== {} phase {phase}: seq_len {seq_len}, dp {dp}, micro-batch {micro_batch}",
            engine.recipe.name
        );
        print!("{}", model.report(*seq_len, micro_batch, dp));
    }
    if let Some(name) = hardware {
        project(doc, &model, name, gpus)?;
    }
    Ok(ExitCode::SUCCESS)
}

/// The cost projection part of `zflow size --hardware`: every phase's step time, tokens/s,
/// GPU-hours and days on the named hardware (or this machine, measured now).
fn project(
    doc: &serde_json::Value,
    model: &zflow_runtime::size::ModelConfig,
    name: &str,
    gpus: Option<usize>,
) -> Result<()> {
    use zflow_runtime::projection::{self, Assumptions, Hardware};
    let hw = match name {
        "this" => measure_this_machine()?,
        _ => Hardware::named(name)
            .with_context(|| format!("--hardware {name}: expected mi300x, h200 or this"))?,
    };
    let a = Assumptions::default();
    println!("
== cost projection on {} ({}): bf16 {:.1} TFLOP/s x {:.0}% for GEMMs, memory {:.0} GB/s, link {:.1} GB/s bus bandwidth", hw.name, hw.source, hw.bf16_tflops, 100.0 * a.gemm_efficiency, hw.hbm_gbps, hw.link_gbps);
    println!(
        "   step = max(compute, memory) + exchange (no overlap assumed); see runtime/src/projection.rs"
    );
    let phases = zflow_stages::phases::parse(doc)
        .map_err(|e| anyhow::anyhow!("{}: {}", e.path, e.message))?;
    if phases.is_empty() {
        println!("   (the recipe has no phases)");
        return Ok(());
    }
    println!(
        "{:<10} {:>6} {:>7} {:>9} {:>9} {:>9} {:>9} {:>12} {:>6} {:>12} {:>8}",
        "phase",
        "gpus",
        "seq",
        "compute",
        "memory",
        "exchange",
        "step s",
        "tokens/s",
        "MFU",
        "GPU-hours",
        "days"
    );
    let (mut total_gpu_hours, mut total_days) = (0.0, 0.0);
    for (phase, v) in &phases {
        let (train, launch) =
            zflow_stages::train::TrainSection::settings(doc, phase, v.train.as_ref())
                .map_err(|e| anyhow::anyhow!("{}: {}", e.path, e.message))?;
        let (seq_len, tokens) = (v.seq_len, v.tokens as f64);
        let n = gpus.unwrap_or(launch.data_parallel);
        let s = projection::step(
            model,
            seq_len,
            train.global_batch,
            train.micro_batch,
            n,
            &hw,
            &a,
        );
        let (_, _, gpu_hours, days) = projection::phase(&s, tokens, n);
        total_gpu_hours += gpu_hours;
        total_days += days;
        println!(
            "{phase:<10} {n:>6} {seq_len:>7} {:>9.3} {:>9.3} {:>9.3} {:>9.3} {:>12.0} {:>5.0}% {:>12.2} {:>8.2}",
            s.compute_s,
            s.memory_s,
            s.comm_s,
            s.step_s,
            s.tokens_per_s,
            100.0 * s.mfu,
            gpu_hours,
            days
        );
        if hw.name == "MI300X" && seq_len == 4096 && train.global_batch == 4096 {
            println!(
                "{:<10} ZAYA1 report: ~2.5 s per step at 4096 x 4096 tokens on 1024 MI300X; projected {:.2} s on {n}: ratio {:.2}",
                "",
                s.step_s,
                s.step_s / 2.5
            );
        }
    }
    println!(
        "{:<10} {:>89.2} {:>8.2}",
        "all phases", total_gpu_hours, total_days
    );
    Ok(())
}

/// This machine as a [`Hardware`]: burn's f32 matmul peak (as the "bf16" throughput, with the
/// efficiency applied on top), STREAM triad, and the ring's all-reduce bus bandwidth between
/// two threads over loopback.
fn measure_this_machine() -> Result<zflow_runtime::projection::Hardware> {
    use zflow_runtime::collective::{Group, Placement};
    let gflops = zflow_runtime::bench::matmul_gflops(1024, 3);
    let threads = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    let membw = zflow_runtime::microbench::stream_gbps(
        zflow_runtime::microbench::Stream::Triad,
        8 << 20,
        threads,
        3,
    );
    let bytes = 64usize << 20;
    let handles: Vec<_> = Placement::local(2)?
        .into_iter()
        .map(|p| {
            std::thread::spawn(move || -> Result<f64> {
                let mut g = Group::join(&p)?;
                let mut buf = vec![1.0f32; bytes / 4];
                g.all_reduce_sum(&mut buf)?;
                let t = Instant::now();
                for _ in 0..3 {
                    g.all_reduce_sum(&mut buf)?;
                }
                Ok(t.elapsed().as_secs_f64() / 3.0)
            })
        })
        .collect();
    let mut secs = 0.0;
    for h in handles {
        secs = h
            .join()
            .map_err(|_| anyhow::anyhow!("a measuring thread panicked"))??;
    }
    // Bus bandwidth of a 2-rank all-reduce: bytes / time x 2(n-1)/n = bytes / time.
    let busbw = bytes as f64 / secs / 1e9;
    Ok(zflow_runtime::projection::Hardware {
        name: "this machine".into(),
        bf16_tflops: gflops / 1e3,
        hbm_gbps: membw,
        link_gbps: busbw,
        source: format!(
            "measured now: matmul {gflops:.1} GFLOP/s f32, STREAM triad {membw:.1} GB/s, ring all-reduce {busbw:.2} GB/s"
        ),
    })
}

/// `zflow ckpt export --format hf`: the model the checkpoint was trained with (its model.json,
/// or the train job next to it); `recipe`'s `model:` only for a checkpoint that records neither.
pub fn ckpt_export(
    checkpoint: &Path,
    out: &Path,
    tokenizer: Option<PathBuf>,
    recipe: Option<&Path>,
) -> Result<ExitCode> {
    let model = match (zflow_runtime::checkpoint::model_config(checkpoint), recipe) {
        (Ok(model), _) => model,
        (Err(_), Some(path)) => {
            let opts = LoadOptions {
                sets: Vec::new(),
                store: None,
            };
            let recipe = recipe::load(path, &opts, &zflow_stages::registry())?;
            zflow_stages::model::ModelSection::config(&recipe.document)
                .map_err(|e| anyhow::anyhow!("{}: {}: {}", path.display(), e.path, e.message))?
        }
        (Err(e), None) => return Err(e),
    };
    let opts = zflow_runtime::hf::ExportOptions {
        tokenizer,
        ..Default::default()
    };
    zflow_runtime::hf::export_hf(checkpoint, &model, &opts, out)?;
    println!(
        "exported {} to {} (Hugging Face, model_type zaya)",
        checkpoint.display(),
        out.display()
    );
    Ok(ExitCode::SUCCESS)
}

/// `zflow ckpt import`: a Hugging Face ZAYA1 folder as a zflow checkpoint.
pub fn ckpt_import(hf: &Path, out: &Path) -> Result<ExitCode> {
    let model = zflow_runtime::hf::import_hf(hf, out)?;
    println!(
        "imported {} to {} ({} blocks, hidden {}, {} experts)",
        hf.display(),
        out.display(),
        model.num_blocks,
        model.hidden_size,
        model.num_experts
    );
    Ok(ExitCode::SUCCESS)
}

pub async fn query(store: &Path, sql: &str) -> Result<ExitCode> {
    if !store.join(".zflow").is_dir() {
        bail!(
            "{} is not a zflow store (no .zflow folder)",
            store.display()
        );
    }
    println!("{}", zflow_pipeline::query::query(store, sql).await?);
    Ok(ExitCode::SUCCESS)
}

/// `zflow bench ...`
#[derive(clap::Subcommand)]
pub enum Bench {
    /// Time `plan` and a no-op `run` on a generated recipe of N shell stages.
    Plan {
        /// Number of stages.
        #[arg(long, default_value_t = 2000)]
        stages: usize,
        /// Where to put the recipe and store (default: a temp folder).
        #[arg(long)]
        dir: Option<PathBuf>,
    },
    /// Tokenize one source of a recipe (whose `ingest.<source>` and `tokenizer` are complete)
    /// through zflow and through the Python `tokenizers` package's `encode_batch`, same
    /// tokenizer.json, same documents, one run.
    Tokenize {
        #[command(flatten)]
        recipe: RecipeArgs,
        /// The source to tokenize.
        #[arg(long)]
        source: String,
    },
    /// All-reduce, reduce-scatter, all-gather and broadcast of the trainer's collectives
    /// between worker processes: time, algorithm and bus bandwidth per message size and rank
    /// count (nccl-tests' definitions); `collectives.parquet` in `--out`.
    Collectives {
        /// Rank counts, comma-separated.
        #[arg(long, value_delimiter = ',', default_value = "2,4")]
        ranks: Vec<usize>,
        /// Largest message in bytes (sizes are powers of two from 1 KiB).
        #[arg(long, default_value_t = 256 << 20)]
        max_bytes: u64,
        /// Where `collectives.parquet` goes.
        #[arg(long, default_value = "zflow-bench")]
        out: PathBuf,
    },
    /// GEMM throughput over the recipe model's matrix shapes, and the same shapes off
    /// 64-alignment, on the worker backend; `gemm.parquet` in `--out`.
    Gemm {
        #[command(flatten)]
        recipe: RecipeArgs,
        /// Backend: cpu, cuda or rocm.
        #[arg(long, default_value = "cpu")]
        backend: String,
        /// Tokens per GEMM (the m dimension).
        #[arg(long, default_value_t = 2048)]
        tokens: usize,
        /// Where `gemm.parquet` goes.
        #[arg(long, default_value = "zflow-bench")]
        out: PathBuf,
    },
    /// STREAM memory bandwidth (copy, scale, add, triad) on one thread and on all;
    /// `membw.parquet` in `--out`.
    Membw {
        /// MiB per array.
        #[arg(long, default_value_t = 256)]
        mib: usize,
        /// Where `membw.parquet` goes.
        #[arg(long, default_value = "zflow-bench")]
        out: PathBuf,
    },
    /// One rank of `bench collectives` (started by it).
    #[command(hide = true)]
    CollectiveRank {
        #[arg(long)]
        max_bytes: u64,
    },
    /// One rank's device probe for the `preflight` stage (started by it): a JSON line.
    #[command(hide = true)]
    ProbeRank {
        /// Backend: cpu, cuda or rocm.
        #[arg(long, default_value = "cpu")]
        backend: String,
        /// The rank (for `ZFLOW_FAULTS`' slow@0 on that rank).
        #[arg(long, default_value_t = 0)]
        rank: usize,
        /// Device index.
        #[arg(long, default_value_t = 0)]
        device: usize,
    },
    /// Checkpoint write throughput against `dd` on the same disk, and the step-time cost of
    /// checkpointing in the background and inline, in one run.
    Checkpoint {
        #[command(flatten)]
        recipe: RecipeArgs,
        /// Scratch folder on the disk to measure (default: the store's).
        #[arg(long)]
        dir: Option<PathBuf>,
        /// Training steps per mode.
        #[arg(long, default_value_t = 20)]
        steps: u64,
        /// A checkpoint every this many steps.
        #[arg(long, default_value_t = 5)]
        every: u64,
        /// Sequences per step.
        #[arg(long, default_value_t = 16)]
        batch: usize,
        /// Tokens per sequence.
        #[arg(long, default_value_t = 256)]
        seq_len: usize,
    },
    /// The training step of the recipe's model: tokens/s and model FLOP/s against this
    /// machine's matmul peak and against PyTorch on the same model, in one run.
    Train {
        #[command(flatten)]
        recipe: RecipeArgs,
        /// Sequences per step.
        #[arg(long, default_value_t = 16)]
        batch: usize,
        /// Tokens per sequence.
        #[arg(long, default_value_t = 256)]
        seq_len: usize,
        /// Timed steps (the best one is reported).
        #[arg(long, default_value_t = 3)]
        steps: usize,
        /// Rounds, each timing zflow's step and then PyTorch's.
        #[arg(long, default_value_t = 2)]
        rounds: usize,
    },
}

pub async fn bench(what: Bench) -> Result<ExitCode> {
    match what {
        Bench::Plan { stages, dir } => bench_plan(stages, dir).await,
        Bench::Tokenize { recipe, source } => crate::bench_tokenize::run(&recipe, &source),
        Bench::Train {
            recipe,
            batch,
            seq_len,
            steps,
            rounds,
        } => crate::bench_train::run(&recipe, batch, seq_len, steps, rounds),
        Bench::Collectives {
            ranks,
            max_bytes,
            out,
        } => crate::bench_collectives::run(&ranks, max_bytes, &out),
        Bench::CollectiveRank { max_bytes } => crate::bench_collectives::rank(max_bytes),
        Bench::Gemm {
            recipe,
            backend,
            tokens,
            out,
        } => crate::bench_hw::gemm(&recipe, &backend, tokens, &out),
        Bench::ProbeRank {
            backend,
            rank,
            device,
        } => {
            let slow_ms = zflow_runtime::faults::Faults::from_env(rank)?.delay_ms(0);
            let (device, probe) =
                zflow_runtime::preflight::probe_backend(&backend, device, slow_ms)?;
            let line = zflow_stages::preflight::RankProbe {
                host: zflow_pipeline::lease::hostname(),
                device,
                probe,
            };
            println!("{}", serde_json::to_string(&line)?);
            Ok(ExitCode::SUCCESS)
        }
        Bench::Membw { mib, out } => crate::bench_hw::membw(mib, &out),
        Bench::Checkpoint {
            recipe,
            dir,
            steps,
            every,
            batch,
            seq_len,
        } => crate::bench_checkpoint::run(&recipe, dir.as_deref(), steps, every, batch, seq_len),
    }
}

/// A recipe of `n` stages: a chain with fan-in (stage i needs i-1 and i/2), every stage a
/// tiny shell command.
pub fn generated_recipe(n: usize) -> String {
    let mut y = String::from("name: bench\nstages:\n");
    for i in 0..n {
        y.push_str(&format!(
            "  - name: s{i}\n    kind: shell\n    run: echo {i} > \"$ZFLOW_OUT/x\"\n"
        ));
        if i > 0 {
            let mut needs = vec![format!("s{}", i - 1)];
            if i / 2 != i - 1 {
                needs.push(format!("s{}", i / 2));
            }
            y.push_str(&format!("    needs: [{}]\n", needs.join(", ")));
        }
    }
    y
}

async fn bench_plan(n: usize, dir: Option<PathBuf>) -> Result<ExitCode> {
    let tmp;
    let dir = match dir {
        Some(d) => {
            std::fs::create_dir_all(&d)?;
            d
        }
        None => {
            tmp = tempdir()?;
            tmp.clone()
        }
    };
    let recipe_path = dir.join("bench.yaml");
    std::fs::write(&recipe_path, generated_recipe(n))?;
    let args = RecipeArgs {
        recipe: recipe_path.clone(),
        sets: vec![],
        store: Some(dir.join("store")),
    };

    let t = Instant::now();
    let engine = open(&args)?;
    let load = t.elapsed();
    let t = Instant::now();
    let states = engine.plan(&BTreeSet::new())?;
    let plan_time = t.elapsed();
    let to_run = states
        .iter()
        .filter(|s| !matches!(s, StageState::Cached { .. }))
        .count();
    println!(
        "{n} stages: load {:.3}s, plan {:.3}s ({to_run} to run)",
        load.as_secs_f64(),
        plan_time.as_secs_f64()
    );

    let quiet = Progress::new(zflow_pipeline::progress::Mode::Quiet);
    let cores = std::thread::available_parallelism()
        .map(|n| n.get() as u32)
        .unwrap_or(1);
    let run_all = |engine: Engine| RunOptions {
        selected: (0..engine.graph.nodes().len()).collect(),
        force: BTreeSet::new(),
        cpus: cores,
        gpus: 0,
        memory_gb: f64::MAX,
        progress: quiet.clone(),
        cancel: CancelToken::default(),
    };
    let t = Instant::now();
    let opts = run_all(open(&args)?);
    let first = run::run(Arc::new(engine), opts).await?;
    println!(
        "first run: {} stages ran in {:.2}s",
        first.ran.len(),
        t.elapsed().as_secs_f64()
    );
    let t = Instant::now();
    let engine = open(&args)?;
    let states = engine.plan(&BTreeSet::new())?;
    let cached_plan = t.elapsed();
    println!(
        "plan when all cached (load + plan): {:.3}s ({} cached)",
        cached_plan.as_secs_f64(),
        states
            .iter()
            .filter(|s| matches!(s, StageState::Cached { .. }))
            .count()
    );
    let t = Instant::now();
    let opts = run_all(open(&args)?);
    let second = run::run(Arc::new(engine), opts).await?;
    println!(
        "no-op run (load + run, all cached): {:.3}s ({} ran, {} cached)",
        t.elapsed().as_secs_f64(),
        second.ran.len(),
        second.cached.len()
    );
    Ok(ExitCode::SUCCESS)
}

fn tempdir() -> Result<PathBuf> {
    let d = std::env::temp_dir().join(format!("zflow-bench-{}-{}", std::process::id(), now_ms()));
    std::fs::create_dir_all(&d)?;
    Ok(d)
}

/// `zflow ckpt reshape IN OUT --dp N [--ep M]`.
pub fn ckpt_reshape(input: &Path, out: &Path, dp: usize, ep: usize) -> Result<ExitCode> {
    let layout = zflow_runtime::zero::reshape(input, out, dp, ep)?;
    let load: Vec<String> = layout
        .load()
        .iter()
        .map(|n| format!("{:.2}M", *n as f64 / 1e6))
        .collect();
    println!(
        "{} -> {}: optimizer state over {} data-parallel rank(s) ({} parameters each), experts over {} expert-parallel rank(s)",
        input.display(),
        out.display(),
        layout.dp,
        load.join(" / "),
        layout.ep
    );
    Ok(ExitCode::SUCCESS)
}
