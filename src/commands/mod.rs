//! The subcommands: each loads what it needs, calls the engine, prints.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use zflow_pipeline::plan::{self, Engine, StageState};
use zflow_pipeline::progress::Progress;
use zflow_pipeline::run::{self, RunOptions};
use zflow_pipeline::store::now_ms;
use zflow_pipeline::{CancelToken, LoadOptions, recipe};

use crate::RecipeArgs;

mod ckpt;
mod query;
pub mod size;

pub use ckpt::{ckpt_export, ckpt_import, ckpt_reshape};
pub use size::size;

/// Loads the recipe (with every stage kind registered) and opens its store.
pub fn open(args: &RecipeArgs) -> Result<Engine> {
    let opts = LoadOptions {
        sets: args.sets.clone(),
        store: args.store.clone(),
    };
    let recipe = recipe::load(&args.recipe, &opts, &zflow_stages::registry())?;
    Engine::open(recipe)
}

/// The recipe's typed sections. The recipe already loaded (its sections expanded without
/// error), so this only fails if the document changed under us.
pub fn recipe_doc(engine: &Engine) -> Result<zflow_stages::recipe::RecipeDoc> {
    zflow_stages::recipe::RecipeDoc::parse(&engine.recipe.document)
        .map_err(|e| anyhow::anyhow!("{}: {}", e.path, e.message))
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
    /// Serve the web page while the run goes on.
    pub ui: Option<zflow_ui::Options>,
}

/// Binds the web page of `engine`'s recipe and says where it is.
async fn start_ui(engine: Arc<Engine>, opts: &zflow_ui::Options) -> Result<zflow_ui::Server> {
    let server = zflow_ui::bind(engine, opts).await?;
    if !opts.host.is_loopback() {
        tracing::warn!(
            "the ui listens on {}: other machines can reach it (each request needs its token)",
            opts.host
        );
    }
    Ok(server)
}

/// `zflow ui RECIPE`: serves the page until interrupted.
pub async fn ui(args: &RecipeArgs, opts: zflow_ui::Options) -> Result<ExitCode> {
    let engine = Arc::new(open(args)?);
    let server = start_ui(engine, &opts).await?;
    println!("zflow ui: {}", server.url());
    tokio::select! {
        served = server.run() => served?,
        _ = tokio::signal::ctrl_c() => {}
    }
    Ok(ExitCode::SUCCESS)
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
    let engine = Arc::new(engine);
    if let Some(ui) = &flags.ui {
        let server = start_ui(engine.clone(), ui).await?;
        // Printed under --quiet too: the page is useless without its address and token.
        progress.notice(&format!("zflow ui: {}", server.url()));
        tokio::spawn(async move {
            if let Err(e) = server.run().await {
                tracing::warn!("{e:#}");
            }
        });
    }
    let summary = run::run(engine, opts).await?;
    if flags.ui.is_some() {
        progress.println(&format!(
            "the run is over, and its page with it: `zflow ui {}` shows the store",
            args.recipe.display()
        ));
    }
    for (stage, why) in &summary.unrecorded {
        progress.notice(&format!(
            "warning: the run record of `{stage}`'s attempt could not be written ({why}); `zflow status` and `zflow query` will not show that attempt"
        ));
    }
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

pub fn plan(
    args: &RecipeArgs,
    force: &[String],
    launch: Option<&str>,
    hardware: Option<&str>,
) -> Result<ExitCode> {
    let engine = open(args)?;
    if let Some(name) = hardware {
        size::check_fits(&recipe_doc(&engine)?, &args.recipe, name)?;
    }
    let force = indices(&engine, force)?;
    let states = engine.plan(&force)?;
    if let Some(stage) = launch {
        let Some(i) = engine.graph.position(stage) else {
            bail!("no stage named `{stage}` in {}", args.recipe.display())
        };
        print!(
            "{}",
            zflow_pipeline::launch_plan::render(&engine, &states, i)?
        );
        return Ok(ExitCode::SUCCESS);
    }
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
    for line in plan::why(&engine, &states, i) {
        println!("{line}");
    }
    Ok(ExitCode::SUCCESS)
}

pub fn status(args: &RecipeArgs) -> Result<ExitCode> {
    let engine = open(args)?;
    let states = engine.plan(&BTreeSet::new())?;
    let statuses = zflow_pipeline::status::statuses(&engine, &states)?;
    let width = statuses.iter().map(|s| s.name.len()).max().unwrap_or(5);
    println!(
        "{} (store {})",
        engine.recipe.name,
        engine.store.root().display()
    );
    let now = now_ms();
    let mut counts = std::collections::BTreeMap::<&str, usize>::new();
    for &i in engine.graph.topo_order() {
        let s = &statuses[i];
        let word = s.state.word();
        *counts.entry(word).or_default() += 1;
        println!("  {word:<8} {:<width$}  {}", s.name, s.state.detail(now));
        if let Some(job) = &s.job {
            println!("  {:<8} {:<width$}    job: {job}", "", "");
        }
        // Training interruptions (restarts, loss-spike rollbacks) from the stage's events.
        if let Some(folder) = &s.folder {
            for event in zflow_stages::train::interruptions(folder) {
                println!("  {:<8} {:<width$}    {}", "", "", event.describe());
            }
        }
    }
    let summary: Vec<String> = counts.iter().map(|(k, v)| format!("{v} {k}")).collect();
    println!("{}", summary.join(", "));
    Ok(ExitCode::SUCCESS)
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

/// `zflow verify STORE [STAGE...]`: every complete output (of those stages) hashed again and
/// compared with its manifest.
pub fn verify(store: &Path, stages: &[String]) -> Result<ExitCode> {
    if !zflow_pipeline::store::Store::is_store(store) {
        bail!(
            "{} is not a zflow store (no .zflow/ folder from a run)",
            store.display()
        );
    }
    let store = zflow_pipeline::store::Store::open(store)?;
    let stage_of = |slot: &str| slot.rsplit_once('-').map_or(slot, |(s, _)| s).to_string();
    let folders = store.stage_folders()?;
    for s in stages {
        if !folders.iter().any(|(_, slot)| stage_of(slot) == *s) {
            bail!("the store has no output of a stage named `{s}`");
        }
    }
    let (mut checked, mut bad) = (0, 0);
    for (folder, slot) in folders {
        let dir = store.root().join(&folder);
        // Complete outputs only: partial and attempt folders have no manifest yet.
        if folder != slot || !dir.join(zflow_pipeline::store::MANIFEST).exists() {
            continue;
        }
        if !stages.is_empty() && !stages.contains(&stage_of(&slot)) {
            continue;
        }
        checked += 1;
        let differences = zflow_pipeline::store::verify(&dir)?;
        if differences.is_empty() {
            println!("ok      {folder}");
        } else {
            bad += 1;
            println!("CHANGED {folder}");
            for d in differences {
                println!("  {d}");
            }
        }
    }
    println!("{checked} outputs verified, {bad} changed");
    Ok(if bad == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
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

pub async fn query(store: &Path, sql: &str) -> Result<ExitCode> {
    if !store.join(".zflow").is_dir() {
        bail!(
            "{} is not a zflow store (no .zflow folder)",
            store.display()
        );
    }
    println!("{}", query::query(store, sql).await?);
    Ok(ExitCode::SUCCESS)
}
