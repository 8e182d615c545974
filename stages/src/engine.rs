//! Training engines: the program each rank of a train stage runs (`train.engine`). Every
//! engine keeps the engine contract (`zflow_runtime::contract`: the job file, the environment,
//! the JSON lines on stdout, the exit codes, the checkpoint format), so the supervisor
//! (`train.rs`) knows none of them: it asks this file for the command of a rank. A new engine
//! is one more arm here.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use anyhow::{Result, bail};

/// The engines `train.engine` may name.
pub const ENGINES: &[&str] = &["native"];

/// Whether `engine` is one of [`ENGINES`]; the error says which ones are.
pub fn check(engine: &str) -> std::result::Result<(), String> {
    if ENGINES.contains(&engine) {
        Ok(())
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

/// The program and arguments that probe one device for `engine` (the preflight GEMM and
/// bandwidth), answering with one `preflight` message: what the `preflight` stage runs per
/// rank.
pub fn probe_command(
    engine: &str,
    backend: &str,
    device: usize,
) -> Result<(PathBuf, Vec<OsString>)> {
    match engine {
        "native" => Ok((
            zflow_pipeline::stage::zflow_exe()?,
            [
                "worker",
                "--probe",
                "--backend",
                backend,
                "--device",
                &device.to_string(),
            ]
            .into_iter()
            .map(OsString::from)
            .collect(),
        )),
        other => bail!(unknown(other)),
    }
}

/// The program and arguments that run one rank of `engine` on the train job at `job`, on
/// `backend` (cpu, cuda, rocm).
pub fn worker_command(engine: &str, job: &Path, backend: &str) -> Result<(PathBuf, Vec<OsString>)> {
    match engine {
        // zflow's own trainer (burn): `zflow worker`.
        "native" => Ok((
            zflow_pipeline::stage::zflow_exe()?,
            ["worker", "--job"]
                .into_iter()
                .map(OsString::from)
                .chain([
                    job.as_os_str().to_owned(),
                    "--backend".into(),
                    backend.into(),
                ])
                .collect(),
        )),
        other => bail!(unknown(other)),
    }
}
