//! Each stage's state in the store right now: done, running (and by whom), failed, stopped,
//! pending or error. `zflow status` prints it; `zflow ui` colours the graph with it.
//!
//! A plan says what is cached and what will run; the leases and run records say which of the
//! latter is running now, failed last time, or was interrupted.

use std::path::PathBuf;

use anyhow::Result;
use serde::Serialize;

use crate::lease;
use crate::plan::{Engine, StageState, ago, names_list};
use crate::records::{self, Status};

/// What a stage is doing, with what `zflow status` says of it.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum State {
    /// Its output at the identity the recipe asks for is complete in the store.
    Done {
        /// When it finished (ms since the epoch).
        finished_ms: i64,
        /// How long it took, seconds.
        took_s: f64,
    },
    /// A live lease holds it.
    Running {
        /// The owner's process.
        pid: u32,
        /// The owner's host.
        host: String,
        /// The owner's last heartbeat (ms since the epoch).
        heartbeat_ms: i64,
    },
    /// Its last attempt at this identity failed.
    Failed {
        /// When (ms since the epoch).
        end_ms: i64,
        /// The error's first line.
        error: String,
        /// The attempt's log file.
        log: String,
    },
    /// Its last attempt was interrupted (or it left a partial output); `zflow run` continues.
    Stopped {
        /// When (ms since the epoch).
        end_ms: i64,
    },
    /// It will run: why, or after which of its inputs.
    Pending {
        /// Why it will run, as `zflow plan` says it.
        reason: String,
    },
    /// Its identity cannot be computed.
    Error {
        /// What went wrong.
        error: String,
    },
}

impl State {
    /// The one-word name: `done`, `running`, `failed`, `stopped`, `pending` or `error`.
    pub fn word(&self) -> &'static str {
        match self {
            State::Done { .. } => "done",
            State::Running { .. } => "running",
            State::Failed { .. } => "failed",
            State::Stopped { .. } => "stopped",
            State::Pending { .. } => "pending",
            State::Error { .. } => "error",
        }
    }

    /// The rest of `zflow status`'s line, times relative to `now_ms`.
    pub fn detail(&self, now_ms: i64) -> String {
        let ago = |ms: i64| ago(now_ms, ms);
        match self {
            State::Done {
                finished_ms,
                took_s,
            } => format!("{}, took {took_s:.1}s", ago(*finished_ms)),
            State::Running {
                pid,
                host,
                heartbeat_ms,
            } => format!("pid {pid} on {host}, heartbeat {}", ago(*heartbeat_ms)),
            // An error that names its log already (the train stage's) is not followed by it again.
            State::Failed { end_ms, error, log } if error.contains(log.as_str()) => {
                format!("{}: {error}", ago(*end_ms))
            }
            State::Failed { end_ms, error, log } => {
                format!("{}: {error} (log: {log})", ago(*end_ms))
            }
            State::Stopped { end_ms } => {
                format!("interrupted {}; `zflow run` continues it", ago(*end_ms))
            }
            State::Pending { reason } => reason.clone(),
            State::Error { error } => error.clone(),
        }
    }
}

/// One stage's status.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct StageStatus {
    /// The stage.
    pub name: String,
    /// Its kind.
    pub kind: String,
    /// The identity the recipe asks for (when its inputs are complete).
    pub identity: Option<String>,
    /// What it is doing.
    #[serde(flatten)]
    pub state: State,
    /// Its Slurm job, when the Slurm executor submitted one for this identity.
    pub job: Option<String>,
    /// Where its files are: the output folder when done, else the partial folder (which a
    /// running or interrupted resumable stage writes), when either exists.
    pub folder: Option<PathBuf>,
}

/// The status of every stage, in the graph's node order, from the plan `states`.
pub fn statuses(engine: &Engine, states: &[StageState]) -> Result<Vec<StageStatus>> {
    let records = records::read_all(&engine.store.records_dir())?;
    let timeout = lease::lease_timeout();
    let nodes = engine.graph.nodes();
    let mut out = Vec::with_capacity(nodes.len());
    for (node, planned) in nodes.iter().zip(states) {
        let (identity, state) = match planned {
            StageState::Cached { manifest } => (
                Some(manifest.identity.clone()),
                State::Done {
                    finished_ms: manifest.finished_ms,
                    took_s: (manifest.finished_ms - manifest.started_ms) as f64 / 1000.0,
                },
            ),
            StageState::WillRun {
                identity,
                reason,
                resumes,
                ..
            } => {
                let held = lease::read(&engine.store.lease_path(&node.name, identity));
                let last = records
                    .iter()
                    .rev()
                    .find(|r| r.stage == node.name && &r.identity == identity);
                let state = match (held, last) {
                    (Some(l), _) if !l.is_stale(timeout) => State::Running {
                        pid: l.pid,
                        host: l.host,
                        heartbeat_ms: l.heartbeat_ms,
                    },
                    (_, Some(r)) if r.status == Status::Failed => State::Failed {
                        end_ms: r.end_ms,
                        error: r
                            .error
                            .as_deref()
                            .unwrap_or("")
                            .lines()
                            .next()
                            .unwrap_or("")
                            .to_string(),
                        log: r.log.clone(),
                    },
                    (_, Some(r)) if r.status == Status::Cancelled || *resumes => {
                        State::Stopped { end_ms: r.end_ms }
                    }
                    _ => State::Pending {
                        reason: reason.to_string(),
                    },
                };
                (Some(identity.clone()), state)
            }
            StageState::Waits { on } => (
                None,
                State::Pending {
                    reason: format!("after {}", names_list(on)),
                },
            ),
            StageState::Broken { error } => (
                None,
                State::Error {
                    error: error.clone(),
                },
            ),
        };
        let (job, folder) = match &identity {
            Some(id) => {
                let job = std::fs::read_to_string(crate::slurm::job_file(
                    &engine.store.log_path(&node.name, id),
                ))
                .ok()
                .map(|j| j.trim().to_string());
                let folder = [
                    engine.store.output_dir(&node.name, id),
                    engine.store.partial_dir(&node.name, id),
                ]
                .into_iter()
                .find(|d| d.is_dir());
                (job, folder)
            }
            None => (None, None),
        };
        out.push(StageStatus {
            name: node.name.clone(),
            kind: node.stage.kind().to_string(),
            identity,
            state,
            job,
            folder,
        });
    }
    Ok(out)
}
