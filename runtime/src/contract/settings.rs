//! The training settings of a phase (the `train:` part of a `phases:` entry, over the recipe's
//! `train:` section): the `train` field of the train job, with every default in one place.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::contract::balance::BalanceConfig;
use crate::contract::schedule::WsdSchedule;
use crate::contract::spike::SpikeGuard;

/// Muon settings (ZAYA1's are not public).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct MuonSettings {
    /// Momentum.
    pub momentum: f64,
    /// Nesterov momentum.
    pub nesterov: bool,
    /// Newton-Schulz iterations.
    pub ns_steps: usize,
    /// Decoupled weight decay.
    pub weight_decay: f64,
    /// The number format of the Newton-Schulz iterations
    /// (`workers/torch/zflow_torch/optim.py`). bf16, as torch.optim.Muon runs them, is 2-3x
    /// faster than f32 on GPUs and on CPUs with bf16 matrix instructions, and ~50x slower on
    /// CPUs without them; gradient sums that round differently (one rank against two) then
    /// give updates that part after a few steps. In f32 the same run on one rank or on several
    /// agrees to float rounding, step after step (what tests of reshaping and context
    /// parallelism compare). A recipe that does not write it gets its backend's
    /// ([`default_ns_dtype`]).
    pub ns_dtype: Dtype,
}

impl Default for MuonSettings {
    fn default() -> Self {
        MuonSettings {
            momentum: 0.95,
            nesterov: true,
            ns_steps: 5,
            weight_decay: 0.1,
            ns_dtype: default_ns_dtype(DEFAULT_BACKEND),
        }
    }
}

/// The number format Muon's Newton-Schulz runs in on `backend` when the recipe does not say
/// (`muon.ns_dtype`): bf16 on GPUs, whose matrix units all run it faster than f32; f32 on the
/// CPU. Only CPUs with AMX or AVX512-BF16 multiply bf16 natively (2.3x f32's speed on one
/// such); the rest (AMD before Zen 4, Intel before Sapphire Rapids, most laptops) fall back to
/// a path ~50x slower than f32, which made a whole training step 11x slower. The choice
/// depends on the recipe alone, never on the machine that plans it, so a recipe has one
/// identity, and gives the same bytes, on every machine of its backend; the preflight
/// (`runtime/src/dist/preflight.rs`) warns where a recipe's own bf16 is slow.
pub fn default_ns_dtype(backend: &str) -> Dtype {
    if backend == "cpu" {
        Dtype::F32
    } else {
        Dtype::Bf16
    }
}

/// A floating-point number format a setting chooses: `bf16` or `f32`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Dtype {
    /// bfloat16: 8 exponent bits, 8 significant bits.
    Bf16,
    /// IEEE single precision.
    F32,
}

impl Dtype {
    /// Bytes per element.
    pub fn bytes(self) -> u64 {
        match self {
            Dtype::Bf16 => 2,
            Dtype::F32 => 4,
        }
    }
}

/// AdamW settings for the non-matrix parameters.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct AdamWSettings {
    /// First-moment decay.
    pub beta1: f64,
    /// Second-moment decay.
    pub beta2: f64,
    /// Denominator epsilon.
    pub eps: f64,
    /// Decoupled weight decay (norm gains and biases usually want none).
    pub weight_decay: f64,
}

impl Default for AdamWSettings {
    fn default() -> Self {
        AdamWSettings {
            beta1: 0.9,
            beta2: 0.95,
            eps: 1e-8,
            weight_decay: 0.0,
        }
    }
}

/// The training engine a phase runs when its recipe names none: PyTorch workers
/// (`stages/src/engine.rs` lists the engines).
pub const DEFAULT_ENGINE: &str = "torch";

/// Where a phase's workers run when its recipe names no `backend` (`contract/backend.rs`
/// lists them).
pub const DEFAULT_BACKEND: &str = "cpu";

/// A phase's training settings (the `train:` part of a `phases:` entry).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct TrainSettings {
    /// Sequences per optimizer step, over all ranks.
    pub global_batch: usize,
    /// Sequences per forward/backward on one rank (gradient accumulation makes up the rest).
    pub micro_batch: usize,
    /// Learning-rate schedule (Muon, with AdamW RMS matching, and AdamW share it).
    pub schedule: WsdSchedule,
    /// Muon settings.
    pub muon: MuonSettings,
    /// AdamW settings.
    pub adamw: AdamWSettings,
    /// The number format gradients cross the network in between data-parallel ranks
    /// (`workers/torch/zflow_torch/reduce.py`). `f32`: DistributedDataParallel's all-reduce.
    /// `bf16`: half the bytes; each rank sends the others their shares in bf16, sums its share
    /// of every rank's in f32 and sends the mean back in bf16, so the gradient is rounded to
    /// bf16 twice but never summed in bf16. Gradient accumulation over micro-batches stays f32.
    pub grad_reduce_dtype: Dtype,
    /// Gradient bytes (f32) per DistributedDataParallel bucket: each bucket is reduced as soon
    /// as its gradients are complete, overlapping the backward pass (torch's `bucket_cap_mb`;
    /// 25 MiB is its default). Larger buckets mean fewer collectives, larger bf16 reduction
    /// buffers (`zflow size` counts them) and, past 2 ranks, another summation order.
    pub grad_bucket_bytes: u64,
    /// Clip the global gradient norm to this (0 = off).
    pub grad_clip: f64,
    /// The router balancing controller.
    pub balance: BalanceConfig,
    /// RoPE base for this phase (`None` = the model's).
    pub rope_base: Option<f64>,
    /// Carry the optimizer state over from the previous phase (else it restarts).
    pub carry_optimizer: bool,
    /// Checkpoint every N steps (at least 1; the phase's end is always checkpointed).
    pub checkpoint_every: u64,
    /// Checkpoints kept (newest; at least 1); the phase's final one is always kept.
    pub keep_checkpoints: usize,
    /// Held-out loss every N steps (0 = only at the end).
    pub eval_every: u64,
    /// Held-out tokens scored per source.
    pub eval_tokens: usize,
    /// Seed of the weight initialisation.
    pub seed: u64,
    /// The training engine each rank runs (`stages/src/engine.rs`): [`DEFAULT_ENGINE`] unless
    /// the recipe names one.
    pub engine: String,
    /// Where workers run: cpu, cuda or rocm.
    pub backend: String,
    /// Write checkpoints in a background thread while training goes on.
    pub async_checkpoints: bool,
    /// The loss-spike guard.
    pub spike: SpikeGuard,
    /// Positions whose logits the loss makes at a time (`workers/torch/zflow_torch/loss.py`):
    /// the full-vocabulary logits of a long micro-batch never exist at once. A micro-batch of at
    /// most this many tokens is one chunk, and the loss is the plain cross-entropy's bit for bit.
    pub loss_chunk_tokens: usize,
}

/// What each decoder layer keeps for the backward pass (`train.activation_checkpointing`;
/// `workers/torch/zflow_torch/activation_checkpointing.py`). Every mode gives the same loss
/// and gradients, bit for bit on the CPU, so it is not part of a phase's identity.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ActivationCheckpointing {
    /// Every activation is kept.
    #[default]
    None,
    /// A layer keeps only its input and runs again in the backward pass.
    Full,
    /// A layer keeps the outputs of its matrix multiplies and attention, and makes the rest
    /// (norms, activations, convolutions, routing arithmetic) again in the backward pass.
    Selective,
}

impl Default for TrainSettings {
    fn default() -> Self {
        TrainSettings {
            global_batch: 16,
            micro_batch: 16,
            schedule: WsdSchedule::default(),
            muon: MuonSettings::default(),
            adamw: AdamWSettings::default(),
            grad_reduce_dtype: Dtype::F32,
            grad_bucket_bytes: 25 << 20,
            grad_clip: 1.0,
            balance: BalanceConfig::default(),
            rope_base: None,
            carry_optimizer: true,
            checkpoint_every: 50,
            keep_checkpoints: 2,
            eval_every: 50,
            eval_tokens: 16384,
            seed: 0,
            engine: DEFAULT_ENGINE.into(),
            backend: DEFAULT_BACKEND.into(),
            async_checkpoints: true,
            spike: SpikeGuard::default(),
            loss_chunk_tokens: 4096,
        }
    }
}

impl TrainSettings {
    /// Writes into `written`, a phase's settings as a recipe writes them (before they are
    /// parsed), the defaults that follow another setting: `muon.ns_dtype`, when absent, is
    /// `backend`'s ([`default_ns_dtype`]). What is not a mapping is left for the parser to
    /// name.
    pub fn fill_backend_defaults(written: &mut serde_json::Value) {
        let Some(settings) = written.as_object_mut() else {
            return;
        };
        let backend = settings
            .get("backend")
            .and_then(|b| b.as_str())
            .unwrap_or(DEFAULT_BACKEND);
        let dtype = serde_json::to_value(default_ns_dtype(backend)).expect("a unit variant");
        let muon = settings
            .entry("muon")
            .or_insert_with(|| serde_json::Value::Object(Default::default()));
        if let Some(muon) = muon.as_object_mut() {
            muon.entry("ns_dtype").or_insert(dtype);
        }
    }

    /// Checks the settings, naming the bad field.
    pub fn validate(&self) -> Result<(), String> {
        if self.global_batch == 0 || self.micro_batch == 0 {
            return Err("`global_batch` and `micro_batch` must be at least 1".into());
        }
        if self.loss_chunk_tokens == 0 {
            return Err("`loss_chunk_tokens` must be at least 1".into());
        }
        if self.grad_bucket_bytes < 1 << 20 {
            return Err(format!(
                "`grad_bucket_bytes` ({}) must be at least 1 MiB ({})",
                self.grad_bucket_bytes,
                1 << 20
            ));
        }
        if !self.global_batch.is_multiple_of(self.micro_batch) {
            return Err(format!(
                "`global_batch` ({}) must be a multiple of `micro_batch` ({})",
                self.global_batch, self.micro_batch
            ));
        }
        self.schedule
            .validate()
            .map_err(|e| format!("schedule: {e}"))
    }
}
