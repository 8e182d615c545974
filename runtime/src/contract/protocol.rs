//! The worker protocol: one JSON object per line on the worker's stdout.
//!
//! A train stage (the supervisor) launches worker processes and reads these lines; any
//! trainer that prints the same lines can be supervised the same way. Everything else a worker
//! prints goes to stderr, which the supervisor copies into the stage log.

use serde::{Deserialize, Serialize};

/// Where a worker's messages go (stdout in a worker process); callable from any thread.
pub type Emit = std::sync::Arc<dyn Fn(WorkerMessage) + Send + Sync>;

/// A message from a worker to its supervisor.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum WorkerMessage {
    /// First line: who is speaking and where training starts.
    Hello {
        /// This worker's rank.
        rank: usize,
        /// Number of ranks.
        world: usize,
        /// Backend and device, e.g. "flex cpu".
        device: String,
        /// The machine it runs on.
        #[serde(default)]
        host: String,
        /// Optimizer step training resumes at (0 for a fresh start).
        start_step: u64,
        /// Steps in the phase.
        total_steps: u64,
        /// Parameters in the model.
        params: u64,
        /// The launch's all-reduce bus bandwidth in GB/s, measured at start with the
        /// preflight probe (`None` without one, or on one rank).
        #[serde(default)]
        allreduce_gbps: Option<f64>,
        /// This rank's exchanges with its ring neighbours, measured with the all-reduce
        /// (empty without a preflight, or on one rank).
        #[serde(default)]
        links: Vec<crate::dist::preflight::LinkProbe>,
    },
    /// The preflight probe of this rank's device: sent before training when asked for
    /// (`ZFLOW_PREFLIGHT`), and the one message of a probe-only run (a worker started with `--probe`).
    Preflight {
        /// This worker's rank.
        rank: usize,
        /// What it measured.
        probe: crate::dist::preflight::Probe,
        /// The machine it ran on.
        #[serde(default)]
        host: String,
        /// The device it measured, e.g. "flex cpu".
        #[serde(default)]
        device: String,
    },
    /// Liveness, sent between steps when a step takes long.
    Heartbeat {
        /// The step in progress.
        step: u64,
    },
    /// One optimizer step.
    Step(StepMetrics),
    /// Held-out loss per source.
    Eval {
        /// The step after which it was measured.
        step: u64,
        /// (source, mean loss in nats per token).
        losses: Vec<(String, f64)>,
    },
    /// A checkpoint was committed (its directory is complete).
    CheckpointCommitted {
        /// Step of the checkpoint.
        step: u64,
        /// Its directory.
        path: String,
    },
    /// The loss-spike guard fired: training goes back to checkpoint `rollback_to` and skips
    /// the batch that caused the spike.
    LossSpike {
        /// The step whose loss spiked.
        step: u64,
        /// Its loss.
        loss: f64,
        /// How many standard deviations above the recent mean it was.
        z: f64,
        /// The step training resumes from.
        rollback_to: u64,
        /// First global sample of the skipped batch.
        skipped_sample: u64,
    },
    /// The phase finished.
    Done {
        /// Final step.
        step: u64,
        /// Final training loss (`None` when no step was ever recorded, e.g. a phase that
        /// ran out of samples before its first step).
        loss: Option<f64>,
    },
    /// The worker failed; it exits right after, with its class's exit code.
    Error {
        /// What went wrong.
        message: String,
        /// What the supervisor should do about it ([`crate::contract::exit`]).
        #[serde(default)]
        class: crate::contract::exit::Failure,
    },
}

/// The metrics of one optimizer step.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StepMetrics {
    /// Optimizer step (1-based: the number of updates applied).
    pub step: u64,
    /// Mean training loss over the global batch (nats per token).
    pub loss: f64,
    /// Learning rate used for the update.
    pub lr: f64,
    /// Global gradient norm before clipping.
    pub grad_norm: f64,
    /// Training throughput of this step.
    pub tokens_per_s: f64,
    /// Tokens seen in the phase so far.
    pub tokens: u64,
    /// Tokens routed to each route (experts, then the skip route), summed over MoE layers.
    pub expert_load: Vec<u64>,
    /// Load-balance error averaged over MoE layers (total-variation distance to the target).
    pub balance_error: f64,
}

impl WorkerMessage {
    /// The [`WorkerMessage::Preflight`] of rank `rank`, which measured `probe` on `device`, on
    /// this machine.
    pub fn preflight(rank: usize, probe: crate::dist::preflight::Probe, device: String) -> Self {
        WorkerMessage::Preflight {
            rank,
            probe,
            host: gethostname::gethostname().to_string_lossy().into_owned(),
            device,
        }
    }

    /// The message as one JSON line (no newline).
    pub fn to_line(&self) -> String {
        serde_json::to_string(self).expect("worker messages serialise")
    }

    /// Parses one line; `None` for lines that are not protocol messages.
    pub fn parse(line: &str) -> Option<WorkerMessage> {
        serde_json::from_str(line.trim()).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_as_tagged_json_lines() {
        let m = WorkerMessage::CheckpointCommitted {
            step: 7,
            path: "/x".into(),
        };
        let line = m.to_line();
        assert_eq!(
            line,
            r#"{"type":"checkpoint_committed","step":7,"path":"/x"}"#
        );
        assert_eq!(WorkerMessage::parse(&line), Some(m));
        assert_eq!(WorkerMessage::parse("warning: something"), None);
    }
}
