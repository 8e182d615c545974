//! The stage model: what a stage kind implements, and the context it runs in.
//!
//! A stage kind is a type implementing [`Stage`]: a typed, serde-parsed config plus a `run`
//! that reads its inputs' output folders and writes into its own. The engine never looks
//! inside a config except through serde, so identities, caching, scheduling and records work
//! the same for every kind. Registering a kind is one line (see [`crate::Registry`]).

use std::collections::BTreeMap;
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::progress::StageProgress;
use crate::supervise::{spawn_supervised, terminate_group};

/// What a stage needs from the machine while it runs. The scheduler only starts a stage when
/// its resources fit in what is free, so independent stages run side by side within `-j`.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Resources {
    /// CPU cores (threads) the stage uses.
    pub cpus: u32,
    /// Accelerators (GPUs) the stage uses.
    pub gpus: u32,
    /// Memory in GiB the stage may use at peak.
    pub memory_gb: f64,
    /// Processes the stage starts, one per device (training ranks, probes). On Slurm these
    /// are the job's tasks; locally they share the stage's `cpus`.
    pub ranks: u32,
    /// Machines the stage spans (Slurm `--nodes`; locally always this one).
    pub nodes: u32,
    /// Wall-clock limit in minutes (Slurm `--time`; 0 = the executor's default).
    pub time_min: u32,
}

impl Default for Resources {
    fn default() -> Self {
        Resources {
            cpus: 1,
            gpus: 0,
            memory_gb: 0.0,
            ranks: 1,
            nodes: 1,
            time_min: 0,
        }
    }
}

/// The variable that tells a stage's process (and each rank it starts) how many threads it
/// may use.
pub const THREADS: &str = "ZFLOW_THREADS";

/// A stage kind. Implement this, then register it with one line in the stage registry.
///
/// Everything that should make a stage re-run when it changes belongs in `Config` (it is
/// hashed into the stage's identity after a serde round trip, so defaults count and key order
/// does not). Settings that must *not* re-run the stage (verbosity, progress) should be
/// `#[serde(skip_serializing)]`.
pub trait Stage: Send + Sync + 'static {
    /// The typed config: every key of the stage entry other than `name`, `kind`, `needs`
    /// and `resources`. Use `#[serde(deny_unknown_fields)]` so typos are errors.
    type Config: Serialize + DeserializeOwned + Send + Sync + 'static;

    /// The name used as `kind:` in recipes.
    const KIND: &'static str;

    /// Bump when the kind's output for the same config changes (a bug fix, a new format);
    /// it is part of the identity, so every stage of this kind re-runs.
    const VERSION: u32;

    /// Checks a parsed config for errors serde cannot see (e.g. mutually exclusive fields).
    /// `needs` are the stage's declared inputs. The error message names the offending field.
    fn validate(&self, _config: &Self::Config, _needs: &[String]) -> Result<(), ConfigError> {
        Ok(())
    }

    /// Resources this stage needs; the recipe's `resources:` overrides it.
    fn resources(&self, _config: &Self::Config) -> Resources {
        Resources::default()
    }

    /// A stage whose output folder may be reused after an interruption (training from its
    /// newest checkpoint, evaluation from its cached requests). Non-resumable stages always
    /// start from an empty output folder.
    fn resumable(&self, _config: &Self::Config) -> bool {
        false
    }

    /// A fingerprint of things outside the store that the output depends on (local files
    /// named by a path). Returned text is hashed into the identity, so a changed file re-runs
    /// the stage. `None` when the config says it all.
    fn external_fingerprint(&self, _config: &Self::Config, _cwd: &Path) -> Result<Option<String>> {
        Ok(None)
    }

    /// The files of input `input` this stage reads, when it reads only some of them: its
    /// identity then hashes only those entries of the input's manifest, so that a change to
    /// the input's other files leaves the stage cached (a shard of a source reads its own files
    /// of the fetched folder). The filter sees manifest paths (relative, `/`-separated); the
    /// stage must read no file it rejects. `None`, the default: the whole input counts.
    fn reads_only(&self, _config: &Self::Config, _input: &str) -> Option<FileFilter> {
        None
    }

    /// The processes the stage would start for its ranks, one shell line each (environment,
    /// program, arguments), as `zflow plan --launch` shows them. `on` says where: `threads`
    /// cores for the stage, on this machine or in a Slurm job. Empty (the default) for a stage
    /// that starts no ranks.
    fn launch_lines(&self, _config: &Self::Config, _on: &LaunchSite) -> Result<Vec<String>> {
        Ok(Vec::new())
    }

    /// Produces the stage's output in `ctx.out_dir()`.
    fn run(&self, config: &Self::Config, ctx: &StageContext) -> Result<()>;
}

/// Where `zflow plan --launch` shows a stage starting ([`Stage::launch_lines`]).
#[derive(Clone, Debug)]
pub struct LaunchSite {
    /// The stage's name.
    pub stage: String,
    /// The cores the stage gets (its `ZFLOW_THREADS`).
    pub threads: usize,
    /// `Some(nodes)` inside a Slurm job of that many nodes; `None` on this machine.
    pub slurm_nodes: Option<usize>,
    /// The stage's output folder, as the plan can name it before the stage runs.
    pub out_dir: PathBuf,
}

/// Which files of an input a stage reads ([`Stage::reads_only`]): true for a path it reads.
pub type FileFilter = Box<dyn Fn(&str) -> bool + Send + Sync>;

/// A config error at a path below the stage entry (`""` for the entry itself, `"url"`,
/// `"mixture.web"`), turned into `file:line:col` by the recipe loader.
#[derive(Debug, Clone)]
pub struct ConfigError {
    /// Path below the stage entry, dot-separated, list items as `[i]`.
    pub path: String,
    /// What is wrong and what was expected.
    pub message: String,
}

impl ConfigError {
    /// An error about the field at `path`.
    pub fn new(path: impl Into<String>, message: impl Into<String>) -> Self {
        ConfigError {
            path: path.into(),
            message: message.into(),
        }
    }
}

/// Deserializes `value`, found at recipe path `at` (`""` for a stage entry), into `T`; a serde
/// error becomes a [`ConfigError`] at the path of the offending key or value below `at`.
pub fn parse_config<T: DeserializeOwned>(
    value: serde_json::Value,
    at: &str,
) -> Result<T, ConfigError> {
    serde_path_to_error::deserialize(value).map_err(|e| {
        let inner = serde_path(e.path());
        let path = match (at.is_empty(), inner.is_empty()) {
            (true, _) => inner,
            (false, true) => at.to_string(),
            (false, false) => format!("{at}.{inner}"),
        };
        ConfigError::new(path, e.inner().to_string())
    })
}

/// A stage kind with its config parsed: what the engine holds for each node of the graph.
pub trait PreparedStage: Send + Sync {
    /// The kind name.
    fn kind(&self) -> &'static str;
    /// The kind version.
    fn version(&self) -> u32;
    /// The config as it counts for identity (typed, defaults filled, serialized back).
    fn canonical_config(&self) -> serde_json::Value;
    /// See [`Stage::resources`].
    fn resources(&self) -> Resources;
    /// See [`Stage::resumable`].
    fn resumable(&self) -> bool;
    /// See [`Stage::external_fingerprint`].
    fn external_fingerprint(&self, cwd: &Path) -> Result<Option<String>>;
    /// See [`Stage::reads_only`].
    fn reads_only(&self, input: &str) -> Option<FileFilter>;
    /// See [`Stage::launch_lines`].
    fn launch_lines(&self, on: &LaunchSite) -> Result<Vec<String>>;
    /// See [`Stage::run`].
    fn run(&self, ctx: &StageContext) -> Result<()>;
}

/// A registered kind, with its type erased so the registry can hold kinds of any config type.
pub trait ErasedKind: Send + Sync {
    /// The kind name.
    fn kind(&self) -> &'static str;
    /// Parses and validates a config.
    fn prepare(
        &self,
        config: serde_json::Value,
        needs: &[String],
    ) -> Result<Arc<dyn PreparedStage>, ConfigError>;
}

pub(crate) struct KindAdapter<S: Stage>(pub(crate) Arc<S>);

struct Prepared<S: Stage> {
    stage: Arc<S>,
    config: S::Config,
}

impl<S: Stage> ErasedKind for KindAdapter<S> {
    fn kind(&self) -> &'static str {
        S::KIND
    }
    fn prepare(
        &self,
        config: serde_json::Value,
        needs: &[String],
    ) -> Result<Arc<dyn PreparedStage>, ConfigError> {
        let config: S::Config = parse_config(config, "")?;
        self.0.validate(&config, needs)?;
        Ok(Arc::new(Prepared {
            stage: self.0.clone(),
            config,
        }))
    }
}

impl<S: Stage> PreparedStage for Prepared<S> {
    fn kind(&self) -> &'static str {
        S::KIND
    }
    fn version(&self) -> u32 {
        S::VERSION
    }
    fn canonical_config(&self) -> serde_json::Value {
        serde_json::to_value(&self.config).expect("stage configs serialize to JSON")
    }
    fn resources(&self) -> Resources {
        self.stage.resources(&self.config)
    }
    fn resumable(&self) -> bool {
        self.stage.resumable(&self.config)
    }
    fn external_fingerprint(&self, cwd: &Path) -> Result<Option<String>> {
        self.stage.external_fingerprint(&self.config, cwd)
    }
    fn reads_only(&self, input: &str) -> Option<FileFilter> {
        self.stage.reads_only(&self.config, input)
    }
    fn launch_lines(&self, on: &LaunchSite) -> Result<Vec<String>> {
        self.stage.launch_lines(&self.config, on)
    }
    fn run(&self, ctx: &StageContext) -> Result<()> {
        self.stage.run(&self.config, ctx)
    }
}

/// A flag that says "stop": set on Ctrl-C / SIGTERM, checked by stages at safe points.
#[derive(Clone, Debug, Default)]
pub struct CancelToken(Arc<AtomicBool>);

impl CancelToken {
    /// Asks everything holding this token to stop.
    pub fn cancel(&self) {
        self.0.store(true, Ordering::SeqCst);
    }
    /// Whether stop was asked.
    pub fn is_cancelled(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
}

/// The stage's log file in the store, shared by the engine, the stage and its child processes.
#[derive(Clone)]
pub struct StageLog {
    path: PathBuf,
    file: Arc<Mutex<File>>,
}

impl StageLog {
    /// Opens `path` for appending.
    pub fn open(path: &Path) -> Result<StageLog> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .with_context(|| format!("opening log {}", path.display()))?;
        Ok(StageLog {
            path: path.to_path_buf(),
            file: Arc::new(Mutex::new(file)),
        })
    }
    /// The log file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }
    /// Appends one line.
    pub fn line(&self, text: &str) {
        let mut f = self.file.lock().unwrap_or_else(|e| e.into_inner());
        let _ = writeln!(f, "{text}");
    }
    /// A handle child processes can write their stdout/stderr into.
    pub fn stdio(&self) -> Result<Stdio> {
        let f = self.file.lock().unwrap_or_else(|e| e.into_inner());
        Ok(Stdio::from(f.try_clone()?))
    }
}

/// Everything a running stage may use: where its inputs are, where to write, how to report
/// progress, where to log, and whether it should stop.
pub struct StageContext {
    pub(crate) name: String,
    pub(crate) out_dir: PathBuf,
    pub(crate) inputs: BTreeMap<String, PathBuf>,
    pub(crate) cwd: PathBuf,
    pub(crate) cache_dir: PathBuf,
    pub(crate) threads: usize,
    /// The memory its own allocations may use, in GiB (0: none declared): its `memory_gb`
    /// resource, less what its process held before it ran where the process is the job's.
    pub(crate) memory_gb: f64,
    pub(crate) cancel: CancelToken,
    pub(crate) progress: StageProgress,
    pub(crate) log: StageLog,
}

impl StageContext {
    /// The stage's name in the recipe (`fetch.web`, `train.phase1`).
    pub fn name(&self) -> &str {
        &self.name
    }
    /// The folder to write outputs into. It becomes the stage's output when `run` returns Ok.
    pub fn out_dir(&self) -> &Path {
        &self.out_dir
    }
    /// The output folder of input stage `name` (one of `needs`).
    pub fn input(&self, name: &str) -> Result<&Path> {
        match self.inputs.get(name) {
            Some(p) => Ok(p),
            None => bail!(
                "stage `{}` has no input `{name}` (its inputs: {})",
                self.name,
                self.inputs.keys().cloned().collect::<Vec<_>>().join(", ")
            ),
        }
    }
    /// All inputs, by stage name, in name order.
    pub fn inputs(&self) -> &BTreeMap<String, PathBuf> {
        &self.inputs
    }
    /// The directory `zflow` was started in; relative paths in configs resolve against it.
    pub fn cwd(&self) -> &Path {
        &self.cwd
    }
    /// A store-wide cache folder for things worth sharing between stages (downloads).
    pub fn cache_dir(&self) -> &Path {
        &self.cache_dir
    }
    /// How many threads the stage may use (its `cpus` resource).
    pub fn threads(&self) -> usize {
        self.threads
    }
    /// The memory the stage's own allocations may use, in bytes; `None` when it declared none.
    /// It is the `memory_gb` it declared to the executor, less, under Slurm (where the job is
    /// the stage's process), what the process held before the stage ran.
    pub fn memory_bytes(&self) -> Option<u64> {
        (self.memory_gb > 0.0).then_some((self.memory_gb * (1u64 << 30) as f64) as u64)
    }
    /// Progress reporting for this stage's line in the progress display.
    pub fn progress(&self) -> &StageProgress {
        &self.progress
    }
    /// This stage's log file.
    pub fn log(&self) -> &StageLog {
        &self.log
    }
    /// The cancellation flag.
    pub fn cancel_token(&self) -> &CancelToken {
        &self.cancel
    }
    /// Fails with "cancelled" when stop was asked; call it at safe points in long loops.
    pub fn check_cancelled(&self) -> Result<()> {
        if self.cancel.is_cancelled() {
            bail!("cancelled");
        }
        Ok(())
    }

    /// Environment every child process of the stage gets: `ZFLOW_OUT`, `ZFLOW_STAGE`,
    /// `ZFLOW_THREADS` and `ZFLOW_IN_<NAME>` for each input.
    pub fn child_env(&self) -> Vec<(String, String)> {
        let mut env = vec![
            ("ZFLOW_OUT".to_string(), self.out_dir.display().to_string()),
            ("ZFLOW_STAGE".to_string(), self.name.clone()),
            (THREADS.to_string(), self.threads.to_string()),
        ];
        for (name, path) in &self.inputs {
            env.push((input_env_var(name), path.display().to_string()));
        }
        env
    }

    /// Runs a child process to completion with its output in the stage log and the stage's
    /// environment set (working directory: zflow's, unless `cmd` sets one). Its process group
    /// dies with zflow (even on SIGKILL) and when it exits (what it left in the background),
    /// and is stopped (SIGTERM, then SIGKILL) when the stage is cancelled.
    pub fn run_command(&self, mut cmd: Command) -> Result<ExitStatus> {
        if cmd.get_current_dir().is_none() {
            cmd.current_dir(&self.cwd);
        }
        cmd.envs(self.child_env())
            .stdin(Stdio::null())
            .stdout(self.log.stdio()?)
            .stderr(self.log.stdio()?);
        let program = format!("{:?}", cmd.get_program());
        let mut child =
            spawn_supervised(&mut cmd).with_context(|| format!("starting {program}"))?;
        loop {
            if let Some(status) = child.try_wait()? {
                return Ok(status);
            }
            if self.cancel.is_cancelled() {
                terminate_group(child.id() as i32, Duration::from_secs(5), &mut child);
                bail!("cancelled");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// The environment variable that holds input `name`'s folder: upper case, `.`/`-` as `_`.
pub fn input_env_var(name: &str) -> String {
    let mut var = String::from("ZFLOW_IN_");
    for c in name.chars() {
        var.push(match c {
            '.' | '-' => '_',
            c => c.to_ascii_uppercase(),
        });
    }
    var
}

/// Renders a serde_path_to_error path in our `a.b[1].c` form.
pub fn serde_path(path: &serde_path_to_error::Path) -> String {
    let mut out = String::new();
    for seg in path.iter() {
        match seg {
            serde_path_to_error::Segment::Seq { index } => out.push_str(&format!("[{index}]")),
            serde_path_to_error::Segment::Map { key }
            | serde_path_to_error::Segment::Enum { variant: key } => {
                if !out.is_empty() {
                    out.push('.');
                }
                out.push_str(key);
            }
            serde_path_to_error::Segment::Unknown => {}
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn input_env_var_names() {
        assert_eq!(input_env_var("corpus"), "ZFLOW_IN_CORPUS");
        assert_eq!(input_env_var("fetch.web-2"), "ZFLOW_IN_FETCH_WEB_2");
    }
}
