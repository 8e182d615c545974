//! What a train stage records while it supervises: `metrics.jsonl` (one line per step and
//! held-out eval; `metrics.parquet`, `eval.parquet` at the end) and `events.jsonl` (every
//! failed launch, loss-spike rollback and preflight finding; `events.parquet`). Both survive
//! failed attempts of the stage.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use anyhow::Result;
use arrow::array::{ArrayRef, Float64Array, StringArray, UInt64Array};
use arrow::datatypes::{DataType, Field};
use serde::{Deserialize, Serialize};
use zflow_runtime::contract::protocol::StepMetrics;

use crate::jsonl::JsonLines;
use crate::util::write_parquet;

pub(super) fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// One thing that interrupted training: a failed launch (crash, hang, error) or a loss-spike
/// rollback; a line of `events.jsonl`, which survives failed attempts of the stage.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Event {
    /// `failure` (a launch that crashed, hung or errored), `loss_spike`, `preflight`, or the
    /// record of a run: `launch` (cause: its ranks and `train.launch.env`), `placement`
    /// (cause: each rank's host and device) and `network` (the all-reduce bus bandwidth).
    pub kind: String,
    /// Launch number (1 = first launch in this stage directory).
    pub attempt: u32,
    /// What happened.
    pub cause: String,
    /// Last step reported before it happened.
    pub step: u64,
    /// The step training went back to (loss spikes).
    #[serde(default)]
    pub rollback_to: Option<u64>,
    /// When the supervisor noticed (ms since the epoch).
    pub detected_ms: u64,
    /// Backoff before the relaunch, seconds (`None`: no relaunch, the stage failed).
    pub backoff_s: Option<f64>,
    /// When training made progress again (the first step reported afterwards).
    #[serde(default)]
    pub training_again_ms: Option<u64>,
}

impl Event {
    pub(super) fn failure(
        attempt: u32,
        cause: &str,
        step: u64,
        detected_ms: u64,
        backoff_s: Option<f64>,
    ) -> Event {
        Event {
            kind: "failure".into(),
            attempt,
            cause: cause.to_string(),
            step,
            rollback_to: None,
            detected_ms,
            backoff_s,
            training_again_ms: None,
        }
    }

    /// One line for `zflow status` and `zflow ui`: what it was, its attempt, its cause and
    /// how long training was down.
    pub fn describe(&self) -> String {
        let downtime = match self.downtime_s() {
            Some(s) => format!(", training again after {s:.1}s"),
            None if self.backoff_s.is_none() && self.kind == "failure" => {
                ", not relaunched".to_string()
            }
            None => String::new(),
        };
        let what = match self.kind.as_str() {
            "loss_spike" => "rollback",
            "preflight" => "preflight",
            _ => "restart",
        };
        format!(
            "{what} (attempt {}): {}{downtime}",
            self.attempt, self.cause
        )
    }

    /// Seconds from the fault's detection until training made progress again.
    pub fn downtime_s(&self) -> Option<f64> {
        Some(self.training_again_ms?.saturating_sub(self.detected_ms) as f64 / 1000.0)
    }
}

/// Events that record how training ran rather than interrupt it: each launch (its ranks and
/// environment), where its ranks ran (`placement`: host and device of each) and the launch's
/// all-reduce bus bandwidth (`network`).
const RECORD_KINDS: &[&str] = &["launch", "placement", "network"];

/// What interrupted training in a train stage's folder (its output, or its partial folder
/// while it runs): failed launches, loss-spike rollbacks and preflight findings, in order.
pub fn interruptions(folder: &Path) -> Vec<Event> {
    let events: JsonLines<Event> = JsonLines::open(&folder.join("events.jsonl"));
    events
        .records
        .into_iter()
        .filter(|e| !RECORD_KINDS.contains(&e.kind.as_str()))
        .collect()
}

/// The step and held-out records in a train stage's folder so far (`metrics.jsonl`), in order.
pub fn metrics(folder: &Path) -> Vec<Record> {
    JsonLines::open(&folder.join("metrics.jsonl")).records
}

/// The run's events so far, mirrored in `events.jsonl`.
pub(super) struct Events(JsonLines<Event>);

impl Events {
    pub(super) fn open(path: &Path) -> Result<Events> {
        Ok(Events(JsonLines::open(path)))
    }

    /// Records a new launch, described by `what` (its ranks and their environment), and
    /// returns its number (numbers continue across `zflow run`s, so a fault injected into
    /// attempt 1 fires once).
    pub(super) fn next_attempt(&mut self, what: &str) -> Result<u32> {
        let attempt = self.current_attempt() + 1;
        self.push(Event {
            kind: "launch".into(),
            ..Event::failure(attempt, what, 0, now_ms(), None)
        })?;
        Ok(attempt)
    }

    pub(super) fn current_attempt(&self) -> u32 {
        self.0
            .records
            .iter()
            .filter(|e| e.kind == "launch")
            .map(|e| e.attempt)
            .max()
            .unwrap_or(0)
    }

    /// Notes that training made progress: the newest open interruption ends here.
    pub(super) fn training_again(&mut self, ms: u64) -> Result<()> {
        if let Some(e) =
            self.0.records.iter_mut().rev().find(|e| {
                e.kind != "launch" && e.training_again_ms.is_none() && e.backoff_s.is_some()
            })
        {
            e.training_again_ms = Some(ms);
            self.0.rewrite()?;
        }
        Ok(())
    }

    pub(super) fn push(&mut self, e: Event) -> Result<()> {
        self.0.push(e)
    }

    /// `events.parquet`: every launch (its ranks and environment), where its ranks ran, and every
    /// interruption with its detection time and downtime.
    pub(super) fn write_parquet(&self, phase: &str, out: &Path) -> Result<()> {
        let rows: Vec<&Event> = self.0.records.iter().collect();
        write_parquet(
            &out.join("events.parquet"),
            vec![
                Field::new("phase", DataType::Utf8, false),
                Field::new("kind", DataType::Utf8, false),
                Field::new("attempt", DataType::UInt64, false),
                Field::new("step", DataType::UInt64, false),
                Field::new("cause", DataType::Utf8, false),
                Field::new("downtime_s", DataType::Float64, true),
                Field::new("detected_ms", DataType::UInt64, false),
            ],
            vec![
                Arc::new(StringArray::from(vec![phase; rows.len()])),
                Arc::new(StringArray::from_iter_values(
                    rows.iter().map(|e| e.kind.as_str()),
                )),
                Arc::new(UInt64Array::from_iter_values(
                    rows.iter().map(|e| e.attempt as u64),
                )),
                Arc::new(UInt64Array::from_iter_values(rows.iter().map(|e| e.step))),
                Arc::new(StringArray::from_iter_values(
                    rows.iter().map(|e| e.cause.as_str()),
                )),
                Arc::new(Float64Array::from(
                    rows.iter().map(|e| e.downtime_s()).collect::<Vec<_>>(),
                )),
                Arc::new(UInt64Array::from_iter_values(
                    rows.iter().map(|e| e.detected_ms),
                )),
            ],
        )
    }
}

/// One line of `metrics.jsonl`: `{"type": "step", ...}` or `{"type": "eval", ...}`.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Record {
    /// An optimizer step's metrics, as the worker reported them.
    Step(StepMetrics),
    /// A held-out evaluation.
    Eval {
        /// The optimizer step it followed.
        step: u64,
        /// (source, mean loss per token) for each held-out source.
        losses: Vec<(String, f64)>,
    },
}

impl Record {
    /// The optimizer step it belongs to.
    pub fn step(&self) -> u64 {
        match self {
            Record::Step(s) => s.step,
            Record::Eval { step, .. } => *step,
        }
    }
}

/// The phase's metrics so far, mirrored in `metrics.jsonl` (which survives failed attempts).
pub(super) struct Metrics(JsonLines<Record>);

impl Metrics {
    pub(super) fn open(path: &Path) -> Result<Metrics> {
        Ok(Metrics(JsonLines::open(path)))
    }

    /// Drops what came after `step` (a resumed worker recomputes it) and rewrites the file.
    pub(super) fn truncate_after(&mut self, step: u64) -> Result<()> {
        self.0.records.retain(|r| r.step() <= step);
        self.0.rewrite()
    }

    pub(super) fn push(&mut self, r: Record) -> Result<()> {
        self.0.push(r)
    }

    pub(super) fn write_parquet(&self, phase: &str, out: &Path) -> Result<()> {
        let steps: Vec<&StepMetrics> = self
            .0
            .records
            .iter()
            .filter_map(|r| {
                if let Record::Step(s) = r {
                    Some(s)
                } else {
                    None
                }
            })
            .collect();
        let routes = steps.first().map(|s| s.expert_load.len()).unwrap_or(0);
        let mut fields = vec![
            Field::new("phase", DataType::Utf8, false),
            Field::new("step", DataType::UInt64, false),
            Field::new("loss", DataType::Float64, false),
            Field::new("lr", DataType::Float64, false),
            Field::new("grad_norm", DataType::Float64, false),
            Field::new("tokens_per_s", DataType::Float64, false),
            Field::new("tokens", DataType::UInt64, false),
            Field::new("balance_error", DataType::Float64, false),
        ];
        let mut cols: Vec<ArrayRef> = vec![
            Arc::new(StringArray::from(vec![phase; steps.len()])),
            Arc::new(UInt64Array::from_iter_values(steps.iter().map(|s| s.step))),
            Arc::new(Float64Array::from_iter_values(steps.iter().map(|s| s.loss))),
            Arc::new(Float64Array::from_iter_values(steps.iter().map(|s| s.lr))),
            Arc::new(Float64Array::from_iter_values(
                steps.iter().map(|s| s.grad_norm),
            )),
            Arc::new(Float64Array::from_iter_values(
                steps.iter().map(|s| s.tokens_per_s),
            )),
            Arc::new(UInt64Array::from_iter_values(
                steps.iter().map(|s| s.tokens),
            )),
            Arc::new(Float64Array::from_iter_values(
                steps.iter().map(|s| s.balance_error),
            )),
        ];
        // One column per route: tokens routed there this step, summed over MoE layers.
        for r in 0..routes {
            fields.push(Field::new(format!("load_{r}"), DataType::UInt64, false));
            cols.push(Arc::new(UInt64Array::from_iter_values(
                steps
                    .iter()
                    .map(|s| s.expert_load.get(r).copied().unwrap_or(0)),
            )));
        }
        write_parquet(&out.join("metrics.parquet"), fields, cols)?;

        let mut evals: BTreeMap<(u64, String), f64> = BTreeMap::new();
        for r in &self.0.records {
            if let Record::Eval { step, losses } = r {
                for (s, l) in losses {
                    evals.insert((*step, s.clone()), *l);
                }
            }
        }
        write_parquet(
            &out.join("eval.parquet"),
            vec![
                Field::new("phase", DataType::Utf8, false),
                Field::new("step", DataType::UInt64, false),
                Field::new("source", DataType::Utf8, false),
                Field::new("loss", DataType::Float64, false),
            ],
            vec![
                Arc::new(StringArray::from(vec![phase; evals.len()])),
                Arc::new(UInt64Array::from_iter_values(evals.keys().map(|k| k.0))),
                Arc::new(StringArray::from_iter_values(
                    evals.keys().map(|k| k.1.as_str()),
                )),
                Arc::new(Float64Array::from_iter_values(evals.values().copied())),
            ],
        )
    }
}
