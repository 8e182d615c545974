//! Training engines: the program each rank of a train stage runs (`train.engine`). Every
//! engine keeps the engine contract (`zflow_runtime::contract`: the job file, the environment,
//! the JSON lines on stdout, the exit codes, the checkpoint format), so the supervisor
//! (`stages/src/train/supervisor.rs`) knows none of them: it asks this file for the command of a rank. A new engine
//! is one more arm here.
//!
//! - `torch` (the default, `zflow_runtime::contract::settings::DEFAULT_ENGINE`): PyTorch workers, `python -m zflow_torch.worker` from
//!   `workers/torch/`, training transformers' ZayaForCausalLM with torch.distributed (gloo on
//!   CPU, NCCL on CUDA, RCCL through PyTorch's `nccl` backend on ROCm builds). The Python is
//!   [`TORCH_PYTHON`] if set, else the environment `scripts/setup.sh` creates
//!   (`target/torch-venv`).
//!
//! `native` (zflow's own burn trainer) was retired: a recipe naming it is refused at load.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use anyhow::{Result, bail};

/// The engines `train.engine` may name.
pub const ENGINES: &[&str] = &["torch"];

/// Names the Python interpreter the torch engine runs (one with torch and transformers; on
/// ROCm, PyTorch's ROCm build).
pub const TORCH_PYTHON: &str = "ZFLOW_TORCH_PYTHON";

/// Names the folder holding the `zflow_torch` package (default: this repository's
/// `workers/torch`).
pub const TORCH_WORKER_DIR: &str = "ZFLOW_TORCH_WORKER_DIR";

/// How to start one rank: program, arguments and the environment it needs beyond the
/// contract's.
#[derive(Clone, Debug)]
pub struct EngineCommand {
    /// The program.
    pub program: PathBuf,
    /// Its arguments.
    pub args: Vec<OsString>,
    /// Extra environment variables.
    pub env: Vec<(String, OsString)>,
}

/// Whether `engine` is one of [`ENGINES`]; the error says which ones are.
pub fn check(engine: &str) -> std::result::Result<(), String> {
    if ENGINES.contains(&engine) {
        Ok(())
    } else if engine == "native" {
        Err(
            "the native engine (zflow's burn trainer) was retired: use `engine: torch` (the \
             default, so the line can go), which trains transformers' ZayaForCausalLM with \
             torch.distributed and resumes native checkpoints"
                .into(),
        )
    } else {
        Err(unknown(engine))
    }
}

fn unknown(engine: &str) -> String {
    format!(
        "unknown training engine `{engine}` (engines: {})",
        ENGINES.join(", ")
    )
}

/// This repository's root (the torch worker package and the set-up's Python live in it).
fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("stages/ has a parent")
        .to_path_buf()
}

/// The Python the torch engine runs: [`TORCH_PYTHON`], else `target/torch-venv/bin/python`.
pub fn torch_python() -> Result<PathBuf> {
    if let Some(p) = std::env::var_os(TORCH_PYTHON) {
        let p = PathBuf::from(p);
        // Checked here, so the error names the variable, not only "No such file" at spawn.
        let runnable = std::fs::metadata(&p).is_ok_and(|m| {
            use std::os::unix::fs::PermissionsExt;
            m.is_file() && m.permissions().mode() & 0o111 != 0
        });
        if !runnable {
            bail!(
                "{TORCH_PYTHON}={}: no such program, or not executable (it names the torch \
                 engine's Python, one with torch==2.15.0 and transformers==5.23.0: fix the \
                 path, or unset it to use the one scripts/setup.sh installs)",
                p.display()
            );
        }
        return Ok(p);
    }
    let venv = repo_root().join("target/torch-venv/bin/python");
    if venv.exists() {
        return Ok(venv);
    }
    bail!(
        "the torch engine needs a Python with torch==2.15.0 and transformers==5.23.0: run \
         scripts/setup.sh (it creates {}), or set {TORCH_PYTHON} to such a Python (on ROCm, \
         one with PyTorch's ROCm build)",
        venv.display()
    )
}

/// The folder holding the `zflow_torch` package: [`TORCH_WORKER_DIR`], else `workers/torch`.
pub fn torch_worker_dir() -> PathBuf {
    std::env::var_os(TORCH_WORKER_DIR)
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join("workers/torch"))
}

/// `python -m <module> <args>` in the torch engine's Python, with the `zflow_torch` package
/// on its path: the worker (`zflow_torch.worker`) and its benchmarks (`zflow_torch.bench`).
pub fn torch_module(module: &str, args: Vec<OsString>) -> Result<EngineCommand> {
    let dir = torch_worker_dir();
    let mut all: Vec<OsString> = vec!["-m".into(), module.into()];
    all.extend(args);
    Ok(EngineCommand {
        program: torch_python()?,
        args: all,
        env: vec![
            ("PYTHONPATH".into(), dir.into_os_string()),
            // Lines on stdout reach the supervisor as they are written.
            ("PYTHONUNBUFFERED".into(), "1".into()),
        ],
    })
}

/// One rank of `engine` with the worker arguments `args`.
fn rank_command(engine: &str, args: Vec<OsString>) -> Result<EngineCommand> {
    match engine {
        "torch" => torch_module("zflow_torch.worker", args),
        other => bail!(unknown(other)),
    }
}

/// The command that probes one device for `engine` (the preflight GEMM and bandwidth; the
/// device is the rank's `ZFLOW_DEVICE`), answering with one `preflight` message: what the
/// `preflight` stage runs per rank.
pub fn probe_command(engine: &str, backend: &str) -> Result<EngineCommand> {
    let args: Vec<OsString> = ["--probe", "--backend", backend]
        .into_iter()
        .map(OsString::from)
        .collect();
    rank_command(engine, args)
}

/// The command that runs one rank of `engine` on the train job at `job`, on `backend` (cpu,
/// cuda, rocm).
pub fn worker_command(engine: &str, job: &Path, backend: &str) -> Result<EngineCommand> {
    let args: Vec<OsString> = vec![
        "--job".into(),
        job.as_os_str().to_owned(),
        "--backend".into(),
        backend.into(),
    ];
    rank_command(engine, args)
}
