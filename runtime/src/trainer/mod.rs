//! The trainer: one phase of ZAYA1 pretraining on one rank.
//!
//! Per optimizer step: `global_batch / (world x micro_batch)` micro-batches are read through the
//! data cursor, their gradients accumulated, clipped by global norm, then Muon updates the 2-D
//! weight matrices and AdamW everything else (embedding, norms, biases, gates, temperatures,
//! convolutions), both on the WSD schedule. After the update the balancing controller moves
//! the router biases from the step's routing counts. Checkpoints are written every
//! `checkpoint_every` steps and at the end; a restarted worker resumes from the newest one that
//! verifies and reproduces the uninterrupted run bit for bit (same batches, same order of
//! floating-point operations).

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result, ensure};
use burn::module::{AutodiffModule, Module, ModuleVisitor, Param, ParamId};
use burn::optim::adaptor::OptimizerAdaptor;
use burn::optim::decay::WeightDecayConfig;
use burn::optim::momentum::MomentumConfig;
use burn::optim::{
    AdamW, AdamWConfig, AdjustLrFn, GradientsAccumulator, GradientsParams, Muon, MuonConfig,
    Optimizer,
};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Int, Tensor, TensorData};

use crate::checkpoint::saver::Saver;
use crate::checkpoint::{self, TrainerState};
use crate::contract::job::TrainJob;
use crate::contract::protocol::{Emit, StepMetrics, WorkerMessage};
use crate::contract::settings::TrainSettings;
use crate::data::TokenSource;
use crate::data::mixture::MixtureReader;
use crate::dist::collective::Group;
use crate::dist::data_parallel::{self, Plan, StepSums};
use crate::dist::zero;
use crate::model::Zaya;
use balance::BalanceState;
use faults::{Faults, Kind};

pub mod balance;
pub mod faults;
mod heldout;
pub mod schedule;
pub mod spike;
mod state;
pub mod worker;

pub use heldout::evaluate;
use heldout::open_heldout;
use state::restore;
pub(crate) use state::snapshot;

type MuonOpt<B> = OptimizerAdaptor<Muon<<B as AutodiffBackend>::InnerBackend>, Zaya<B>, B>;
type AdamOpt<B> = OptimizerAdaptor<AdamW, Zaya<B>, B>;

/// Trains `job` on backend `B` as rank `group.rank` of `group.world`, sending protocol
/// messages to `emit`; `faults` are the injected faults that apply to this rank.
pub fn train<B: AutodiffBackend>(
    job: &TrainJob,
    device: &B::Device,
    device_name: &str,
    emit: &Emit,
    faults: &Faults,
    group: &mut Group,
) -> Result<()> {
    let t = &job.train;
    t.validate()
        .map_err(|e| anyhow::anyhow!("phase `{}`: {e}", job.phase))?;
    let (rank, world) = (group.rank, group.world);
    ensure!(
        t.global_batch.is_multiple_of(world * t.micro_batch),
        "phase `{}`: global_batch {} is not a multiple of {world} ranks x micro_batch {}",
        job.phase,
        t.global_batch,
        t.micro_batch
    );
    let accumulation = t.global_batch / (world * t.micro_batch);

    let mut sources: Vec<Arc<dyn TokenSource>> = Vec::new();
    for s in &job.sources {
        sources.push(Arc::new(s.open_tokens()?));
    }
    let reader = MixtureReader::open(&job.mixture, sources)?;
    let seq_len = reader.seq_len();
    let total_steps = reader.num_samples() / t.global_batch as u64;
    ensure!(
        total_steps > 0,
        "phase `{}`: the mixture has {} samples, fewer than one global batch of {}",
        job.phase,
        reader.num_samples(),
        t.global_batch
    );

    let model_config = job.phase_model();
    let shape_model: Zaya<B> = Zaya::new(&model_config, t.seed, device);
    let layout = zero::Layout::new(&param_list(&shape_model), world)?;
    let plan = Plan::new(&layout);
    drop(shape_model);
    let (mut model, mut optim, mut state) =
        start::<B>(job, total_steps, &reader, &layout, rank, device)?;

    let heldout = if rank == 0 {
        open_heldout(job)?
    } else {
        Vec::new()
    };
    let routes = model.routes();
    let target = balance::target_shares(routes, job.model.mod_skip, &t.balance);
    let params: u64 = model.num_params() as u64;
    emit(WorkerMessage::Hello {
        rank,
        world,
        device: device_name.to_string(),
        start_step: state.step,
        total_steps,
        params,
    });
    tracing::debug!(
        "{} parameters; {} weight matrices trained with Muon; rank {rank} owns {} of {} values",
        params,
        optim.muon_ids.len(),
        plan.blocks[rank].len(),
        plan.total
    );

    let mut saver = Saver::new(
        job.checkpoints.clone(),
        rank,
        world,
        t.keep_checkpoints,
        t.async_checkpoints,
        faults.clone(),
        emit.clone(),
    );
    let mut spike_fired = false;
    // A relaunch after the last step's checkpoint (a rank that died at teardown) runs no
    // step: the phase is done at the checkpoint it resumed from, with that step's loss.
    let mut last_loss = state.loss_history.last().copied();
    let mut saved_step = (state.step > 0).then_some(state.step);
    while state.step < total_steps {
        // Batches skipped after a loss spike are passed over; the phase ends early if that
        // leaves too few samples for a whole batch.
        while state
            .skipped_batches
            .binary_search(&state.cursor.sample)
            .is_ok()
        {
            state.cursor.sample += t.global_batch as u64;
        }
        if state.cursor.sample + t.global_batch as u64 > reader.num_samples() {
            tracing::warn!(
                "phase {}: out of samples after skipping {} batches; ending at step {}",
                job.phase,
                state.skipped_batches.len(),
                state.step
            );
            break;
        }
        let started = Instant::now();
        let batch_start = state.cursor.sample;
        let garbage = faults.at(Kind::Spike, state.step + 1) && !spike_fired;
        spike_fired |= garbage;
        let biases: Vec<Vec<f32>> = state.balance.iter().map(|b| b.biases.clone()).collect();
        let mut micro_batches = Vec::with_capacity(accumulation);
        for _ in 0..accumulation {
            let mut batch = reader.batch(&state.cursor, rank, world, t.micro_batch)?;
            if let Some(&id) = batch
                .tokens
                .iter()
                .find(|&&id| id as usize >= job.model.vocab_size)
            {
                // burn would panic indexing the embedding; no relaunch reads other data.
                return Err(crate::contract::exit::Fatal(format!(
                    "phase `{}`: the batch at sample {} holds token id {id}, beyond model.vocab_size {}",
                    job.phase, state.cursor.sample, job.model.vocab_size
                ))
                .into());
            }
            if garbage {
                // Fault injection: this batch is noise, as a corrupt shard would be.
                let mut rng = crate::rng::SplitMix64(batch_start ^ 0xbad);
                batch
                    .tokens
                    .iter_mut()
                    .for_each(|x| *x = rng.below(job.model.vocab_size as u64) as u32);
            }
            micro_batches.push(batch_tensors::<B>(
                &batch.tokens,
                t.micro_batch,
                seq_len,
                device,
            ));
            state.cursor = state.cursor.advance(world, t.micro_batch);
        }
        let lr = t.schedule.lr(state.step, total_steps);
        let (m, out) = train_step(
            model,
            &mut optim,
            micro_batches,
            &biases,
            lr,
            t.grad_clip,
            group,
            Some(&plan),
        )?;
        model = m;
        let (grad_norm, counts) = (out.grad_norm, out.counts);
        let delay = faults.delay_ms(state.step + 1);
        if delay > 0 {
            std::thread::sleep(std::time::Duration::from_millis(delay));
        }

        // The loss-spike guard. Every rank sees the same (all-reduced) loss, so all roll back
        // together.
        if let Some(z) = t.spike.check(&state.loss_history, out.loss) {
            if state.rollbacks < t.spike.max_rollbacks {
                saver.wait()?;
                group.barrier()?;
                let mut skipped = state.skipped_batches.clone();
                skipped.push(batch_start);
                skipped.sort_unstable();
                skipped.dedup();
                let rollbacks = state.rollbacks + 1;
                let spiked_step = state.step + 1;
                (model, optim, state) =
                    start::<B>(job, total_steps, &reader, &layout, rank, device)?;
                state.skipped_batches = skipped;
                state.rollbacks = rollbacks;
                tracing::warn!(
                    "loss spike at step {spiked_step} (loss {:.4}, z {z:.1}): back to step {}, skipping samples {batch_start}..",
                    out.loss,
                    state.step
                );
                emit(WorkerMessage::LossSpike {
                    step: spiked_step,
                    loss: out.loss,
                    z,
                    rollback_to: state.step,
                    skipped_sample: batch_start,
                });
                continue;
            }
            tracing::warn!(
                "loss spike at step {} (z {z:.1}) but the phase already rolled back {} times; going on",
                state.step + 1,
                state.rollbacks
            );
        }
        ensure!(
            out.loss.is_finite(),
            "phase `{}`: the loss is {} at step {}",
            job.phase,
            out.loss,
            state.step + 1
        );
        t.spike.record(&mut state.loss_history, out.loss);

        let mut errors = 0.0;
        for (layer, c) in counts.iter().enumerate() {
            errors += balance::balance_error(c, &target);
            balance::update(&mut state.balance[layer], c, &target, &t.balance);
        }
        state.step += 1;
        let tokens = (t.global_batch * seq_len) as u64;
        state.tokens += tokens;
        last_loss = Some(out.loss);
        let mut load = vec![0u64; routes];
        for c in &counts {
            for (r, n) in c.iter().enumerate() {
                load[r] += n;
            }
        }
        emit(WorkerMessage::Step(StepMetrics {
            step: state.step,
            loss: out.loss,
            lr,
            grad_norm,
            tokens_per_s: tokens as f64 / started.elapsed().as_secs_f64(),
            tokens: state.tokens,
            expert_load: load,
            balance_error: errors / counts.len() as f64,
        }));

        let last = state.step == total_steps;
        if rank == 0 && ((t.eval_every > 0 && state.step % t.eval_every == 0) || last) {
            let losses = evaluate(
                &model.valid(),
                &heldout,
                seq_len,
                t.eval_tokens,
                t.micro_batch,
                &biases,
            )?;
            emit(WorkerMessage::Eval {
                step: state.step,
                losses,
            });
        }
        if (t.checkpoint_every > 0 && state.step % t.checkpoint_every == 0) || last {
            saver.save(
                snapshot(&model_config, &layout, rank, &model, &optim, &state)?,
                last,
            )?;
            saved_step = Some(state.step);
        }
        if faults.at(Kind::Crash, state.step) {
            faults::abort(&format!("aborting after step {}", state.step));
        }
        if faults.at(Kind::Hang, state.step) {
            faults::hang(&format!("hanging after step {}", state.step));
        }
    }
    if saved_step != Some(state.step) {
        // The phase ended early (skipped batches): its last state still becomes a checkpoint.
        saver.save(
            snapshot(&model_config, &layout, rank, &model, &optim, &state)?,
            true,
        )?;
    }
    saver.wait()?;
    emit(WorkerMessage::Done {
        step: state.step,
        loss: last_loss,
    });
    Ok(())
}

/// The state training starts (or restarts after a spike) from: this phase's newest checkpoint
/// that verifies, else the previous phase's final one, else a fresh model.
fn start<B: AutodiffBackend>(
    job: &TrainJob,
    total_steps: u64,
    reader: &MixtureReader,
    layout: &zero::Layout,
    rank: usize,
    device: &B::Device,
) -> Result<(Zaya<B>, Optimizers<B>, TrainerState)> {
    let t = &job.train;
    let model_config = job.phase_model();
    let mut model: Zaya<B> = Zaya::new(&model_config, t.seed, device);
    let routes = model.routes();
    let mut optim = Optimizers::new(t, &model);
    let balance = (0..job.model.num_blocks)
        .map(|_| BalanceState::new(routes, job.model.mod_skip))
        .collect();
    let mut state = TrainerState::new(
        &job.phase,
        total_steps,
        reader.start(&job.phase),
        balance,
        t.seed,
    );
    if let Some((dir, files)) = checkpoint::latest(&job.checkpoints) {
        let (m, o, st) = restore(model, optim, &dir, &files, device, Some((layout, rank)))?;
        (model, optim) = (m, o);
        ensure!(
            st.phase == job.phase,
            "{}: a checkpoint of phase `{}` in phase `{}`'s directory",
            dir.display(),
            st.phase,
            job.phase
        );
        state = st;
        tracing::info!(
            "resuming phase {} at step {} from {}",
            job.phase,
            state.step,
            dir.display()
        );
    } else if let Some(init) = &job.init {
        let files = checkpoint::read_verified(init)
            .with_context(|| format!("the previous phase's checkpoint {}", init.display()))?;
        let (m, o, prev) = restore(
            model,
            optim,
            init,
            &files,
            device,
            t.carry_optimizer.then_some((layout, rank)),
        )?;
        (model, optim) = (m, o);
        // The routing biases are part of the model; the phase's data and step restart.
        state.balance = prev.balance;
        tracing::info!(
            "phase {} starts from {} (optimizer state {})",
            job.phase,
            init.display(),
            if t.carry_optimizer {
                "carried"
            } else {
                "reset"
            }
        );
    }
    Ok((model, optim, state))
}

/// Every parameter as (name, id, elements), in visiting order: what [`zero::Layout`] shards.
pub fn param_list<B: Backend>(model: &Zaya<B>) -> Vec<(String, u64, usize)> {
    let sizes: Vec<usize> = checkpoint::weights(model)
        .iter()
        .map(|(_, shape, _)| shape.iter().product())
        .collect();
    checkpoint::param_names::<B, _>(model)
        .into_iter()
        .zip(sizes)
        .map(|((name, id), n)| (name, id.val(), n))
        .collect()
}

/// Muon for the 2-D weight matrices, AdamW for everything else, sharing one learning rate
/// (Muon's is matched to AdamW's update RMS).
pub struct Optimizers<B: AutodiffBackend> {
    muon: MuonOpt<B>,
    adamw: AdamOpt<B>,
    /// The parameters Muon trains.
    pub muon_ids: BTreeSet<ParamId>,
    /// Muon's momentum (to read the torch engine's momentum buffers as burn's velocities).
    muon_momentum: f64,
}

impl<B: AutodiffBackend> Optimizers<B> {
    /// Fresh optimizers for `model` with `t`'s settings.
    pub fn new(t: &TrainSettings, model: &Zaya<B>) -> Self {
        let muon = MuonConfig::new()
            .with_adjust_lr_fn(AdjustLrFn::MatchRmsAdamW)
            .with_momentum(MomentumConfig {
                momentum: t.muon.momentum,
                dampening: 0.0,
                nesterov: t.muon.nesterov,
            })
            .with_ns_steps(t.muon.ns_steps)
            .with_weight_decay(
                (t.muon.weight_decay > 0.0)
                    .then(|| WeightDecayConfig::new(t.muon.weight_decay as f32)),
            )
            .init();
        let adamw = AdamWConfig::new()
            .with_beta_1(t.adamw.beta1 as f32)
            .with_beta_2(t.adamw.beta2 as f32)
            .with_epsilon(t.adamw.eps as f32)
            .with_weight_decay(t.adamw.weight_decay as f32)
            .init();
        Optimizers {
            muon,
            adamw,
            muon_ids: matrix_ids(model),
            muon_momentum: t.muon.momentum,
        }
    }
}

/// What one optimizer step measured.
pub struct StepOutput {
    /// Mean loss over the micro-batches.
    pub loss: f64,
    /// Global gradient norm before clipping.
    pub grad_norm: f64,
    /// Tokens per route per MoE layer.
    pub counts: Vec<Vec<u64>>,
}

/// One optimizer step: forward/backward over every micro-batch (gradients averaged, over the
/// micro-batches and then over the ranks of `group`), global norm clipping (`clip` > 0), then
/// Muon and AdamW updates at `lr` of the parameters this rank `owned` (ZeRO-1), and the
/// all-gather of everyone's updates.
#[allow(clippy::too_many_arguments)]
pub fn train_step<B: AutodiffBackend>(
    mut model: Zaya<B>,
    optim: &mut Optimizers<B>,
    micro_batches: Vec<(Tensor<B, 2, Int>, Tensor<B, 2, Int>)>,
    biases: &[Vec<f32>],
    lr: f64,
    clip: f64,
    group: &mut Group,
    plan: Option<&Plan>,
) -> Result<(Zaya<B>, StepOutput)> {
    let n = micro_batches.len();
    let mut accumulator = GradientsAccumulator::<Zaya<B>>::new();
    let mut loss_sum = 0.0;
    let mut counts = vec![vec![0u64; model.routes()]; model.blocks.len()];
    for (inputs, targets) in micro_batches {
        let (loss, routing) = model.loss(inputs, targets, biases);
        loss_sum += scalar(loss.clone());
        let grads = loss.div_scalar(n as f64).backward();
        accumulator.accumulate::<B>(&model, GradientsParams::from_grads(grads, &model));
        for (layer, c) in routing.counts.iter().enumerate() {
            for (r, k) in c.iter().enumerate() {
                counts[layer][r] += k;
            }
        }
    }
    let mut grads = accumulator.grads();
    let mut loss = loss_sum / n as f64;
    let grad_norm = match plan {
        Some(plan) if group.world > 1 => {
            let (g, sums, norm) = data_parallel::exchange_gradients(
                group,
                plan,
                &model,
                grads,
                StepSums { loss, counts },
            )?;
            (grads, loss, counts) = (g, sums.loss, sums.counts);
            norm
        }
        _ => global_norm::<B>(&model, &grads),
    };
    if clip > 0.0 && grad_norm > clip {
        scale_grads::<B>(&model, &mut grads, clip / (grad_norm + 1e-6));
    }
    let muon_grads = split_grads::<B>(&model, &mut grads, &optim.muon_ids);
    model = optim.muon.step(lr, model, muon_grads);
    model = optim.adamw.step(lr, model, grads);
    if let Some(plan) = plan.filter(|_| group.world > 1) {
        model = data_parallel::all_gather_parameters(group, plan, model)?;
    }
    Ok((
        model,
        StepOutput {
            loss,
            grad_norm,
            counts,
        },
    ))
}

/// `[micro_batch, seq_len + 1]` token rows -> (inputs, targets) `[micro_batch, seq_len]`.
pub fn batch_tensors<B: Backend>(
    rows: &[u32],
    micro_batch: usize,
    seq_len: usize,
    device: &B::Device,
) -> (Tensor<B, 2, Int>, Tensor<B, 2, Int>) {
    let mut inputs = Vec::with_capacity(micro_batch * seq_len);
    let mut targets = Vec::with_capacity(micro_batch * seq_len);
    for row in rows.chunks_exact(seq_len + 1) {
        inputs.extend(row[..seq_len].iter().map(|&t| t as i64));
        targets.extend(row[1..].iter().map(|&t| t as i64));
    }
    let make = |v: Vec<i64>| {
        Tensor::<B, 2, Int>::from_data(TensorData::new(v, [micro_batch, seq_len]), device)
    };
    (make(inputs), make(targets))
}

fn scalar<B: Backend>(t: Tensor<B, 1>) -> f64 {
    t.into_data()
        .convert::<f64>()
        .into_vec::<f64>()
        .expect("scalar")[0]
}

/// The ids of the parameters Muon trains: every 2-D weight matrix except the (tied) embedding.
fn matrix_ids<B: AutodiffBackend>(model: &Zaya<B>) -> BTreeSet<ParamId> {
    struct Matrices {
        embedding: ParamId,
        out: BTreeSet<ParamId>,
    }
    impl<B: Backend> ModuleVisitor<B> for Matrices {
        fn visit_float<const D: usize>(&mut self, p: &Param<Tensor<B, D>>) {
            if D == 2 && p.id != self.embedding {
                self.out.insert(p.id);
            }
        }
    }
    let mut v = Matrices {
        embedding: model.embed_tokens.id,
        out: BTreeSet::new(),
    };
    model.visit(&mut v);
    v.out
}

/// The L2 norm of all gradients together.
fn global_norm<B: AutodiffBackend>(model: &Zaya<B>, grads: &GradientsParams) -> f64 {
    struct NormSq<'a> {
        grads: &'a GradientsParams,
        total: f64,
    }
    impl<B: AutodiffBackend> ModuleVisitor<B> for NormSq<'_> {
        fn visit_float<const D: usize>(&mut self, p: &Param<Tensor<B, D>>) {
            if let Some(g) = self.grads.get::<B::InnerBackend, D>(p.id) {
                self.total += scalar(g.powf_scalar(2.0).sum());
            }
        }
    }
    let mut v = NormSq { grads, total: 0.0 };
    model.visit(&mut v);
    v.total.sqrt()
}

/// Multiplies every gradient by `factor`.
fn scale_grads<B: AutodiffBackend>(model: &Zaya<B>, grads: &mut GradientsParams, factor: f64) {
    struct Scale<'a> {
        grads: &'a mut GradientsParams,
        factor: f64,
    }
    impl<B: AutodiffBackend> ModuleVisitor<B> for Scale<'_> {
        fn visit_float<const D: usize>(&mut self, p: &Param<Tensor<B, D>>) {
            if let Some(g) = self.grads.remove::<B::InnerBackend, D>(p.id) {
                self.grads
                    .register::<B::InnerBackend, D>(p.id, g.mul_scalar(self.factor));
            }
        }
    }
    model.visit(&mut Scale { grads, factor });
}

/// Moves the gradients of `ids` out of `grads` into a new set.
fn split_grads<B: AutodiffBackend>(
    model: &Zaya<B>,
    grads: &mut GradientsParams,
    ids: &BTreeSet<ParamId>,
) -> GradientsParams {
    struct Split<'a> {
        from: &'a mut GradientsParams,
        to: GradientsParams,
        ids: &'a BTreeSet<ParamId>,
    }
    impl<B: AutodiffBackend> ModuleVisitor<B> for Split<'_> {
        fn visit_float<const D: usize>(&mut self, p: &Param<Tensor<B, D>>) {
            if self.ids.contains(&p.id)
                && let Some(g) = self.from.remove::<B::InnerBackend, D>(p.id)
            {
                self.to.register::<B::InnerBackend, D>(p.id, g);
            }
        }
    }
    let mut v = Split {
        from: grads,
        to: GradientsParams::new(),
        ids,
    };
    model.visit(&mut v);
    v.to
}
