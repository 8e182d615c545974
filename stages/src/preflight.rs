//! `preflight`: measure every worker's device before a multi-week run commits to it.
//!
//! ```yaml
//! - name: preflight
//!   kind: preflight
//!   ranks: 8            # worker processes, one per device, all probed at once
//!   nodes: 1            # machines they spread over, in blocks (more than one: Slurm only)
//!   backend: cpu        # cpu | cuda | rocm: what the train stages use
//!   min_ratio: 0.5      # a rank below min_ratio x the median GEMM or bandwidth is an outlier
//!   on_outlier: fail    # fail (name the ranks and hosts) | report (warn, record, go on)
//! ```
//! Each rank is its engine's probe (the torch worker's `--probe`: an `srun` step on its node
//! under Slurm) running the same GEMM and memory-bandwidth probe, and the same
//! median test, as the train stage's own health check at every launch
//! (`train.launch.preflight`, `zflow_runtime::dist::preflight`). The output holds `preflight.parquet`
//! (rank, host, device, GFLOP/s, GB/s, one matmul's f32 and bf16 GFLOP/s, outlier) and
//! `preflight.json` (the verdict and the
//! hosts to leave out), for `zflow query` and for a scheduler's exclude list.
//!
//! The stage is cached like any other, keyed on its config and on the machine it measured
//! (host name, and the Slurm node list when there is one): moving the recipe to another
//! machine or allocation measures again.

use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use arrow::array::{ArrayRef, BooleanArray, Float64Array, StringArray, UInt64Array};
use arrow::datatypes::{DataType, Field};
use serde::{Deserialize, Serialize};
use zflow_pipeline::{ConfigError, Stage, StageContext};
use zflow_runtime::contract::protocol::WorkerMessage;
use zflow_runtime::dist::preflight::{Probe, outliers};

use crate::running::{RankOutput, Running};
use crate::util::write_parquet;

/// The `preflight` stage kind.
pub struct Preflight;

/// What to do when a rank is an outlier.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnOutlier {
    /// Fail the stage, naming the ranks, hosts and numbers.
    #[default]
    Fail,
    /// Warn and record the hosts to leave out; the stage succeeds.
    Report,
}

/// `preflight` settings.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PreflightConfig {
    /// Worker processes to probe at once (one per device).
    #[serde(default = "one")]
    pub ranks: usize,
    /// Machines the ranks spread over, in blocks (as training places its ranks).
    #[serde(default = "one")]
    pub nodes: usize,
    /// The backend the probes run on: cpu, cuda or rocm.
    #[serde(default = "cpu")]
    pub backend: String,
    /// A rank below this fraction of the median GEMM or bandwidth is an outlier.
    #[serde(default = "half")]
    pub min_ratio: f64,
    /// What an outlier does to the stage.
    #[serde(default)]
    pub on_outlier: OnOutlier,
    /// The training engine whose probe runs (`crate::engine`).
    #[serde(default = "default_engine")]
    pub engine: String,
}

fn default_engine() -> String {
    zflow_runtime::contract::settings::DEFAULT_ENGINE.into()
}

fn one() -> usize {
    1
}
fn cpu() -> String {
    "cpu".into()
}
fn half() -> f64 {
    0.5
}

/// One rank's probe, as `preflight.json` records it.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RankProbe {
    /// The machine it ran on.
    pub host: String,
    /// The device description.
    pub device: String,
    /// The measurements.
    pub probe: Probe,
}

/// What `preflight.json` holds.
#[derive(Debug, Serialize, Deserialize)]
pub struct Verdict {
    /// Every rank's probe, in rank order.
    pub ranks: Vec<RankProbe>,
    /// Why each outlier is one ("GEMM 12.0 GFLOP/s is 0.4 x the median on host-3").
    pub outliers: Vec<String>,
    /// The hosts the verdict leaves out of training.
    pub exclude_hosts: Vec<String>,
}

impl Verdict {
    /// The verdict in a preflight stage's output folder, if it has one.
    pub fn read(folder: &Path) -> Option<Verdict> {
        serde_json::from_slice(&std::fs::read(folder.join("preflight.json")).ok()?).ok()
    }
}

impl Stage for Preflight {
    type Config = PreflightConfig;
    const KIND: &'static str = "preflight";
    const VERSION: u32 = 1;

    fn validate(&self, c: &PreflightConfig, _needs: &[String]) -> Result<(), ConfigError> {
        if c.ranks == 0 {
            return Err(ConfigError::new("ranks", "ranks must be at least 1"));
        }
        if c.nodes == 0 || !c.ranks.is_multiple_of(c.nodes) {
            return Err(ConfigError::new(
                "nodes",
                format!(
                    "nodes must be at least 1 and divide ranks ({}) evenly, got {}",
                    c.ranks, c.nodes
                ),
            ));
        }
        if !(c.min_ratio > 0.0 && c.min_ratio < 1.0) {
            return Err(ConfigError::new(
                "min_ratio",
                format!(
                    "min_ratio {} is not a fraction of the median in (0, 1)",
                    c.min_ratio
                ),
            ));
        }
        if !["cpu", "cuda", "rocm"].contains(&c.backend.as_str()) {
            return Err(ConfigError::new(
                "backend",
                format!(
                    "`{}` is not a backend; expected cpu, cuda or rocm",
                    c.backend
                ),
            ));
        }
        crate::engine::check(&c.engine).map_err(|e| ConfigError::new("engine", e))?;
        Ok(())
    }

    fn resources(&self, c: &PreflightConfig) -> zflow_pipeline::Resources {
        let gpus = if c.backend == "cpu" {
            0
        } else {
            c.ranks as u32
        };
        zflow_pipeline::Resources {
            cpus: c.ranks as u32,
            gpus,
            ranks: c.ranks as u32,
            nodes: c.nodes as u32,
            ..Default::default()
        }
    }

    fn external_fingerprint(
        &self,
        _c: &PreflightConfig,
        _cwd: &std::path::Path,
    ) -> Result<Option<String>> {
        let nodes = std::env::var("SLURM_JOB_NODELIST").unwrap_or_default();
        Ok(Some(format!(
            "host {} nodes {nodes}",
            zflow_pipeline::lease::hostname()
        )))
    }

    fn run(&self, c: &PreflightConfig, ctx: &StageContext) -> Result<()> {
        let slurm = crate::launch::SlurmJob::from_env()?;
        let spec = crate::launch::LaunchSpec {
            target: match &slurm {
                Some(job) => crate::launch::Target::Slurm(job),
                None => crate::launch::Target::Local,
            },
            world: c.ranks,
            backend: &c.backend,
            threads: crate::launch::threads_per_rank(None, ctx.threads(), c.ranks),
            env: Vec::new(),
            stage: ctx.name(),
        };
        let engine = crate::engine::probe_command(&c.engine, &c.backend)?;
        // All ranks at once, as in training: a shared memory bus or power cap shows. The
        // probes form no group, so they need no rendezvous.
        let launches = spec.processes(&engine, &[])?;
        let (mut running, output) = Running::start(&launches, |launch| {
            let mut cmd = launch.command(ctx.child_env());
            // A rank's own process names its rank here; a node agent names each of its own.
            cmd.env(
                zflow_runtime::contract::env::RANK,
                launch.ranks.start.to_string(),
            )
            .stdin(Stdio::null())
            .stderr(ctx.log().stdio()?);
            Ok(cmd)
        })
        .context("starting the probes")?;
        let mut last_line = vec![String::new(); c.ranks];
        let mut status = vec![None; c.ranks];
        for (rank, what) in output {
            match what {
                RankOutput::Line(line) => last_line[rank] = line,
                RankOutput::Starting => {}
                RankOutput::Ended(reported) => {
                    status[rank] = Some(match reported {
                        Some(s) => s,
                        None => running.wait(rank)?,
                    })
                }
            }
        }
        let mut ranks = Vec::new();
        for (rank, (line, status)) in last_line.iter().zip(&status).enumerate() {
            let status = status.expect("every rank ends");
            if !status.success() {
                let why = match WorkerMessage::parse(line) {
                    Some(WorkerMessage::Error { message, .. }) => message,
                    _ => status.to_string(),
                };
                bail!(
                    "the probe of rank {rank} failed: {why}; see {}",
                    ctx.log().path().display()
                );
            }
            let Some(WorkerMessage::Preflight {
                probe,
                host,
                device,
                ..
            }) = WorkerMessage::parse(line)
            else {
                bail!("rank {rank}'s probe said {line:?}, not a `preflight` message");
            };
            ranks.push(RankProbe {
                host,
                device,
                probe,
            });
        }
        let probes: Vec<Probe> = ranks.iter().map(|r| r.probe).collect();
        let slow = outliers(&probes, c.min_ratio);
        for (rank, r) in ranks.iter().enumerate() {
            tracing::info!(
                "rank {rank} on {}: GEMM {:.1} GFLOP/s, memory {:.1} GB/s, matmul f32 {:.1} / bf16 {:.1} GFLOP/s ({})",
                r.host,
                r.probe.gemm_gflops,
                r.probe.membw_gbps,
                r.probe.f32_gflops,
                r.probe.bf16_gflops,
                r.device
            );
        }
        let mut exclude_hosts: Vec<String> = slow
            .iter()
            .map(|(rank, _)| ranks[*rank].host.clone())
            .collect();
        exclude_hosts.sort();
        exclude_hosts.dedup();
        let out = ctx.out_dir();
        write_parquet(
            &out.join("preflight.parquet"),
            vec![
                Field::new("rank", DataType::UInt64, false),
                Field::new("host", DataType::Utf8, false),
                Field::new("device", DataType::Utf8, false),
                Field::new("gemm_gflops", DataType::Float64, false),
                Field::new("membw_gbps", DataType::Float64, false),
                Field::new("f32_gflops", DataType::Float64, false),
                Field::new("bf16_gflops", DataType::Float64, false),
                Field::new("outlier", DataType::Boolean, false),
            ],
            vec![
                Arc::new(UInt64Array::from_iter_values(0..ranks.len() as u64)) as ArrayRef,
                Arc::new(StringArray::from_iter_values(
                    ranks.iter().map(|r| r.host.as_str()),
                )),
                Arc::new(StringArray::from_iter_values(
                    ranks.iter().map(|r| r.device.as_str()),
                )),
                Arc::new(Float64Array::from_iter_values(
                    probes.iter().map(|p| p.gemm_gflops),
                )),
                Arc::new(Float64Array::from_iter_values(
                    probes.iter().map(|p| p.membw_gbps),
                )),
                Arc::new(Float64Array::from_iter_values(
                    probes.iter().map(|p| p.f32_gflops),
                )),
                Arc::new(Float64Array::from_iter_values(
                    probes.iter().map(|p| p.bf16_gflops),
                )),
                Arc::new(BooleanArray::from_iter(
                    (0..ranks.len()).map(|i| Some(slow.iter().any(|(r, _)| *r == i))),
                )),
            ],
        )?;
        let reasons: Vec<String> = slow
            .iter()
            .map(|(rank, why)| format!("{why} on {}", ranks[*rank].host))
            .collect();
        let verdict = Verdict {
            ranks,
            outliers: reasons.clone(),
            exclude_hosts,
        };
        std::fs::write(
            out.join("preflight.json"),
            serde_json::to_vec_pretty(&verdict)?,
        )?;
        if reasons.is_empty() {
            tracing::info!(
                "preflight: all {} rank(s) within {:.0}% of the median",
                c.ranks,
                100.0 * c.min_ratio
            );
            return Ok(());
        }
        match c.on_outlier {
            OnOutlier::Fail => bail!(
                "preflight found {} outlier rank(s) below {} x the median:\n  {}",
                reasons.len(),
                c.min_ratio,
                reasons.join("\n  ")
            ),
            OnOutlier::Report => {
                for why in &reasons {
                    tracing::warn!("preflight outlier: {why}");
                }
                Ok(())
            }
        }
    }
}
