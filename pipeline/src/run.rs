//! The scheduler: runs the selected stages in dependency order on tokio, as many at a time as
//! the resource slots (cpus = `-j`, gpus, memory) allow.
//!
//! Each stage attempt: take the stage's lease -> re-check the store (another run may have
//! finished it) -> run in a fresh attempt folder (or the partial folder of a resumable stage)
//! on a blocking thread -> commit (manifest last, atomic rename) -> append a run record.
//! A failed stage stops its dependents only; independent branches go on. Ctrl-C / SIGTERM
//! cancel running stages (their children get SIGTERM, then SIGKILL) and start nothing new.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Result, anyhow, bail, ensure};
use tokio::sync::mpsc;

use crate::identity::IdentityDoc;
use crate::lease::{self, Acquire, LeaseGuard};
use crate::logging;
use crate::plan::Engine;
use crate::progress::Progress;
use crate::recipe::ExecutorConfig;
use crate::records::{self, RunRecord, Status};
use crate::slurm;
use crate::stage::{CancelToken, Resources, StageContext, StageLog};
use crate::store::{Manifest, now_ms};

/// What to run and with how much.
pub struct RunOptions {
    /// Stages selected to run (node indices); inputs outside it must already be complete.
    pub selected: BTreeSet<usize>,
    /// Stages to re-run even when cached.
    pub force: BTreeSet<usize>,
    /// CPU slots (`-j`).
    pub cpus: u32,
    /// GPU slots.
    pub gpus: u32,
    /// Memory in GiB.
    pub memory_gb: f64,
    /// The progress display.
    pub progress: Progress,
    /// Set to stop.
    pub cancel: CancelToken,
}

/// How a run ended.
#[derive(Debug, Default)]
pub struct RunSummary {
    /// Stages that ran and committed output.
    pub ran: Vec<String>,
    /// Stages found complete.
    pub cached: Vec<String>,
    /// Stages that failed: (name, error, log path).
    pub failed: Vec<(String, String, PathBuf)>,
    /// Stages not run because an input failed (or the run was cancelled).
    pub skipped: Vec<String>,
    /// Whether the run was cancelled.
    pub cancelled: bool,
    /// Attempts whose run record could not be written: (stage, why). `zflow status` and
    /// `zflow query` do not see them, so the caller must say so.
    pub unrecorded: Vec<(String, String)>,
}

impl RunSummary {
    /// Whether everything selected completed.
    pub fn success(&self) -> bool {
        self.failed.is_empty() && self.skipped.is_empty() && !self.cancelled
    }
}

#[derive(Clone, Debug)]
enum NodeState {
    Pending,
    /// Another run holds the lease; we look again later.
    WaitingLease {
        retry_at: Instant,
    },
    Running,
    Done {
        manifest: Arc<Manifest>,
        dir: PathBuf,
    },
    Failed,
    Skipped,
}

struct Finished {
    index: usize,
    result: Result<Manifest>,
    log: PathBuf,
    /// Why the attempt's run record could not be written, if it could not.
    unrecorded: Option<String>,
}

/// Selects stages by the `--only/--from/--until` flags (by name).
pub fn select(
    engine: &Engine,
    only: &[String],
    from: &[String],
    until: &[String],
) -> Result<BTreeSet<usize>> {
    let g = &engine.graph;
    let check = |names: &[String]| -> Result<()> {
        for n in names {
            if g.position(n).is_none() {
                let all: Vec<&str> = g.nodes().iter().map(|n| n.name.as_str()).collect();
                bail!(
                    "no stage named `{n}` in {} (stages: {})",
                    engine.recipe.path.display(),
                    all.join(", ")
                );
            }
        }
        Ok(())
    };
    check(only)?;
    check(from)?;
    check(until)?;
    if !only.is_empty() {
        return Ok(only.iter().filter_map(|n| g.position(n)).collect());
    }
    let mut set: BTreeSet<usize> = (0..g.nodes().len()).collect();
    if !from.is_empty() {
        let reach: BTreeSet<usize> = from.iter().flat_map(|n| g.descendants(n)).collect();
        set = set.intersection(&reach).copied().collect();
    }
    if !until.is_empty() {
        let reach: BTreeSet<usize> = until.iter().flat_map(|n| g.ancestors(n)).collect();
        set = set.intersection(&reach).copied().collect();
    }
    Ok(set)
}

/// Runs the selected stages. Returns when all are done, failed, skipped or cancelled.
pub async fn run(engine: Arc<Engine>, opts: RunOptions) -> Result<RunSummary> {
    let nodes = engine.graph.nodes();
    let run_id = format!("{}-{}", now_ms(), std::process::id());
    let mut states: Vec<NodeState> = vec![NodeState::Pending; nodes.len()];
    let mut summary = RunSummary::default();
    records::remove_stale_temporaries(&engine.store.records_dir());

    // Inputs outside the selection must already be complete: resolve them first.
    let plan = engine.plan(&BTreeSet::new())?;
    for (i, state) in plan.iter().enumerate() {
        if opts.selected.contains(&i) {
            continue;
        }
        if let crate::plan::StageState::Cached { manifest } = state {
            let dir = engine.output_dir(&nodes[i].name, &manifest.identity);
            states[i] = NodeState::Done {
                manifest: manifest.clone(),
                dir,
            };
        }
    }
    for &i in &opts.selected {
        for &input in &engine.graph.inputs_of(i) {
            if !opts.selected.contains(&input) && !matches!(states[input], NodeState::Done { .. }) {
                bail!(
                    "stage `{}` needs `{}`, which is not complete in the store and not selected to run; \
                     run it first (e.g. `--until {}`) or drop --only/--from",
                    nodes[i].name,
                    nodes[input].name,
                    nodes[i].name
                );
            }
        }
    }

    // This machine is one node: a stage that spans several runs under Slurm only. Refused
    // before anything runs.
    if matches!(engine.recipe.executor, ExecutorConfig::Local) {
        for &i in &opts.selected {
            let n = nodes[i].resources.nodes;
            ensure!(
                n <= 1,
                "stage `{}` spans {n} nodes, and a local run has this machine only: run the recipe \
                 with the Slurm executor (`executor: {{kind: slurm}}`), or on one node",
                nodes[i].name
            );
        }
    }

    // On Slurm the cluster's scheduler places jobs: submit whatever is ready.
    let capacity = match engine.recipe.executor {
        ExecutorConfig::Local => Resources {
            cpus: opts.cpus.max(1),
            gpus: opts.gpus,
            memory_gb: opts.memory_gb,
            ..Default::default()
        },
        ExecutorConfig::Slurm(_) => Resources {
            cpus: u32::MAX / 2,
            gpus: u32::MAX / 2,
            memory_gb: f64::MAX / 4.0,
            ..Default::default()
        },
    };
    let mut free = capacity.clone();
    let (tx, mut rx) = mpsc::unbounded_channel::<Finished>();
    let mut running = 0usize;
    let mut leases: BTreeMap<usize, LeaseGuard> = BTreeMap::new();
    let mut held: BTreeMap<usize, Resources> = BTreeMap::new();

    loop {
        let cancelled = opts.cancel.is_cancelled();
        let mut progressed = false;
        let mut next_wake: Option<Instant> = None;
        for &i in engine.graph.topo_order() {
            if !opts.selected.contains(&i) {
                continue;
            }
            let retry_due = match &states[i] {
                NodeState::Pending => true,
                NodeState::WaitingLease { retry_at } => {
                    if *retry_at > Instant::now() {
                        next_wake =
                            Some(next_wake.map_or(*retry_at, |w: Instant| w.min(*retry_at)));
                    }
                    *retry_at <= Instant::now()
                }
                _ => false,
            };
            if !retry_due {
                continue;
            }
            let node = &nodes[i];
            let inputs = engine.graph.inputs_of(i);
            if inputs
                .iter()
                .any(|&j| matches!(states[j], NodeState::Failed | NodeState::Skipped))
            {
                states[i] = NodeState::Skipped;
                summary.skipped.push(node.name.clone());
                progressed = true;
                continue;
            }
            if cancelled {
                states[i] = NodeState::Skipped;
                summary.skipped.push(node.name.clone());
                progressed = true;
                continue;
            }
            if !inputs
                .iter()
                .all(|&j| matches!(states[j], NodeState::Done { .. }))
            {
                continue;
            }
            let mut complete = BTreeMap::new();
            let mut input_dirs = BTreeMap::new();
            for &j in &inputs {
                if let NodeState::Done { manifest, dir } = &states[j] {
                    complete.insert(nodes[j].name.clone(), manifest.clone());
                    input_dirs.insert(nodes[j].name.clone(), dir.clone());
                }
            }
            let doc = match engine.identity_doc(node, &complete) {
                Ok(doc) => doc,
                Err(e) => {
                    fail(
                        &mut states,
                        &mut summary,
                        i,
                        node.name.clone(),
                        format!("{e:#}"),
                        PathBuf::new(),
                    );
                    progressed = true;
                    continue;
                }
            };
            let identity = doc.hash();
            if !opts.force.contains(&i)
                && let Some(m) = engine.store.manifest(&node.name, &identity)
            {
                states[i] = NodeState::Done {
                    manifest: Arc::new(m),
                    dir: engine.output_dir(&node.name, &identity),
                };
                summary.cached.push(node.name.clone());
                tracing::debug!("cached {}", node.name);
                progressed = true;
                continue;
            }
            // Resources: clamp to capacity so an oversized stage still runs (alone).
            let want = Resources {
                cpus: node.resources.cpus.clamp(1, capacity.cpus),
                gpus: node.resources.gpus,
                memory_gb: node.resources.memory_gb.min(capacity.memory_gb),
                ..Default::default()
            };
            if want.gpus > capacity.gpus {
                let msg = format!(
                    "needs {} GPU(s) but {} are available to this run (see --gpus)",
                    want.gpus, capacity.gpus
                );
                fail(
                    &mut states,
                    &mut summary,
                    i,
                    node.name.clone(),
                    msg,
                    PathBuf::new(),
                );
                progressed = true;
                continue;
            }
            if want.cpus > free.cpus
                || want.gpus > free.gpus
                || want.memory_gb > free.memory_gb + 1e-9
            {
                continue;
            }
            let lease_path = engine.store.lease_path(&node.name, &identity);
            let reads: Vec<String> = input_dirs
                .values()
                .filter_map(|d| d.file_name().map(|n| n.to_string_lossy().into_owned()))
                .collect();
            let guard = match lease::try_acquire(&lease_path, &run_id, &reads) {
                Ok(Acquire::Held(g)) => g,
                Ok(Acquire::Busy(info)) => {
                    if !matches!(states[i], NodeState::WaitingLease { .. }) {
                        opts.progress.println(&format!(
                            "  wait    {} is being run by pid {} on {}; waiting for it",
                            node.name, info.pid, info.host
                        ));
                    }
                    let at = Instant::now() + Duration::from_millis(500);
                    states[i] = NodeState::WaitingLease { retry_at: at };
                    next_wake = Some(next_wake.map_or(at, |w| w.min(at)));
                    continue;
                }
                Err(e) => {
                    fail(
                        &mut states,
                        &mut summary,
                        i,
                        node.name.clone(),
                        format!("{e:#}"),
                        PathBuf::new(),
                    );
                    progressed = true;
                    continue;
                }
            };
            // The other run may have finished while we waited for the lease.
            if !opts.force.contains(&i)
                && let Some(m) = engine.store.manifest(&node.name, &identity)
            {
                states[i] = NodeState::Done {
                    manifest: Arc::new(m),
                    dir: engine.output_dir(&node.name, &identity),
                };
                summary.cached.push(node.name.clone());
                progressed = true;
                continue;
            }
            // A gc that listed the leases before we took ours may have removed an input
            // since we found it cached; now that our lease names it, it stays.
            if let Some(gone) = inputs.iter().find(|&&j| {
                let NodeState::Done { dir, .. } = &states[j] else {
                    return false;
                };
                !dir.join(crate::store::MANIFEST).is_file()
            }) {
                let msg = format!(
                    "its input `{}` was removed from the store after this run found it \
                     (a `zflow gc` for other recipes?); run again to rebuild it",
                    nodes[*gone].name
                );
                drop(guard);
                fail(
                    &mut states,
                    &mut summary,
                    i,
                    node.name.clone(),
                    msg,
                    PathBuf::new(),
                );
                progressed = true;
                continue;
            }
            free.cpus -= want.cpus;
            free.gpus -= want.gpus;
            free.memory_gb -= want.memory_gb;
            held.insert(i, want.clone());
            leases.insert(i, guard);
            states[i] = NodeState::Running;
            running += 1;
            progressed = true;
            spawn_attempt(
                &engine,
                &opts,
                &run_id,
                i,
                doc,
                identity,
                input_dirs,
                want.cpus as usize,
                tx.clone(),
            );
        }

        if running == 0 && !progressed {
            let waiting = states
                .iter()
                .any(|s| matches!(s, NodeState::WaitingLease { .. }));
            if !waiting {
                break;
            }
        }
        if progressed && running == 0 {
            continue;
        }
        // Wait for a stage to finish, a lease retry to come due, or a signal.
        let sleep_for = next_wake
            .map(|w| w.saturating_duration_since(Instant::now()))
            .unwrap_or(Duration::from_millis(250));
        let finished = tokio::select! {
            f = rx.recv() => f,
            _ = tokio::time::sleep(sleep_for) => None,
        };
        let Some(Finished {
            index,
            result,
            log,
            unrecorded,
        }) = finished
        else {
            continue;
        };
        running -= 1;
        if let Some(why) = unrecorded {
            summary.unrecorded.push((nodes[index].name.clone(), why));
        }
        if let Some(r) = held.remove(&index) {
            free.cpus += r.cpus;
            free.gpus += r.gpus;
            free.memory_gb += r.memory_gb;
        }
        leases.remove(&index);
        let name = nodes[index].name.clone();
        match result {
            Ok(m) => {
                states[index] = NodeState::Done {
                    dir: engine.output_dir(&name, &m.identity),
                    manifest: Arc::new(m),
                };
                summary.ran.push(name);
            }
            Err(e) => {
                let msg = format!("{e:#}");
                if opts.cancel.is_cancelled() && msg.contains("cancelled") {
                    summary.cancelled = true;
                    states[index] = NodeState::Skipped;
                    summary.skipped.push(name);
                } else {
                    fail(&mut states, &mut summary, index, name, msg, log);
                }
            }
        }
    }
    summary.cancelled |= opts.cancel.is_cancelled();
    Ok(summary)
}

fn fail(
    states: &mut [NodeState],
    summary: &mut RunSummary,
    i: usize,
    name: String,
    msg: String,
    log: PathBuf,
) {
    tracing::error!("{name} failed: {msg}");
    states[i] = NodeState::Failed;
    summary.failed.push((name, msg, log));
}

#[allow(clippy::too_many_arguments)]
fn spawn_attempt(
    engine: &Arc<Engine>,
    opts: &RunOptions,
    run_id: &str,
    index: usize,
    doc: IdentityDoc,
    identity: String,
    inputs: BTreeMap<String, PathBuf>,
    threads: usize,
    tx: mpsc::UnboundedSender<Finished>,
) {
    let engine = engine.clone();
    let progress = opts.progress.clone();
    let cancel = opts.cancel.clone();
    let run_id = run_id.to_string();
    tokio::task::spawn_blocking(move || {
        let node = &engine.graph.nodes()[index];
        let log_path = engine.store.log_path(&node.name, &identity);
        let start_ms = now_ms();
        let stage_progress = progress.stage(&node.name);
        let job = std::sync::Mutex::new(None::<String>);
        progress.println(&format!("  start   {}", node.name));
        // A non-resumable stage's attempt folder: committed (renamed) when it succeeds, removed
        // when it fails or is cancelled, as nothing ever resumes from it.
        let attempt_dir = (!node.stage.resumable())
            .then(|| engine.store.attempt_dir(&node.name, &identity, &run_id));
        let reserve = records::Reserve::hold(&engine.store.records_dir(), &node.name);
        let result = (|| -> Result<Manifest> {
            let log = StageLog::open(&log_path)?;
            log.line(&format!(
                "=== zflow {} run {run_id}: stage {} ({} v{}), identity {identity}",
                env!("CARGO_PKG_VERSION"),
                node.name,
                doc.kind,
                doc.version
            ));
            let work = match &attempt_dir {
                None => engine.store.partial_dir(&node.name, &identity),
                Some(dir) => {
                    clear_old_attempts(&engine, &node.name, &identity);
                    dir.clone()
                }
            };
            std::fs::create_dir_all(&work)?;
            let ctx = StageContext {
                name: node.name.clone(),
                out_dir: work.clone(),
                inputs,
                cwd: engine.cwd.clone(),
                cache_dir: engine.store.cache_dir(),
                threads,
                memory_gb: node.resources.memory_gb,
                cancel: cancel.clone(),
                progress: stage_progress.clone(),
                log: log.clone(),
            };
            logging::attach_stage_log(&node.name, log.clone());
            let span = tracing::info_span!("stage", name = %node.name);
            let outcome = {
                let _enter = span.enter();
                match &engine.recipe.executor {
                    // A panicking stage is a failed stage, not a crashed zflow.
                    ExecutorConfig::Local => {
                        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                            node.stage.run(&ctx)
                        }))
                        .unwrap_or_else(|p| Err(anyhow!("stage panicked: {}", panic_text(&p))))
                        // Hashed by the stage's process as it ends ([`crate::seal`]).
                        .and_then(|()| crate::seal::seal(&work, &cancel))
                    }
                    ExecutorConfig::Slurm(cfg) => {
                        let spec = slurm::ExecSpec {
                            stage: node.name.clone(),
                            kind: doc.kind.clone(),
                            config: node.config.clone(),
                            needs: node.needs.clone(),
                            inputs: ctx.inputs.clone(),
                            out_dir: work.clone(),
                            cwd: ctx.cwd.clone(),
                            cache_dir: ctx.cache_dir.clone(),
                            threads: node.resources.cpus.max(1) as usize,
                            memory_gb: node.resources.memory_gb,
                            log: log_path.clone(),
                        };
                        let (report, result) = slurm::run_stage(
                            cfg,
                            &spec,
                            &node.resources,
                            &cancel,
                            &stage_progress,
                            &log,
                        );
                        *job.lock().unwrap_or_else(|e| e.into_inner()) =
                            report.map(|r| r.describe());
                        result
                    }
                }
            };
            logging::detach_stage_log(&node.name);
            if let Err(e) = outcome {
                log.line(&format!("=== failed: {e:#}"));
                return Err(e);
            }
            cancel_check(&cancel)?;
            let manifest = Manifest {
                stage: node.name.clone(),
                identity: identity.clone(),
                identity_doc: doc.clone(),
                content_hash: String::new(),
                files: Vec::new(),
                started_ms: start_ms,
                finished_ms: 0,
                zflow_version: env!("CARGO_PKG_VERSION").to_string(),
            };
            let read_before = thread_read_bytes();
            let m = engine.store.commit(&node.name, &work, manifest, &cancel)?;
            let committing_read = thread_read_bytes().zip(read_before).map(|(a, b)| a - b);
            log.line(&format!(
                "=== done in {:.2}s, {} files, {} bytes; committing read {} bytes",
                (now_ms() - start_ms) as f64 / 1000.0,
                m.files.len(),
                m.files.iter().map(|f| f.size).sum::<u64>(),
                committing_read.map_or("an unknown number of".into(), |n| n.to_string())
            ));
            Ok(m)
        })();
        stage_progress.finish();
        if let (Err(_), Some(dir)) = (&result, &attempt_dir)
            && dir.exists()
            && let Err(e) = std::fs::remove_dir_all(dir)
        {
            tracing::warn!(
                "removing the failed attempt's folder {}: {e}",
                dir.display()
            );
        }
        let end_ms = now_ms();
        let secs = (end_ms - start_ms) as f64 / 1000.0;
        let status = match &result {
            Ok(_) => Status::Ok,
            Err(e) if cancel.is_cancelled() && format!("{e:#}").contains("cancelled") => {
                Status::Cancelled
            }
            Err(_) => Status::Failed,
        };
        match status {
            Status::Ok => progress.println(&format!("  done    {} ({secs:.1}s)", node.name)),
            Status::Cancelled => progress.println(&format!("  cancel  {} ({secs:.1}s)", node.name)),
            Status::Failed => progress.println(&format!(
                "  FAILED  {} ({secs:.1}s), log: {}",
                node.name,
                log_path.display()
            )),
        }
        let record = RunRecord {
            run_id,
            recipe: engine.recipe.name.clone(),
            stage: node.name.clone(),
            kind: doc.kind.clone(),
            identity,
            status,
            error: result.as_ref().err().map(|e| format!("{e:#}")),
            start_ms,
            end_ms,
            host: lease::hostname(),
            pid: std::process::id(),
            log: log_path.display().to_string(),
            job: job.into_inner().unwrap_or_else(|e| e.into_inner()),
        };
        // The held space, freed for the record: enough for it on a disk the attempt filled.
        drop(reserve);
        let unrecorded = records::append(&engine.store.records_dir(), &record)
            .err()
            .map(|e| format!("{e:#}"));
        let _ = tx.send(Finished {
            index,
            result,
            log: log_path,
            unrecorded,
        });
    });
}

fn cancel_check(cancel: &CancelToken) -> Result<()> {
    if cancel.is_cancelled() {
        bail!("cancelled");
    }
    Ok(())
}

/// Removes attempt folders of earlier (crashed) runs of this stage: we hold its lease, so
/// nobody else is writing them.
fn clear_old_attempts(engine: &Engine, name: &str, identity: &str) {
    let prefix = format!(
        "{}.tmp-",
        engine
            .store
            .output_dir(name, identity)
            .file_name()
            .unwrap_or_default()
            .to_string_lossy()
    );
    if let Ok(entries) = std::fs::read_dir(engine.store.root()) {
        for e in entries.flatten() {
            if e.file_name().to_string_lossy().starts_with(&prefix) {
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
    }
}

fn panic_text(p: &Box<dyn std::any::Any + Send>) -> String {
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "(no message)".into())
}

/// Bytes this thread has read through system calls (`rchar` of `/proc/thread-self/io`), where
/// Linux counts them: what the stage log reports a commit read.
fn thread_read_bytes() -> Option<u64> {
    let io = std::fs::read_to_string("/proc/thread-self/io").ok()?;
    io.lines()
        .find_map(|line| line.strip_prefix("rchar: "))?
        .trim()
        .parse()
        .ok()
}
