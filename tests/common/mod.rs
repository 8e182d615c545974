//! Helpers for integration tests that run the real `zflow` binary in a temp folder.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The complete output folder of `stage` in `store` (the one without `.tmp`/`.partial`).
pub fn stage_dir(store: &Path, stage: &str) -> PathBuf {
    std::fs::read_dir(store)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| {
            let n = p.file_name().unwrap().to_string_lossy().into_owned();
            n.strip_prefix(stage)
                .and_then(|rest| rest.strip_prefix('-'))
                .is_some_and(|h| h.len() == 12 && !h.contains('.'))
        })
        .unwrap_or_else(|| panic!("no output of {stage} in {}", store.display()))
}

/// A loopback port that was free a moment ago (a listener bound to port 0 picked it).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The entries of `dir` whose names start with `prefix`, sorted.
pub fn entries_starting_with(dir: &Path, prefix: &str) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.file_name().unwrap().to_string_lossy().starts_with(prefix))
        .collect();
    out.sort();
    out
}

/// Asserts that every source of the mixture report at `report` (a `mix` stage's
/// `report.json`) realised its requested share within one percentage point.
pub fn assert_shares_within_a_point(path: &Path) {
    let report: serde_json::Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    for s in report["sources"].as_array().unwrap() {
        let (want, got) = (
            s["requested_share"].as_f64().unwrap(),
            s["realised_share"].as_f64().unwrap(),
        );
        assert!(
            (want - got).abs() <= 0.01,
            "{} {}: requested {want}, realised {got}",
            path.display(),
            s["name"]
        );
    }
}

/// A temp folder to run zflow in, with its recipe(s).
pub struct Sandbox {
    pub dir: tempfile::TempDir,
}

/// What one zflow invocation did.
pub struct Outcome {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Outcome {
    /// Stage names that ran (from the `done <name>` lines).
    pub fn ran(&self) -> Vec<String> {
        self.stderr
            .lines()
            .filter_map(|l| l.trim_start().strip_prefix("done    "))
            .map(|l| l.split_whitespace().next().unwrap_or("").to_string())
            .collect()
    }
    /// The `N ran, M cached, ...` summary numbers: (ran, cached, failed, skipped).
    pub fn counts(&self) -> (usize, usize, usize, usize) {
        let line = self
            .stderr
            .lines()
            .find(|l| l.contains(" ran, ") && l.contains(" cached, "))
            .unwrap_or_else(|| panic!("no summary line in:\n{}", self.stderr));
        let nums: Vec<usize> = line
            .split(", ")
            .map(|part| part.split_whitespace().next().unwrap().parse().unwrap())
            .collect();
        (nums[0], nums[1], nums[2], nums[3])
    }
}

impl Sandbox {
    pub fn new() -> Sandbox {
        Sandbox {
            dir: tempfile::tempdir().unwrap(),
        }
    }
    pub fn path(&self) -> &Path {
        self.dir.path()
    }
    pub fn write(&self, name: &str, text: &str) -> PathBuf {
        let p = self.path().join(name);
        if let Some(parent) = p.parent() {
            std::fs::create_dir_all(parent).unwrap();
        }
        std::fs::write(&p, text).unwrap();
        p
    }
    /// The output folder of `stage` in the default store.
    pub fn output(&self, stage: &str) -> PathBuf {
        stage_dir(&self.path().join("zflow-store"), stage)
    }
    pub fn read(&self, name: &str) -> String {
        std::fs::read_to_string(self.path().join(name)).unwrap_or_default()
    }
    /// A `zflow` command running in the sandbox, with a fast lease timeout.
    pub fn cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_zflow"));
        c.args(args)
            .current_dir(self.path())
            .env_remove("ZFLOW_STORE")
            .env("ZFLOW_LEASE_TIMEOUT_S", "3");
        c
    }
    pub fn zflow(&self, args: &[&str]) -> Outcome {
        let out: Output = self.cmd(args).output().expect("running zflow");
        Outcome {
            code: out.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }
    /// Runs and asserts success.
    pub fn ok(&self, args: &[&str]) -> Outcome {
        let o = self.zflow(args);
        assert_eq!(
            o.code, 0,
            "zflow {args:?} failed:\nstdout:\n{}\nstderr:\n{}",
            o.stdout, o.stderr
        );
        o
    }
}

/// [`tiny_train_recipe`] with its `train.engine` written out.
pub fn tiny_train_recipe_on(engine: &str, ranks: usize, max_restarts: u32) -> String {
    with_engine(&tiny_train_recipe(ranks, max_restarts), engine)
}

/// `recipe` (whose `train:` section starts with `global_batch`) trained by `engine`.
pub fn with_engine(recipe: &str, engine: &str) -> String {
    assert!(recipe.contains("\ntrain:\n  global_batch"), "{recipe}");
    recipe.replace(
        "\ntrain:\n  global_batch",
        &format!("\ntrain:\n  engine: {engine}\n  global_batch"),
    )
}

/// One rank of `engine` on the train job at `job` on the CPU, started as the train stage
/// starts it (`stages/src/engine.rs`), minus the placement.
pub fn worker(engine: &str, job: &Path) -> Command {
    let e = zflow_stages::engine::worker_command(engine, job, "cpu").unwrap();
    let mut c = Command::new(e.program);
    c.args(&e.args).envs(e.env.iter().map(|(k, v)| (k, v)));
    c
}

/// Runs `python -m MODULE ARGS` in the torch engine's environment (`stages/src/engine.rs`),
/// asserts that it succeeded, and returns its stdout.
pub fn torch_module_stdout(module: &str, args: Vec<std::ffi::OsString>) -> String {
    engine_stdout(zflow_stages::engine::torch_module(module, args).unwrap())
}

/// Runs `python -c CODE` with the torch engine's Python and environment, asserts that it
/// succeeded, and returns its stdout.
pub fn torch_code_stdout(code: &str) -> String {
    let mut e = zflow_stages::engine::torch_module("zflow_torch", vec![]).unwrap();
    e.args = vec!["-c".into(), code.into()];
    engine_stdout(e)
}

/// Runs `e`, asserts that it succeeded, and returns its stdout.
fn engine_stdout(e: zflow_stages::engine::EngineCommand) -> String {
    let out = Command::new(&e.program)
        .args(&e.args)
        .envs(e.env.iter().map(|(k, v)| (k, v)))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{:?}: {}",
        e.args,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// One short phase of a tiny ZAYA1 on this repository's text: ~58 steps of 8 x 64 tokens,
/// a checkpoint every 5 steps, on the default engine (torch; [`tiny_train_recipe_on`] names
/// one).
pub fn tiny_train_recipe(ranks: usize, max_restarts: u32) -> String {
    format!(
        r#"
name: faults-test
model:
  hidden_size: 64
  num_blocks: 2
  vocab_size: 512
  num_query_heads: 2
  num_kv_heads: 1
  head_dim: 32
  num_experts: 4
  expert_ffn: 64
  router_dim: 32
sources:
  prose:
    url: "{repo}/*.md"
    format: text
    split_regex: "\n\n+"
    min_chars: 20
  code:
    url: "{repo}/pipeline/src/*.rs"
    files: ["*.rs"]
    format: text
tokenizer:
  train: {{vocab_size: 512, sample_bytes_per_source: 200000}}
train:
  global_batch: 8
  micro_batch: 2
  schedule: {{peak_lr: 0.01, warmup: 0.1, decay: 0.3}}
  checkpoint_every: 5
  keep_checkpoints: 3
  eval_every: 0
  eval_tokens: 512
  launch: {{data_parallel: {ranks}, max_restarts: {max_restarts}, backoff_s: 0.1, hang_timeout_s: 3}}
phases:
  p1:
    tokens: 30000
    seq_len: 64
    mixture: {{prose: 0.5, code: 0.5}}
"#,
        repo = env!("CARGO_MANIFEST_DIR")
    )
}

/// Rewrites checkpoint `ck`'s manifest entry of `file` after a test edited that file (as if
/// zflow had written it so).
pub fn reseal(ck: &Path, file: &str) {
    let path = ck.join("manifest.json");
    let mut manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    let entry = zflow_files::hash::file(&ck.join(file)).unwrap();
    manifest["files"][file] = serde_json::to_value(entry).unwrap();
    std::fs::write(&path, serde_json::to_vec_pretty(&manifest).unwrap()).unwrap();
}

/// Slurm holds a requeued job for two minutes before it may start again (its `BeginTime`),
/// which on a cluster is nothing beside a multi-week run and here would be most of the test:
/// while the process `zflow` runs, each job held so is allowed to start two seconds later (the
/// test cluster's administrator may; a user would wait). Not at once: slurmd revokes a killed
/// job's credential with one-second resolution, and refuses a relaunch within that second as
/// already killed, which fails the job (exit code 1:0, the batch script never ran).
pub fn start_requeued_jobs_now(conf: &Path, zflow: u32) {
    let conf = conf.to_path_buf();
    std::thread::spawn(move || {
        // Jobs already given a start time; set again, `now+2` would move it on every poll.
        let mut released = std::collections::HashSet::new();
        while Path::new(&format!("/proc/{zflow}")).exists() {
            let out = Command::new("squeue")
                .args(["-h", "-t", "PD", "-o", "%i %r"])
                .env("SLURM_CONF", &conf)
                .output();
            let held: Vec<String> = out
                .iter()
                .flat_map(|o| {
                    String::from_utf8_lossy(&o.stdout)
                        .lines()
                        .filter_map(|l| l.strip_suffix(" BeginTime").map(str::to_string))
                        .collect::<Vec<_>>()
                })
                .collect();
            released.retain(|id| held.contains(id));
            for id in held {
                if released.insert(id.clone()) {
                    let _ = Command::new("scontrol")
                        .args(["update", &format!("JobId={id}"), "StartTime=now+2"])
                        .env("SLURM_CONF", &conf)
                        .status();
                }
            }
            std::thread::sleep(std::time::Duration::from_millis(500));
        }
    });
}
