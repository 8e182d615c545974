//! The torch engine's memory per rank, term by term, as `workers/torch/zflow_torch` allocates
//! it: what `zflow size` prints for each phase, and what `zflow plan --hardware` checks.
//!
//! What the engine holds (`trainer.py`, `optim.py`, `loss.py`, `activation_checkpointing.py`):
//!
//! - **master weights**: every parameter in f32, on every rank (ZeRO-1 shards only the optimizer
//!   state);
//! - **bf16 weights**: on a GPU, autocast's cache of the bf16 copy of every weight a matrix
//!   multiply reads (the linear weights and the tied embedding), alive for the forward and
//!   backward pass; none on a CPU, where the engine runs f32;
//! - **gradients**: f32, every parameter. With one micro-batch per step they grow while the
//!   activations shrink during the backward pass (only the tied embedding's, made first by the
//!   loss, is counted at the activations' peak); with gradient accumulation they are whole from
//!   the second micro-batch on;
//!   DistributedDataParallel all-reduces them in place: they are views into its buckets, which
//!   it allocates during the backward pass and which `zero_grad` frees (no second copy);
//! - **optimizer shard**: the state of the parameters this rank owns (ZeRO-1,
//!   [`crate::checkpoint::layout::Layout`] over all ranks): one f32 Muon momentum per matrix
//!   element, two f32 AdamW moments per other element; the figures are the most loaded rank's;
//! - **optimizer step**: the step's temporaries: Muon's, for one same-shaped group at a time
//!   (the largest), its Nesterov updates, their `ns_dtype` stack, Newton-Schulz's products and
//!   iterates and the result's f32 copy; AdamW's denominators (one tensor at a time on a CPU,
//!   every owned tensor at once with the foreach kernels of a GPU);
//! - **activations**: what autograd keeps for one micro-batch of `micro_batch x seq_len /
//!   context_parallel` tokens, per block and per checkpointing mode ([`block_elements`]);
//! - **recomputed block**: under checkpointing, the one block the backward pass runs again
//!   (what it did not keep, its gradients' temporaries: three `h`-wide tensors per token, and
//!   its parameters' gradients);
//! - **logits and loss**: one chunk of `loss_chunk_tokens` positions' f32 logits, their
//!   log-softmax and its gradient (`loss.py`; plus the bf16 logits on a GPU);
//! - **communication**: bf16 gradient reduction's buffers (`train.grad_reduce_dtype: bf16`),
//!   ZeRO-1's all-gather, which broadcasts each owner's updated tensors as one flat buffer, and,
//!   with context parallelism, one layer's gathered keys and values and its attention mask in
//!   global positions (counted with the activations: every block keeps its own without
//!   checkpointing).
//!
//! The peak is the larger of the forward/backward peak and the optimizer step's. Both hold the
//! weights and the optimizer state; the first adds the embedding's gradient (all the
//! gradients with accumulation), the blocks' kept activations and the larger of the forward
//! pass's end (the head's activations and a loss chunk) and the recomputed block; the second
//! adds all the gradients and the step's temporaries.
//!
//! The activation counts were read off autograd's saved tensors (per block, without
//! checkpointing, `12 h + 4 F + 6 q + 6 kv + 7 r + routes` elements per token, at f32 on a
//! CPU), and the
//! whole model is checked against the engine's measured peak on this machine's CPU
//! (`tests/memory.rs`). On a GPU the activations are counted at 4 bytes, an upper bound:
//! autocast keeps the matrix multiplies' inputs in bf16.

use serde::Serialize;

use crate::checkpoint::layout::Layout;
use crate::contract::settings::{ActivationCheckpointing, Dtype};
use crate::model::config::ModelConfig;
use crate::model::tensors;

/// Where the ranks run: it decides autocast (bf16 copies on a GPU) and the optimizer kernels.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Device {
    /// f32 throughout, one optimizer tensor at a time.
    Cpu,
    /// bf16 autocast, foreach optimizer kernels (CUDA or ROCm).
    Gpu,
}

impl Device {
    /// The device of a `train.backend` (`cpu`, `cuda`, `rocm`).
    pub fn of_backend(backend: &str) -> Device {
        if backend == "cpu" {
            Device::Cpu
        } else {
            Device::Gpu
        }
    }
}

/// How a phase runs, as far as one rank's memory is concerned.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RankSetup {
    /// Tokens per sequence.
    pub seq_len: usize,
    /// Sequences per forward/backward on one data-parallel group.
    pub micro_batch: usize,
    /// Sequences per optimizer step over all ranks.
    pub global_batch: usize,
    /// Data-parallel groups.
    pub data_parallel: usize,
    /// Ranks each sequence is split over; `data_parallel x context_parallel` ranks in all.
    pub context_parallel: usize,
    /// What each block keeps for the backward pass.
    pub activation_checkpointing: ActivationCheckpointing,
    /// Positions whose logits exist at once.
    pub loss_chunk_tokens: usize,
    /// The number format of Muon's Newton-Schulz iterations.
    pub ns_dtype: Dtype,
    /// The number format gradients cross the network in.
    pub grad_reduce_dtype: Dtype,
    /// Gradient bytes per DistributedDataParallel bucket (`train.grad_bucket_bytes`).
    pub grad_bucket_bytes: u64,
    /// CPU or GPU.
    pub device: Device,
}

impl RankSetup {
    /// Ranks in all.
    pub fn world(&self) -> usize {
        self.data_parallel.max(1) * self.context_parallel.max(1)
    }

    /// Tokens of one micro-batch on one rank.
    pub fn tokens_per_rank(&self) -> usize {
        self.micro_batch * self.seq_len / self.context_parallel.max(1)
    }

    /// Micro-batches per optimizer step (gradient accumulation).
    pub fn micro_batches(&self) -> usize {
        (self.global_batch / (self.data_parallel.max(1) * self.micro_batch.max(1))).max(1)
    }
}

/// One rank's memory in bytes, term by term (the module page says what each holds).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct EngineMemory {
    /// f32 parameters.
    pub master_weights: u64,
    /// Autocast's bf16 weight copies (GPU only).
    pub bf16_weights: u64,
    /// f32 gradients of every parameter (DistributedDataParallel's buckets, viewed).
    pub gradients: u64,
    /// The optimizer state this rank owns (the most loaded rank).
    pub optimizer_shard: u64,
    /// The optimizer step's temporaries.
    pub optimizer_step: u64,
    /// Activations of one micro-batch at the end of its forward pass: what the blocks keep
    /// and the head's.
    pub activations: u64,
    /// Under checkpointing, the block the backward pass runs again: what it did not keep, its
    /// gradients' temporaries and, with context parallelism, the keys and values it gathers.
    pub recomputed_block: u64,
    /// One loss chunk's logits, log-softmax and gradient.
    pub logits_and_loss: u64,
    /// ZeRO-1's all-gather buffer and context parallelism's gathered keys and values.
    pub communication: u64,
    /// The forward/backward peak.
    pub forward_backward_peak: u64,
    /// The optimizer step's peak.
    pub step_peak: u64,
    /// The larger of the two: what the rank needs.
    pub peak_bytes_per_rank: u64,
}

/// Activation elements per token that one block keeps, and that the head keeps, for a
/// checkpointing mode (f32 counts; see [`EngineMemory`] for the bytes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockElements {
    /// Everything autograd saves in one block without checkpointing.
    pub whole: u64,
    /// What a block keeps between its forward and its backward pass in the chosen mode.
    pub kept: u64,
    /// Outside the blocks: embedding output, final norm, RoPE tables.
    pub head: u64,
}

/// Activation elements per token, read off autograd's saved tensors of the engine's model
/// (`transformers`' ZayaDecoderLayer with zflow's RoutedMoe), every token routed to an expert
/// (the skip route keeps less; this is the bound):
///
/// - whole block: `12 h` (residual stream, norms, residual scaling, attention and expert
///   inputs and outputs) `+ 4 F` (gate and up, SwiGLU, product) `+ 6 q + 6 kv` (projections,
///   convolutions with their padding, QK norm, RoPE, attention output) `+ (1 + 2 L) r` (router
///   state and its MLP of L layers) `+ routes` (probabilities) `+ 4 (heads + kv heads)` (norm
///   statistics, attention's log-sum-exp);
/// - `full`: the block's inputs, the residual stream and the router state: `h + r`;
/// - `selective`: those, and the outputs of every matrix multiply and of attention: `q + 2 kv`
///   (projections) `+ q + heads` (attention and its log-sum-exp) `+ h` (output projection)
///   `+ r + (L - 1) r + routes` (router) `+ 2 F + h` (expert);
/// - head: `4 h` (embedding output, final residual and norm, the loss's input) `+ 2 rope dims`.
///
/// With context parallelism each block also keeps the keys and values gathered from the other
/// ranks (without checkpointing).
pub fn block_elements(m: &ModelConfig, mode: ActivationCheckpointing) -> BlockElements {
    let w = |x: usize| x as u64;
    let (h, f, q, kv, r) = (
        w(m.hidden_size),
        w(m.expert_ffn),
        w(m.q_latent()),
        w(m.kv_latent()),
        w(m.router_dim),
    );
    let (routes, layers) = (w(m.router_outputs()), w(m.router_mlp_layers));
    let heads = w(m.num_query_heads + m.num_kv_heads);
    let whole = 12 * h + 4 * f + 6 * q + 6 * kv + (1 + 2 * layers) * r + routes + 4 * heads;
    let inputs = h + r;
    let kept = match mode {
        ActivationCheckpointing::None => whole,
        ActivationCheckpointing::Full => inputs,
        ActivationCheckpointing::Selective => {
            inputs
                + (q + 2 * kv)
                + (q + w(m.num_query_heads))
                + h
                + layers * r
                + routes
                + (2 * f + h)
        }
    };
    BlockElements {
        whole,
        kept,
        head: 4 * h + 2 * w(m.rope_dims()),
    }
}

/// f32 bytes.
const F32: u64 = 4;

impl ModelConfig {
    /// One rank's memory on the torch engine for `setup` (the module page lists the terms).
    pub fn engine_memory(&self, setup: &RankSetup) -> EngineMemory {
        let all = tensors(self);
        let params: u64 = all.iter().map(|t| t.numel()).sum();
        let gpu = setup.device == Device::Gpu;
        let world = setup.world();

        // ZeRO-1's owners over every rank, as the trainer lays them out.
        let slots: Vec<(String, u64, usize)> = all
            .iter()
            .map(|t| (t.name.clone(), 0, t.numel() as usize))
            .collect();
        let layout = Layout::new(&slots, world).expect("world >= 1");
        let rank_bytes = |rank: usize| -> (u64, u64, u64) {
            let mut state = 0;
            let mut adamw_largest = 0;
            let mut adamw_owned = 0;
            let mut owned = 0;
            let mut groups: std::collections::BTreeMap<&[usize], u64> = Default::default();
            for (t, s) in all.iter().zip(&layout.params) {
                if s.owner != rank {
                    continue;
                }
                let n = t.numel();
                owned += n;
                if t.linear {
                    state += F32 * n;
                    *groups.entry(t.shape.as_slice()).or_default() += n;
                } else {
                    state += 2 * F32 * n;
                    adamw_owned += n;
                    adamw_largest = adamw_largest.max(n);
                }
            }
            // Muon runs one same-shaped group at a time (`optim.py`). The largest of three
            // moments of the largest group: its f32 Nesterov updates and their `ns_dtype`
            // stack; then that stack and Newton-Schulz's normalised input, Gram matrix,
            // polynomial of it and next iterate, in `ns_dtype`; then the stack, the last
            // iterate and its f32 copy (none in f32, where the iterate is already f32).
            let ns = setup.ns_dtype.bytes();
            let muon = groups
                .iter()
                .map(|(shape, &n)| {
                    let (a, b) = (shape[0] as u64, shape[1] as u64);
                    let square = n / (a * b) * a.min(b) * a.min(b);
                    let stacking = F32 * n + ns * n;
                    let iterating = ns * (3 * n + 2 * square);
                    let widening = match setup.ns_dtype {
                        Dtype::F32 => 0,
                        Dtype::Bf16 => 2 * ns * n + F32 * n,
                    };
                    stacking.max(iterating).max(widening)
                })
                .max()
                .unwrap_or(0);
            // AdamW's denominator and its intermediate (sqrt, then the division).
            let adamw = 2 * F32 * if gpu { adamw_owned } else { adamw_largest };
            (state, muon.max(adamw), F32 * owned)
        };
        // The most loaded rank: the largest state plus step temporaries.
        let ranks: Vec<(u64, u64, u64)> = (0..world).map(rank_bytes).collect();
        let (optimizer_shard, optimizer_step, _) = ranks
            .iter()
            .copied()
            .max_by_key(|(state, step, _)| state + step)
            .unwrap_or((0, 0, 0));
        let gather_buffer = ranks.iter().map(|r| r.2).max().unwrap_or(0);

        let master_weights = F32 * params;
        let bf16_weights = if gpu {
            2 * all
                .iter()
                .filter(|t| t.linear || t.part == crate::model::Part::Embedding)
                .map(|t| t.numel())
                .sum::<u64>()
        } else {
            0
        };
        let gradients = F32 * params;

        let tokens = setup.tokens_per_rank() as u64;
        let e = block_elements(self, setup.activation_checkpointing);
        let blocks = self.num_blocks as u64;
        let cp = setup.context_parallel.max(1) as u64;
        let h = self.hidden_size as u64;
        // With context parallelism a block attends to the sequence's keys and values, gathered
        // (`context_parallel.py`) and repeated for every query head (transformers' SDPA): every
        // block keeps them without checkpointing and with selective checkpointing (measured:
        // what the collective returns stays), the recomputed block with full checkpointing.
        // The mask in global positions, the chunk's queries by the sequence's keys, is made
        // once and shared by every block.
        let (gathered_kv, mask) = if cp > 1 {
            let (seq, mb) = (setup.seq_len as u64, setup.micro_batch as u64);
            let (q, kv) = (self.q_latent() as u64, self.kv_latent() as u64);
            let mask_bytes = if gpu { 2 } else { F32 };
            (F32 * 2 * (kv + q) * mb * seq, mask_bytes * seq / cp * seq)
        } else {
            (0, 0)
        };
        // A block's parameters: their gradients are made while that block runs again.
        let block_grads = F32
            * all
                .iter()
                .filter(|t| t.block == Some(self.num_blocks.saturating_sub(1)))
                .map(|t| t.numel())
                .sum::<u64>();
        let (kept_kv, recomputed) = match setup.activation_checkpointing {
            ActivationCheckpointing::None => (blocks * gathered_kv + mask, 0),
            // The block runs again whole, plus its backward pass's temporaries (gradients of
            // its input, output and residual: three `h`-wide tensors per token) and its
            // parameters' gradients (measured: the peak is in the last block's backward pass).
            ActivationCheckpointing::Full => (
                0,
                F32 * tokens * (e.whole + 3 * h) + gathered_kv + mask + block_grads,
            ),
            // Only what was not kept runs again.
            ActivationCheckpointing::Selective => (
                blocks * gathered_kv + mask,
                F32 * tokens * (e.whole - e.kept + 3 * h) + block_grads,
            ),
        };
        let kept = F32 * tokens * blocks * e.kept + kept_kv;
        let head = F32 * tokens * e.head;
        let chunk = setup.loss_chunk_tokens.min(setup.tokens_per_rank()).max(1) as u64;
        let logits_and_loss =
            chunk * self.vocab_size as u64 * if gpu { 2 + 3 * F32 } else { 3 * F32 };
        // bf16 gradient reduction (`reduce.py`) sends, receives and gathers back a bucket's
        // gradients in bf16 (three copies of a bucket of `grad_bucket_bytes` of f32), during
        // the backward pass: counted for one bucket in flight.
        let reduce_buffers = if world > 1 && setup.grad_reduce_dtype == Dtype::Bf16 {
            3 * Dtype::Bf16.bytes() * params.min(setup.grad_bucket_bytes / F32)
        } else {
            0
        };
        let communication = gather_buffer.max(gathered_kv).max(reduce_buffers);

        let embedding_grad = F32 * (self.vocab_size * self.hidden_size) as u64;
        let grads_during_pass = if setup.micro_batches() > 1 {
            gradients
        } else {
            embedding_grad
        };
        let persistent = master_weights + optimizer_shard;
        // The blocks' kept activations, and then the larger of the forward pass's end (the head's
        // activations and a loss chunk) and the backward pass's block run again.
        let forward_backward_peak = persistent
            + bf16_weights
            + grads_during_pass
            + kept
            + (head + logits_and_loss).max(recomputed)
            + reduce_buffers;
        let step_peak = persistent + gradients + optimizer_step.max(gather_buffer);
        EngineMemory {
            master_weights,
            bf16_weights,
            gradients,
            optimizer_shard,
            optimizer_step,
            activations: kept + head,
            recomputed_block: recomputed,
            logits_and_loss,
            communication,
            forward_backward_peak,
            step_peak,
            peak_bytes_per_rank: forward_backward_peak.max(step_peak),
        }
    }
}
