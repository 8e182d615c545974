//! The Slurm executor: each stage attempt is one `sbatch` job.
//!
//! ```yaml
//! executor: {kind: slurm, partition: gpu, account: lm, qos: high, time: "2-00:00:00",
//!            sbatch_args: ["--exclusive"], max_requeues: 3}
//! ```
//! The scheduler stays in `zflow run` and holds each stage until its inputs are complete (a
//! stage's identity hashes its inputs' *contents*, so it is only known then), so ordering needs
//! no Slurm dependencies. For a stage it writes `<log>.sbatch` (kept next to the stage's log)
//! and `<log>.spec.json` (what to run: kind, config, input folders, attempt folder), submits,
//! and polls `scontrol` until the job ends. The job runs `zflow exec-stage SPEC` on a node,
//! which runs the stage into the attempt folder on the shared store; `zflow run` then verifies
//! and commits it as it would a local attempt. The executor is not part of any identity, so a
//! recipe completed locally submits nothing.
//!
//! Failures: a poll that fails is retried (a busy controller is not a failed job); Ctrl-C
//! `scancel`s the job; a job lost to a node failure or preemption is requeued by Slurm
//! (`--requeue`) up to `max_requeues` (the script checks `SLURM_RESTART_COUNT`), and a
//! resumable stage (training) continues from its newest checkpoint in the same partial folder.
//! A job with a time limit requeues itself a minute before it (`--signal=B:USR1@60`, trapped
//! by the batch script), and such requeues do not count against `max_requeues`.
//! A failed job is reported with its id, state, exit code and the log paths.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};

use crate::progress::StageProgress;
use crate::stage::{CancelToken, Resources, StageLog};

/// The variable a stage running inside a Slurm job finds set to [`EXECUTOR_SLURM`] (the job
/// script exports it), so that its per-rank processes go out as `srun` steps.
pub const EXECUTOR_ENV: &str = "ZFLOW_EXECUTOR";
/// The value of [`EXECUTOR_ENV`] inside a Slurm job.
pub const EXECUTOR_SLURM: &str = "slurm";

/// `executor: {kind: slurm, ...}`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SlurmConfig {
    /// `--partition`.
    #[serde(default)]
    pub partition: Option<String>,
    /// `--account`.
    #[serde(default)]
    pub account: Option<String>,
    /// `--qos`.
    #[serde(default)]
    pub qos: Option<String>,
    /// Default `--time` for stages that set no `time_min` (Slurm's formats: `MM`, `HH:MM:SS`,
    /// `D-HH:MM:SS`).
    #[serde(default)]
    pub time: Option<String>,
    /// More `sbatch` options, verbatim.
    #[serde(default)]
    pub sbatch_args: Vec<String>,
    /// How often Slurm may requeue a stage's job (node failure, preemption) before it fails.
    #[serde(default = "default_requeues")]
    pub max_requeues: u32,
    /// Seconds between polls of a job's state.
    #[serde(default = "default_poll")]
    pub poll_s: f64,
    /// Stages of one kind that become ready within this many seconds of each other are
    /// submitted as one job array (0: every stage its own job).
    #[serde(default = "default_window")]
    pub array_window_s: f64,
}

impl SlurmConfig {
    /// Checks that every value stays on its own line of the batch script, as (recipe path,
    /// what is wrong): each becomes an `#SBATCH` line, and a line break in one would start a
    /// line of its own there, run as a command on the node.
    pub fn check(&self) -> Result<(), (String, String)> {
        let named = [
            ("partition", &self.partition),
            ("account", &self.account),
            ("qos", &self.qos),
            ("time", &self.time),
        ];
        let values = named
            .into_iter()
            .filter_map(|(name, v)| Some((name.to_string(), v.as_ref()?)))
            .chain(
                self.sbatch_args
                    .iter()
                    .enumerate()
                    .map(|(i, a)| (format!("sbatch_args[{i}]"), a)),
            );
        for (name, value) in values {
            if value.chars().any(char::is_control) {
                return Err((
                    format!("executor.{name}"),
                    format!(
                        "`{name}` must be one line without control characters (each executor value becomes a line of the batch script), got {value:?}"
                    ),
                ));
            }
        }
        Ok(())
    }
}

impl Default for SlurmConfig {
    fn default() -> Self {
        SlurmConfig {
            partition: None,
            account: None,
            qos: None,
            time: None,
            sbatch_args: Vec::new(),
            max_requeues: default_requeues(),
            poll_s: default_poll(),
            array_window_s: default_window(),
        }
    }
}

fn default_requeues() -> u32 {
    3
}
fn default_poll() -> f64 {
    2.0
}
fn default_window() -> f64 {
    0.5
}

/// Everything a job needs to run one stage attempt (`<log>.spec.json`).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ExecSpec {
    /// Stage name.
    pub stage: String,
    /// Stage kind.
    pub kind: String,
    /// The stage's canonical config.
    pub config: serde_json::Value,
    /// The stage's declared inputs.
    pub needs: Vec<String>,
    /// Input stage name -> its complete output folder.
    pub inputs: BTreeMap<String, PathBuf>,
    /// The attempt (or partial) folder to write.
    pub out_dir: PathBuf,
    /// The recipe's folder.
    pub cwd: PathBuf,
    /// The store's shared download cache.
    pub cache_dir: PathBuf,
    /// Threads the stage may use.
    pub threads: usize,
    /// The memory it declared (`--mem`), in GiB; 0: none.
    #[serde(default)]
    pub memory_gb: f64,
    /// The stage's log file.
    pub log: PathBuf,
}

/// What Slurm said about a job.
#[derive(Clone, Debug, PartialEq)]
pub struct JobState {
    /// `JobState=`.
    pub state: String,
    /// `ExitCode=` (`code:signal`).
    pub exit_code: String,
    /// `Restarts=`: how often it was requeued.
    pub restarts: u32,
}

/// Parses one line of `scontrol show job -o ID`.
pub fn parse_scontrol(line: &str) -> Option<JobState> {
    let field = |key: &str| {
        line.split_whitespace()
            .find_map(|kv| kv.strip_prefix(key))
            .map(str::to_string)
    };
    Some(JobState {
        state: field("JobState=")?,
        exit_code: field("ExitCode=").unwrap_or_else(|| "?".into()),
        restarts: field("Restarts=").and_then(|r| r.parse().ok()).unwrap_or(0),
    })
}

/// Whether a job in `state` is over (it will not run again without a new submission).
pub fn is_final(state: &str) -> bool {
    matches!(
        state,
        "COMPLETED"
            | "FAILED"
            | "CANCELLED"
            | "TIMEOUT"
            | "OUT_OF_MEMORY"
            | "BOOT_FAIL"
            | "DEADLINE"
            | "NODE_FAIL"
            | "PREEMPTED"
            | "SPECIAL_EXIT"
    )
}

/// The `#SBATCH` options for a stage's resources under `cfg`.
pub fn sbatch_options(
    cfg: &SlurmConfig,
    stage: &str,
    r: &Resources,
    output: &Path,
    cwd: &Path,
) -> Vec<String> {
    let ranks = r.ranks.max(1);
    let nodes = r.nodes.clamp(1, ranks);
    let mut o = vec![
        format!("--job-name=zflow-{stage}"),
        format!("--output={}", output.display()),
        format!("--chdir={}", cwd.display()),
        format!("--nodes={nodes}"),
        format!("--ntasks={ranks}"),
        format!("--cpus-per-task={}", r.cpus.max(1).div_ceil(ranks)),
        "--requeue".to_string(),
    ];
    if ranks > 1 {
        // Ranks fill nodes in blocks, the same number on each.
        o.push(format!("--ntasks-per-node={}", ranks.div_ceil(nodes)));
    }
    if r.gpus > 0 {
        o.push(format!("--gpus-per-node={}", r.gpus.div_ceil(nodes)));
    }
    if r.memory_gb > 0.0 {
        o.push(format!("--mem={}M", (r.memory_gb * 1024.0).ceil() as u64));
    }
    let limit_min = match (r.time_min, &cfg.time) {
        (0, Some(t)) => {
            o.push(format!("--time={t}"));
            slurm_minutes(t)
        }
        (0, None) => None,
        (m, _) => {
            o.push(format!("--time={m}"));
            Some(u64::from(m))
        }
    };
    // Only where the limit leaves the stage most of its time: a signal at the start of a
    // short job would requeue it forever.
    if limit_min.is_some_and(|m| m * 60 >= 10 * u64::from(TIME_LIMIT_LEAD_S)) {
        // The batch script requeues the job this long before its time limit (`script`): a
        // resumable stage (training) then goes on from its newest checkpoint.
        o.push(format!("--signal=B:USR1@{TIME_LIMIT_LEAD_S}"));
    }
    for (flag, v) in [
        ("partition", &cfg.partition),
        ("account", &cfg.account),
        ("qos", &cfg.qos),
    ] {
        if let Some(v) = v {
            o.push(format!("--{flag}={v}"));
        }
    }
    o.extend(cfg.sbatch_args.iter().cloned());
    o
}

/// Seconds before a job's time limit at which Slurm signals its batch script, which requeues
/// it (`--signal=B:USR1@...`), for limits of ten times this or more.
pub const TIME_LIMIT_LEAD_S: u32 = 60;

/// Minutes in a Slurm time limit (`MM`, `MM:SS`, `HH:MM:SS`, `D-HH`, `D-HH:MM`,
/// `D-HH:MM:SS`), rounded down; `None` for anything else (`INFINITE`, say).
fn slurm_minutes(text: &str) -> Option<u64> {
    let (days, rest) = match text.split_once('-') {
        Some((d, rest)) => (d.parse::<u64>().ok()?, rest),
        None => (0, text),
    };
    let parts: Vec<u64> = rest
        .split(':')
        .map(|p| p.parse().ok())
        .collect::<Option<_>>()?;
    let minutes = match (text.contains('-'), parts.as_slice()) {
        (false, [m]) => *m,
        (false, [m, _s]) => *m,
        (_, [h, m, _s]) => h * 60 + m,
        (true, [h]) => h * 60,
        (true, [h, m]) => h * 60 + m,
        _ => return None,
    };
    Some(days * 24 * 60 + minutes)
}

/// The batch script: options, the requeue limit, `zflow exec-stage`, the exit status recorded
/// in `<exit prefix><job id>` (so the outcome survives the job leaving Slurm's memory). Near a
/// time limit (`USR1`, [`TIME_LIMIT_LEAD_S`]) it requeues its job and writes no exit status:
/// the stage runs again, a resumable one from its newest checkpoint; such requeues are counted
/// in `<exit file>.time-requeues` and do not count against `max_requeues`. With
/// more than one task it is a job array: task i runs `tasks[i]` (`--array` is in `options`),
/// and its job id is `<array id>_<i>`, as `scontrol` and `scancel` take it.
pub fn script(
    cfg: &SlurmConfig,
    options: &[String],
    exe: &Path,
    tasks: &[(PathBuf, PathBuf)],
) -> String {
    let q = |p: &Path| shell_quote(&p.display().to_string());
    let mut s = String::from("#!/bin/bash\n# Written by zflow run; submitted with sbatch.\n");
    for o in options {
        s.push_str(&format!("#SBATCH {o}\n"));
    }
    let specs: Vec<String> = tasks.iter().map(|(spec, _)| q(spec)).collect();
    let exits: Vec<String> = tasks.iter().map(|(_, exit)| q(exit)).collect();
    s.push_str(&format!(
        r#"set -u
specs=({specs})
exits=({exits})
i=${{SLURM_ARRAY_TASK_ID:-0}}
if [ -n "${{SLURM_ARRAY_JOB_ID:-}}" ]; then id="${{SLURM_ARRAY_JOB_ID}}_${{SLURM_ARRAY_TASK_ID}}"; else id="$SLURM_JOB_ID"; fi
exit_file="${{exits[$i]}}$id"
time_requeues=$(cat "$exit_file.time-requeues" 2>/dev/null || echo 0)
if [ $(( ${{SLURM_RESTART_COUNT:-0}} - time_requeues )) -gt {max} ]; then
  echo "zflow: job $id was requeued $SLURM_RESTART_COUNT times, more than max_requeues {max}" >&2
  echo 75 > "$exit_file.tmp" && mv "$exit_file.tmp" "$exit_file"
  exit 75
fi
requeued=0
on_time_limit() {{
  echo "zflow: job $id is near its time limit: requeued, to resume from its newest checkpoint" >&2
  echo $((time_requeues + 1)) > "$exit_file.time-requeues"
  requeued=1
  scontrol requeue "$id"
}}
trap on_time_limit USR1
export {executor_var}={executor}
{exe} exec-stage "${{specs[$i]}}" &
stage=$!
# A trapped signal ends `wait` early: wait on until the stage itself ends.
while wait $stage; rc=$?; kill -0 $stage 2>/dev/null; do :; done
[ $requeued -eq 1 ] && exit 0
echo $rc > "$exit_file.tmp" && mv "$exit_file.tmp" "$exit_file"
exit $rc
"#,
        specs = specs.join(" "),
        exits = exits.join(" "),
        max = cfg.max_requeues,
        exe = q(exe),
        executor_var = EXECUTOR_ENV,
        executor = EXECUTOR_SLURM,
    ));
    s
}

/// The last `n` lines of the job's output, indented under a heading, or nothing when it is
/// empty or unreadable: what the batch script printed is usually why the job failed.
fn last_lines(path: &Path, n: usize) -> String {
    let Ok(bytes) = std::fs::read(path) else {
        return String::new();
    };
    let text = String::from_utf8_lossy(&bytes);
    let lines: Vec<&str> = text.lines().collect();
    if lines.is_empty() {
        return String::new();
    }
    let tail = &lines[lines.len().saturating_sub(n)..];
    let mut out = format!("\n  the job output's last {} lines:", tail.len());
    for line in tail {
        out.push_str("\n    ");
        out.push_str(line);
    }
    out
}

fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// Runs `cmd` once, returning stdout, or an error that names the command and says what it
/// printed (a missing binary says so).
fn slurm_command(program: &str, args: &[&str]) -> Result<String> {
    let shown = format!("{program} {}", args.join(" "));
    let out = Command::new(program).args(args).output().map_err(|e| {
        if e.kind() == std::io::ErrorKind::NotFound {
            anyhow::anyhow!("executor slurm: `{program}` is not on PATH (tried `{shown}`); install Slurm's client commands or use `executor: {{kind: local}}`")
        } else {
            anyhow::anyhow!("executor slurm: `{shown}` could not start: {e}")
        }
    })?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr).trim().to_string();
        let conf = std::env::var("SLURM_CONF")
            .map(|c| format!(" (SLURM_CONF={c})"))
            .unwrap_or_default();
        bail!("`{shown}` failed ({}){conf}: {err}", out.status);
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Checks that the Slurm controller answers (`squeue --me`: one call, a short answer), naming
/// what was tried if not. A `SLURM_CONF` that names no file is said at once: Slurm's clients
/// would spend a minute looking for a controller elsewhere first.
pub fn check_reachable() -> Result<()> {
    if let Some(conf) = std::env::var_os("SLURM_CONF")
        && !std::path::Path::new(&conf).is_file()
    {
        bail!(
            "executor slurm: SLURM_CONF={} names no file; point it at the cluster's slurm.conf, or unset it where Slurm finds its own",
            conf.to_string_lossy()
        );
    }
    slurm_command("squeue", &["-h", "-o", "%i", "--me"])
        .context("executor slurm: the Slurm controller is not reachable")?;
    Ok(())
}

/// A submitted job as it ended.
#[derive(Clone, Debug)]
pub struct JobReport {
    /// Slurm's job id.
    pub id: String,
    /// Its final state.
    pub state: String,
    /// How often it was requeued.
    pub restarts: u32,
}

impl JobReport {
    /// How the run records show it: `slurm 12 COMPLETED` (`, requeued 1x`).
    pub fn describe(&self) -> String {
        let requeued = if self.restarts > 0 {
            format!(", requeued {}x", self.restarts)
        } else {
            String::new()
        };
        format!("slurm {} {}{requeued}", self.id, self.state)
    }
}

/// `<log>.job`: the stage's current or last job, as [`JobReport::describe`] says it (for
/// `zflow status`).
pub fn job_file(log: &Path) -> PathBuf {
    PathBuf::from(format!("{}.job", log.display()))
}

/// Submits `spec` as one job and waits for it. Returns the job (when one was submitted) and
/// whether the stage succeeded.
pub fn run_stage(
    cfg: &SlurmConfig,
    spec: &ExecSpec,
    resources: &Resources,
    cancel: &CancelToken,
    progress: &StageProgress,
    log: &StageLog,
) -> (Option<JobReport>, Result<()>) {
    let base = spec.log.clone();
    let with = |ext: &str| PathBuf::from(format!("{}.{ext}", base.display()));
    let (spec_path, script_path, exit_prefix) = (with("spec.json"), with("sbatch"), with("exit-"));
    let submitted = serde_json::to_vec_pretty(spec)
        .map_err(anyhow::Error::from)
        .and_then(|bytes| {
            std::fs::write(&spec_path, bytes)
                .with_context(|| format!("writing {}", spec_path.display()))
        })
        .and_then(|()| {
            submit(
                cfg,
                Pending {
                    spec: spec.clone(),
                    resources: resources.clone(),
                    spec_path,
                    exit_prefix: exit_prefix.clone(),
                    script_path: script_path.clone(),
                },
            )
        });
    let (id, job_out) = match submitted {
        Ok(job) => job,
        Err(e) => return (None, Err(e)),
    };
    log.line(&format!(
        "=== submitted slurm job {id}: {} (output {})",
        script_path.display(),
        job_out.display()
    ));
    tracing::info!("submitted slurm job {id} ({})", script_path.display());
    progress.set_message(format!("slurm job {id} submitted"));
    let mut report = JobReport {
        id: id.clone(),
        state: "PENDING".into(),
        restarts: 0,
    };
    let job_file = job_file(&base);
    let _ = std::fs::write(&job_file, report.describe());
    let result = wait(cfg, &mut report, cancel, progress, log, &exit_prefix);
    let _ = std::fs::write(&job_file, report.describe());
    let result = result.map_err(|e| {
        anyhow::anyhow!(
            "{e:#}\n  sbatch script: {}\n  job output:    {}\n  stage log:     {}{}",
            script_path.display(),
            job_out.display(),
            base.display(),
            last_lines(&job_out, 20)
        )
    });
    (Some(report), result)
}

/// One stage waiting to be submitted.
struct Pending {
    spec: ExecSpec,
    resources: Resources,
    spec_path: PathBuf,
    exit_prefix: PathBuf,
    script_path: PathBuf,
}

type Reply = std::sync::mpsc::Sender<Result<(String, PathBuf)>>;

/// Stages waiting for their group's submission, by (kind, resources).
static WAITING: std::sync::Mutex<BTreeMap<String, Vec<(Pending, Reply)>>> =
    std::sync::Mutex::new(BTreeMap::new());

/// Submits one stage; returns its job id and the job's output file. Stages of one kind with the
/// same resources that become ready within `array_window_s` of each other (the per-source
/// fetch, ingest and tokenize stages of a recipe) go out as one job array, one task each: one
/// scheduler entry and one script instead of many.
fn submit(cfg: &SlurmConfig, pending: Pending) -> Result<(String, PathBuf)> {
    let key = format!("{} {:?}", pending.spec.kind, pending.resources);
    let (tx, rx) = std::sync::mpsc::channel();
    let leader = {
        let mut waiting = WAITING.lock().unwrap_or_else(|e| e.into_inner());
        let group = waiting.entry(key.clone()).or_default();
        group.push((pending, tx));
        group.len() == 1
    };
    if leader {
        std::thread::sleep(Duration::from_secs_f64(cfg.array_window_s.max(0.0)));
        let group = WAITING
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&key)
            .unwrap_or_default();
        let (tasks, replies): (Vec<Pending>, Vec<Reply>) = group.into_iter().unzip();
        match submit_group(cfg, &tasks) {
            Ok(jobs) => jobs
                .into_iter()
                .zip(&replies)
                .for_each(|(job, r)| drop(r.send(Ok(job)))),
            Err(e) => replies
                .iter()
                .for_each(|r| drop(r.send(Err(anyhow::anyhow!("{e:#}"))))),
        }
    }
    rx.recv()
        .context("the submission of this stage's group was lost")?
}

/// `sbatch` for `tasks` (one stage, or a job array of several); each stage's `<log>.sbatch`
/// holds the script.
fn submit_group(cfg: &SlurmConfig, tasks: &[Pending]) -> Result<Vec<(String, PathBuf)>> {
    let first = &tasks[0];
    let exe = std::env::current_exe().context("locating the zflow binary for the job")?;
    let array = tasks.len() > 1;
    let output = if array {
        first
            .script_path
            .with_file_name(format!("{}-array.slurm-%A_%a.out", first.spec.kind))
    } else {
        PathBuf::from(format!("{}.slurm-%j.out", first.spec.log.display()))
    };
    let name = if array {
        format!("{}-array", first.spec.kind)
    } else {
        first.spec.stage.clone()
    };
    let mut options = sbatch_options(cfg, &name, &first.resources, &output, &first.spec.cwd);
    if array {
        options.push(format!("--array=0-{}", tasks.len() - 1));
    }
    let pairs: Vec<(PathBuf, PathBuf)> = tasks
        .iter()
        .map(|t| (t.spec_path.clone(), t.exit_prefix.clone()))
        .collect();
    let text = script(cfg, &options, &exe, &pairs);
    for t in tasks {
        std::fs::write(&t.script_path, &text)
            .with_context(|| format!("writing {}", t.script_path.display()))?;
    }
    let out = slurm_command(
        "sbatch",
        &["--parsable", &first.script_path.display().to_string()],
    )?;
    let id = out.trim().split(';').next().unwrap_or_default().to_string();
    if id.is_empty() || !id.chars().all(|c| c.is_ascii_digit()) {
        bail!("sbatch printed {out:?}, expected a job id");
    }
    Ok(tasks
        .iter()
        .enumerate()
        .map(|(i, t)| {
            if array {
                let job = format!("{id}_{i}");
                (
                    job.clone(),
                    PathBuf::from(output.display().to_string().replace("%A_%a", &job)),
                )
            } else {
                (
                    id.clone(),
                    PathBuf::from(format!("{}.slurm-{id}.out", t.spec.log.display())),
                )
            }
        })
        .collect())
}

/// Polls until the job is over; cancels it on `cancel`.
fn wait(
    cfg: &SlurmConfig,
    report: &mut JobReport,
    cancel: &CancelToken,
    progress: &StageProgress,
    log: &StageLog,
    exit_prefix: &Path,
) -> Result<()> {
    let id = report.id.clone();
    let exit_file = PathBuf::from(format!("{}{id}", exit_prefix.display()));
    let poll = Duration::from_secs_f64(cfg.poll_s.max(0.1));
    let mut failed_polls = 0u32;
    let mut last_state = String::new();
    let mut lost_since: Option<Instant> = None;
    let started = Instant::now();
    loop {
        if cancel.is_cancelled() {
            tracing::warn!("cancelling slurm job {id}");
            let _ = slurm_command("scancel", &[&id]);
            report.state = "CANCELLED".into();
            log.line(&format!("=== scancel {id} (zflow run was interrupted)"));
            bail!("cancelled (scancel {id})");
        }
        std::thread::sleep(poll);
        match slurm_command("scontrol", &["show", "job", "-o", &id]) {
            Ok(out) => {
                failed_polls = 0;
                let Some(state) = parse_scontrol(out.trim()) else {
                    bail!("scontrol show job {id} printed no JobState: {out:?}");
                };
                if state.restarts > report.restarts {
                    log.line(&format!(
                        "=== slurm requeued job {id} (restart {})",
                        state.restarts
                    ));
                    tracing::warn!(
                        "slurm requeued job {id} (restart {} of at most {})",
                        state.restarts,
                        cfg.max_requeues
                    );
                }
                report.restarts = state.restarts;
                if state.state != last_state {
                    let _ =
                        std::fs::write(job_file(log.path()), format!("slurm {id} {}", state.state));
                    progress.set_message(format!("slurm job {id} {}", state.state));
                    tracing::info!("slurm job {id}: {}", state.state);
                    last_state = state.state.clone();
                }
                report.state = state.state.clone();
                // A node failure or preemption of a `--requeue` job is followed by its requeue:
                // give Slurm a moment before calling the job lost.
                let requeue_pending = matches!(state.state.as_str(), "NODE_FAIL" | "PREEMPTED")
                    && state.restarts < cfg.max_requeues;
                if requeue_pending
                    && lost_since.get_or_insert_with(Instant::now).elapsed()
                        < Duration::from_secs(30)
                {
                    continue;
                }
                lost_since = None;
                if is_final(&state.state) {
                    return finished(report, &state.exit_code, &exit_file);
                }
            }
            Err(e) if format!("{e:#}").contains("Invalid job id") => {
                // Slurm forgot the job (MinJobAge): the script's exit file says how it ended.
                report.state = "COMPLETED?".into();
                return finished(report, "?", &exit_file);
            }
            Err(e) => {
                failed_polls += 1;
                tracing::warn!(
                    "polling slurm job {id} failed ({failed_polls} in a row), retrying: {e:#}"
                );
                if failed_polls >= 30 {
                    bail!(
                        "lost contact with Slurm while job {id} ran ({failed_polls} failed polls over {:.0} s): {e:#}",
                        started.elapsed().as_secs_f64()
                    );
                }
                std::thread::sleep(poll * failed_polls.min(10));
            }
        }
    }
}

/// The job side: runs the stage attempt `spec` describes (`zflow exec-stage SPEC`), with its
/// log lines going to the stage's log as in a local run. SIGTERM (scancel, preemption) sets
/// `cancel`, so a stage stops at its next safe point.
pub fn exec_stage(spec_path: &Path, registry: &crate::Registry, cancel: CancelToken) -> Result<()> {
    let text = std::fs::read_to_string(spec_path)
        .with_context(|| format!("reading {}", spec_path.display()))?;
    let spec: ExecSpec =
        serde_json::from_str(&text).with_context(|| format!("parsing {}", spec_path.display()))?;
    let kind = registry.kind(&spec.kind).with_context(|| {
        format!(
            "{}: this zflow has no stage kind `{}`",
            spec_path.display(),
            spec.kind
        )
    })?;
    let stage = kind
        .prepare(spec.config.clone(), &spec.needs)
        .map_err(|e| {
            anyhow::anyhow!(
                "{}: config of `{}`: {}: {}",
                spec_path.display(),
                spec.stage,
                e.path,
                e.message
            )
        })?;
    let log = StageLog::open(&spec.log)?;
    log.line(&format!(
        "=== slurm job {} on {} (restart {}): running {}",
        std::env::var("SLURM_JOB_ID").unwrap_or_default(),
        crate::lease::hostname(),
        std::env::var("SLURM_RESTART_COUNT").unwrap_or_else(|_| "0".into()),
        spec.stage
    ));
    std::fs::create_dir_all(&spec.out_dir)?;
    // The job is this process: what it holds before the stage runs (its code, its runtime)
    // counts against `--mem`, so the stage's own allocations get the rest.
    let before = proc_status_bytes("VmRSS:");
    let own_memory_gb = match before {
        Some(held) if spec.memory_gb > 0.0 => {
            (spec.memory_gb - held as f64 / (1u64 << 30) as f64).max(spec.memory_gb / 16.0)
        }
        _ => spec.memory_gb,
    };
    let ctx = crate::StageContext {
        name: spec.stage.clone(),
        out_dir: spec.out_dir.clone(),
        inputs: spec.inputs.clone(),
        cwd: spec.cwd.clone(),
        cache_dir: spec.cache_dir.clone(),
        threads: spec.threads,
        memory_gb: own_memory_gb,
        cancel,
        progress: StageProgress::hidden(&spec.stage),
        log: log.clone(),
    };
    crate::logging::attach_stage_log(&spec.stage, log.clone());
    let span = tracing::info_span!("stage", name = %spec.stage);
    let result = {
        let _enter = span.enter();
        // Hashed here, on the node that wrote the files ([`crate::seal`]).
        stage
            .run(&ctx)
            .and_then(|()| crate::seal::seal(&spec.out_dir, &ctx.cancel))
    };
    crate::logging::detach_stage_log(&spec.stage);
    // What the job used against what it declared (`--mem`): the stage's whole process.
    if let Some(peak) = proc_status_bytes("VmHWM:") {
        log.line(&format!(
            "=== peak RSS {} MiB ({} MiB before the stage ran) of {} MiB declared",
            peak >> 20,
            before.unwrap_or(0) >> 20,
            if spec.memory_gb > 0.0 {
                ((spec.memory_gb * 1024.0).ceil() as u64).to_string()
            } else {
                "no".into()
            }
        ));
    }
    if let Err(e) = &result {
        log.line(&format!(
            "=== failed in slurm job {}: {e:#}",
            std::env::var("SLURM_JOB_ID").unwrap_or_default()
        ));
    }
    result
}

/// A memory figure of this process (`VmHWM:`, its peak resident memory, or `VmRSS:`), in
/// bytes.
fn proc_status_bytes(field: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let kib = status
        .lines()
        .find_map(|l| l.strip_prefix(field))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse::<u64>()
        .ok()?;
    Some(kib << 10)
}

fn finished(report: &mut JobReport, exit_code: &str, exit_file: &Path) -> Result<()> {
    let script_rc = std::fs::read_to_string(exit_file)
        .ok()
        .map(|s| s.trim().to_string());
    if let Some(rc) = &script_rc
        && report.state == "COMPLETED?"
    {
        report.state = if rc == "0" {
            "COMPLETED".into()
        } else {
            "FAILED".into()
        };
    }
    match (report.state.as_str(), script_rc.as_deref()) {
        ("COMPLETED", Some("0")) => Ok(()),
        ("COMPLETED", None) if exit_code == "0:0" => Ok(()),
        // The script writes its exit file last: without one it never got there.
        (state, None) => bail!(
            "slurm job {} ended {state} with exit code {exit_code} before its script recorded \
             an exit status: it was killed, or it never started (a failed launch; the slurmd \
             log of its node says why)",
            report.id
        ),
        (state, rc) => {
            let rc = rc
                .map(|r| format!(", stage exit status {r}"))
                .unwrap_or_default();
            bail!(
                "slurm job {} ended {state} with exit code {exit_code}{rc}",
                report.id
            )
        }
    }
}

#[cfg(test)]
mod tests;
