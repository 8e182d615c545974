//! The supervisor's watch over one launch: every rank started through the engine's command,
//! their JSON lines read, a failed, hung or finished launch told apart, the culprit of a failure
//! named ([`Train::attempt`]).

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use zflow_pipeline::StageContext;
use zflow_runtime::contract::exit::Failure;
use zflow_runtime::contract::protocol::WorkerMessage;
use zflow_runtime::contract::settings::Dtype;

use super::record::{Event, Events, Metrics, Record, now_ms};
use super::{Train, TrainConfig};
use crate::launch::SlurmJob;
use crate::running::{RankOutput, Running};

/// How one launch of the workers ended.
pub(super) enum Outcome {
    Finished,
    /// The preflight check found `slow` ranks to leave out.
    Exclude {
        slow: usize,
    },
    Failed {
        cause: String,
        step: u64,
        /// No relaunch can fix it ([`Failure::Fatal`]).
        fatal: bool,
    },
}

/// A gap between two turns of the supervisor's loop longer than this means the supervisor
/// itself was paused.
const SUPERVISOR_PAUSE: Duration = Duration::from_secs(2);

/// One rank as the supervisor sees it.
struct Rank {
    last_message: Instant,
    step: u64,
    done: bool,
    exited: Option<std::process::ExitStatus>,
    error: Option<String>,
    /// The class its `error` message gave.
    class: Option<Failure>,
    probe: Option<zflow_runtime::dist::preflight::Probe>,
    /// Its exchanges with its ring neighbours, from its `hello` (empty without a preflight).
    links: Option<Vec<zflow_runtime::dist::preflight::LinkProbe>>,
    /// Where it runs, from its `preflight` or `hello`: "host (device)".
    place: Option<String>,
    /// When its output ended (1 = the first rank to leave): the order the ranks left in.
    left: Option<usize>,
}

impl Rank {
    /// Why this (failed) rank failed: as its `error` message said, else as its exit code
    /// says, else (a signal, an unknown code) worth a retry.
    fn failure(&self) -> Failure {
        self.class
            .or_else(|| {
                self.exited
                    .and_then(|s| s.code())
                    .and_then(Failure::from_exit_code)
            })
            .unwrap_or(Failure::Retry)
    }
}

impl Train {
    /// Launches every rank once (launch number `attempt`, `world` ranks, in the Slurm job
    /// `slurm` if any) and watches them until all finish, one fails or hangs, or the
    /// run is cancelled; a failed launch has all its ranks stopped before this returns.
    pub(super) fn attempt(
        &self,
        c: &TrainConfig,
        ctx: &StageContext,
        job_path: &Path,
        (slurm, world, attempt): (Option<&SlurmJob>, usize, u32),
        metrics: &mut Metrics,
        events: &mut Events,
    ) -> Result<Outcome> {
        let spec = super::launch_spec(c, ctx.name(), ctx.threads(), slurm, world, attempt);
        let placements = spec.placements()?;
        let mut engine =
            crate::engine::worker_command(&c.train.engine, job_path, &c.train.backend)?;
        if spec.local_cpu() {
            engine = crate::forkserver::wrap(engine);
        }
        let launches = spec.processes(&engine, &placements)?;
        let (mut running, rx) = Running::start(&launches, |launch| {
            let mut cmd = launch.command(ctx.child_env());
            cmd.current_dir(ctx.out_dir())
                .stdin(Stdio::null())
                .stderr(ctx.log().stdio()?);
            Ok(cmd)
        })
        .context("starting the training workers")?;
        // A node agent's ranks end through its lines, not through a process of their own.
        let launched_by_agent = launches.iter().any(|l| l.agent);
        let mut ranks: Vec<Rank> = (0..world)
            .map(|_| Rank {
                last_message: Instant::now(),
                step: 0,
                done: false,
                exited: None,
                error: None,
                class: None,
                probe: None,
                links: None,
                place: None,
                left: None,
            })
            .collect();
        tracing::info!("attempt {attempt}: {world} worker rank(s) started");
        // Ranks' ends of output counted in the order they came ([`Rank::left`]).
        let mut left = 0usize;

        let hang = Duration::from_secs(c.launch.hang_timeout_s);
        let mut preflight_pending = c.launch.preflight.enabled;
        let mut links_pending = c.launch.preflight.enabled && world > 1;
        let mut placed = false;
        let mut last_tick = Instant::now();
        loop {
            if preflight_pending && ranks.iter().all(|r| r.probe.is_some()) {
                preflight_pending = false;
                let probes: Vec<_> = ranks.iter().map(|r| r.probe.expect("all probed")).collect();
                for (rank, p) in probes.iter().enumerate() {
                    tracing::info!(
                        "preflight rank {rank}: GEMM {:.1} GFLOP/s, memory {:.1} GB/s, matmul f32 {:.1} / bf16 {:.1} GFLOP/s",
                        p.gemm_gflops,
                        p.membw_gbps,
                        p.f32_gflops,
                        p.bf16_gflops
                    );
                }
                // The phase's own bf16 work where bf16 is slow: the one setting that asks for
                // bf16 products on the CPU (GPUs multiply in bf16 under autocast, and all of
                // them fast).
                if c.train.muon.ns_dtype == Dtype::Bf16 {
                    let places: Vec<String> =
                        ranks.iter().map(|r| place_of(r).to_string()).collect();
                    if let Some(why) = zflow_runtime::dist::preflight::slow_bf16_warning(
                        &probes,
                        &places,
                        "train.muon.ns_dtype",
                    ) {
                        tracing::warn!("preflight: {why}");
                        events.push(Event {
                            kind: "preflight".into(),
                            ..Event::failure(attempt, &why, 0, now_ms(), None)
                        })?;
                    }
                }
                let slow =
                    zflow_runtime::dist::preflight::outliers(&probes, c.launch.preflight.min_ratio);
                for (rank, why) in &slow {
                    let why = format!("{why}, on {}", place_of(&ranks[*rank]));
                    tracing::warn!("preflight: {why}");
                    events.push(Event {
                        kind: "preflight".into(),
                        ..Event::failure(attempt, &why, 0, now_ms(), None)
                    })?;
                }
                let rest = world - slow.len();
                if c.launch.preflight.exclude && !slow.is_empty() {
                    // Context parallelism leaves out whole groups only.
                    let cp = c.launch.context_parallel();
                    if rest > 0
                        && rest.is_multiple_of(cp)
                        && c.train
                            .global_batch
                            .is_multiple_of(rest / cp * c.train.micro_batch)
                    {
                        running.stop_all();
                        return Ok(Outcome::Exclude { slow: slow.len() });
                    }
                    tracing::warn!(
                        "preflight: cannot leave out {} rank(s): global_batch {} does not divide over {rest} x micro_batch {}",
                        slow.len(),
                        c.train.global_batch,
                        c.train.micro_batch
                    );
                }
            }
            if links_pending && ranks.iter().all(|r| r.links.is_some()) {
                links_pending = false;
                record_links(&ranks, c.launch.preflight.min_ratio, attempt, events)?;
            }
            match rx.recv_timeout(Duration::from_millis(100)) {
                Ok((rank, RankOutput::Starting)) => ranks[rank].last_message = Instant::now(),
                Ok((rank, RankOutput::Line(line))) => {
                    let r = &mut ranks[rank];
                    r.last_message = Instant::now();
                    match WorkerMessage::parse(&line) {
                        Some(m) => {
                            self.handle(rank, m, ctx, metrics, events, r)?;
                            if !placed && ranks.iter().all(|r| r.place.is_some()) {
                                placed = true;
                                record_placement(&ranks, attempt, events)?;
                            }
                        }
                        None => ctx.log().line(&format!("[rank {rank}] {line}")),
                    }
                }
                Ok((rank, RankOutput::Ended(reported))) => {
                    left += 1;
                    ranks[rank].left = Some(left);
                    let status = match reported {
                        Some(status) => status,
                        None => running.wait(rank)?,
                    };
                    let r = &mut ranks[rank];
                    r.exited = Some(status);
                    if !(status.success() && r.done) {
                        // When one rank leaves, the others fail in their next collective
                        // ("Connection closed by peer"): give them a moment, read what they
                        // said, then blame the rank that left first among those that did not
                        // merely lose a peer.
                        let deadline = Instant::now() + Duration::from_secs(1);
                        let mut held = Vec::new();
                        while Instant::now() < deadline && ranks.iter().any(|r| r.exited.is_none())
                        {
                            for (i, r) in ranks.iter_mut().enumerate() {
                                if r.exited.is_none() && !launched_by_agent {
                                    r.exited = running.try_wait(i)?;
                                }
                            }
                            for (i, what) in rx.try_iter() {
                                if let RankOutput::Ended(Some(s)) = what {
                                    ranks[i].exited.get_or_insert(s);
                                }
                                held.push((i, what));
                            }
                            std::thread::sleep(Duration::from_millis(20));
                        }
                        // Every line and end of output still queued, in the order they came:
                        // an end of output is when that rank left.
                        held.extend(rx.try_iter());
                        for (rank, what) in held.drain(..) {
                            match what {
                                RankOutput::Line(line) => {
                                    if let Some(WorkerMessage::Error { message, class }) =
                                        WorkerMessage::parse(&line)
                                    {
                                        ranks[rank].error = Some(message);
                                        ranks[rank].class = Some(class);
                                    }
                                }
                                RankOutput::Starting => {}
                                RankOutput::Ended(status) => {
                                    left += 1;
                                    ranks[rank].left.get_or_insert(left);
                                    if let Some(status) = status {
                                        ranks[rank].exited.get_or_insert(status);
                                    } else if launched_by_agent && ranks[rank].exited.is_none() {
                                        // Its agent ended first: the node's step was lost.
                                        ranks[rank].exited = Some(running.wait(rank)?);
                                    }
                                }
                            }
                        }
                        let failed: Vec<usize> = (0..ranks.len())
                            .filter(|&i| {
                                ranks[i]
                                    .exited
                                    .is_some_and(|s| !(s.success() && ranks[i].done))
                            })
                            .collect();
                        let culprit = culprit(&ranks, &failed).unwrap_or(rank);
                        let fatal = ranks[culprit].failure() == Failure::Fatal;
                        let r = &ranks[culprit];
                        let status = r.exited.expect("exited");
                        let why = r.error.clone().unwrap_or_else(|| {
                            if status.success() {
                                "exited with status 0 without reporting `done`".into()
                            } else {
                                describe(&status)
                            }
                        });
                        let step = r.step;
                        let others: Vec<String> = failed
                            .iter()
                            .filter(|&&i| i != culprit)
                            .map(|i| i.to_string())
                            .collect();
                        let then = if others.is_empty() {
                            String::new()
                        } else {
                            format!("; rank(s) {} failed after it", others.join(", "))
                        };
                        running.stop_all();
                        return Ok(Outcome::Failed {
                            cause: format!("rank {culprit} failed after step {step}: {why}{then}"),
                            step,
                            fatal,
                        });
                    }
                    if ranks.iter().all(|r| r.exited.is_some()) {
                        return Ok(Outcome::Finished);
                    }
                }
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                    return Ok(Outcome::Finished);
                }
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
            }
            if ctx.cancel_token().is_cancelled() {
                running.stop_all();
                bail!("cancelled");
            }
            // A loop turn takes ~100 ms. A long gap means this process was not running (SIGSTOP,
            // a suspended laptop, a starved host): the ranks' silence over that time is ours,
            // not theirs, so their hang clocks start again.
            let gap = last_tick.elapsed();
            last_tick = Instant::now();
            if gap > SUPERVISOR_PAUSE {
                tracing::warn!(
                    "the supervisor did not run for {:.1} s; not counting that time against the ranks' hang timeout",
                    gap.as_secs_f64()
                );
                for r in &mut ranks {
                    r.last_message = last_tick;
                }
            }
            if let Some((rank, r)) = ranks
                .iter()
                .enumerate()
                .find(|(_, r)| r.exited.is_none() && r.last_message.elapsed() > hang)
            {
                let (step, secs) = (r.step, r.last_message.elapsed().as_secs());
                running.stop_all();
                return Ok(Outcome::Failed {
                    cause: format!(
                        "rank {rank} hung after step {step}: no message for {secs} s (hang_timeout_s {})",
                        c.launch.hang_timeout_s
                    ),
                    step,
                    fatal: false,
                });
            }
        }
    }

    fn handle(
        &self,
        rank: usize,
        m: WorkerMessage,
        ctx: &StageContext,
        metrics: &mut Metrics,
        events: &mut Events,
        r: &mut Rank,
    ) -> Result<()> {
        match m {
            WorkerMessage::Hello {
                device,
                host,
                start_step,
                total_steps,
                params,
                world,
                allreduce_gbps,
                links,
                ..
            } => {
                r.step = start_step;
                r.place = Some(format!("{host} ({device})"));
                r.links = Some(links);
                if rank == 0 {
                    ctx.progress().set_length(total_steps);
                    ctx.progress().set_position(start_step);
                    metrics.truncate_after(start_step)?;
                    let from = if start_step > 0 {
                        format!(", resuming at step {start_step}")
                    } else {
                        String::new()
                    };
                    tracing::info!(
                        "{world} rank(s) on {device}: {params} parameters, {total_steps} steps{from}"
                    );
                    if let Some(gbps) = allreduce_gbps {
                        tracing::info!(
                            "preflight: all-reduce bus bandwidth {gbps:.2} GB/s over {world} ranks"
                        );
                        let attempt = events.current_attempt();
                        events.push(Event {
                            kind: "network".into(),
                            ..Event::failure(
                                attempt,
                                &format!(
                                    "all-reduce bus bandwidth {gbps:.2} GB/s over {world} ranks"
                                ),
                                start_step,
                                now_ms(),
                                None,
                            )
                        })?;
                    }
                }
            }
            WorkerMessage::Heartbeat { .. } => {}
            WorkerMessage::Preflight {
                probe,
                host,
                device,
                ..
            } => {
                r.probe = Some(probe);
                r.place = Some(format!("{host} ({device})"));
            }
            WorkerMessage::Step(s) => {
                r.step = s.step;
                if rank != 0 {
                    return Ok(());
                }
                events.training_again(now_ms())?;
                ctx.progress().set_position(s.step);
                ctx.progress()
                    .set_message(format!("loss {:.3}  {:.0} tok/s", s.loss, s.tokens_per_s));
                if s.step % 10 == 0 || s.step == 1 {
                    tracing::info!(
                        "step {} loss {:.4} lr {:.2e} grad-norm {:.3} {:.0} tok/s balance-error {:.3}",
                        s.step,
                        s.loss,
                        s.lr,
                        s.grad_norm,
                        s.tokens_per_s,
                        s.balance_error
                    );
                }
                metrics.push(Record::Step(s))?;
            }
            WorkerMessage::Eval { step, losses } => {
                let text: Vec<String> = losses.iter().map(|(s, l)| format!("{s} {l:.4}")).collect();
                tracing::info!("step {step} held-out loss: {}", text.join(", "));
                metrics.push(Record::Eval { step, losses })?;
            }
            WorkerMessage::CheckpointCommitted { step, path } => {
                tracing::info!("checkpoint at step {step}: {path}")
            }
            WorkerMessage::LossSpike {
                step,
                loss,
                z,
                rollback_to,
                skipped_sample,
            } => {
                if rank == 0 {
                    tracing::warn!(
                        "loss spike at step {step} (loss {loss:.4}, z {z:.1}): rolled back to step {rollback_to}, skipping the batch at sample {skipped_sample}"
                    );
                    metrics.truncate_after(rollback_to)?;
                    ctx.progress().set_position(rollback_to);
                    let cause = format!(
                        "loss spike at step {step}: loss {loss:.4}, z {z:.1}; batch at sample {skipped_sample} skipped"
                    );
                    events.push(Event {
                        kind: "loss_spike".into(),
                        rollback_to: Some(rollback_to),
                        ..Event::failure(
                            events.current_attempt(),
                            &cause,
                            step,
                            now_ms(),
                            Some(0.0),
                        )
                    })?;
                }
            }
            WorkerMessage::Done { step, loss } => {
                if rank == 0 {
                    match loss {
                        Some(loss) => tracing::info!("phase done at step {step}, loss {loss:.4}"),
                        None => tracing::info!("phase done at step {step}"),
                    }
                }
                r.done = true;
            }
            WorkerMessage::Error { message, class } => {
                r.error = Some(message);
                r.class = Some(class);
            }
        }
        Ok(())
    }
}

/// The rank to blame among the `failed` ones: one whose failure no relaunch can fix, else the
/// first to leave of those that did not merely lose a peer, else the first to leave. A rank
/// still running (or whose end of output never came) counts as leaving last.
fn culprit(ranks: &[Rank], failed: &[usize]) -> Option<usize> {
    let mut by_leaving = failed.to_vec();
    by_leaving.sort_by_key(|&i| (ranks[i].left.unwrap_or(usize::MAX), i));
    by_leaving
        .iter()
        .copied()
        .find(|&i| ranks[i].failure() == Failure::Fatal)
        .or_else(|| {
            by_leaving
                .iter()
                .copied()
                .find(|&i| ranks[i].failure() != Failure::LostPeer)
        })
        .or_else(|| by_leaving.first().copied())
}

fn describe(status: &std::process::ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exit status {code}"),
        (None, Some(sig)) => {
            let name = match sig {
                libc::SIGABRT => " (SIGABRT)",
                libc::SIGKILL => " (SIGKILL)",
                libc::SIGSEGV => " (SIGSEGV)",
                libc::SIGTERM => " (SIGTERM)",
                libc::SIGBUS => " (SIGBUS)",
                _ => "",
            };
            format!("killed by signal {sig}{name}")
        }
        _ => "ended without finishing the phase".into(),
    }
}

/// Where a rank runs, "host (device)", as its messages said.
fn place_of(r: &Rank) -> &str {
    r.place.as_deref().unwrap_or("an unknown host")
}

/// Every rank's link figures into the log, and a rank with a slow link (with where it runs)
/// into the log and the run record (an `events` row of kind `preflight`).
fn record_links(ranks: &[Rank], min_ratio: f64, attempt: u32, events: &mut Events) -> Result<()> {
    use zflow_runtime::dist::preflight::link_outliers;
    let links: Vec<_> = ranks
        .iter()
        .map(|r| r.links.clone().unwrap_or_default())
        .collect();
    for (rank, l) in links.iter().enumerate() {
        let shown: Vec<String> = l.iter().map(ToString::to_string).collect();
        tracing::info!("preflight rank {rank}: network {}", shown.join(", "));
    }
    for (rank, why) in link_outliers(&links, min_ratio) {
        let why = format!("{why}, on {}", place_of(&ranks[rank]));
        tracing::warn!("preflight: {why}");
        events.push(Event {
            kind: "preflight".into(),
            ..Event::failure(attempt, &why, 0, now_ms(), None)
        })?;
    }
    Ok(())
}

/// Where every rank of launch `attempt` runs, one host and device each, into the run record
/// (an `events` row of kind `placement`) and the log.
fn record_placement(ranks: &[Rank], attempt: u32, events: &mut Events) -> Result<()> {
    let places: Vec<String> = ranks
        .iter()
        .enumerate()
        .map(|(i, r)| format!("rank {i}: {}", r.place.as_deref().unwrap_or("?")))
        .collect();
    let hosts: std::collections::BTreeSet<&str> = ranks
        .iter()
        .filter_map(|r| r.place.as_deref()?.split(' ').next())
        .collect();
    tracing::info!("ranks on {} host(s): {}", hosts.len(), places.join(", "));
    events.push(Event {
        kind: "placement".into(),
        ..Event::failure(attempt, &places.join("; "), 0, now_ms(), None)
    })
}
