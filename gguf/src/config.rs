//! Architecture hyperparameters from GGUF metadata (llama.cpp's key names).

use anyhow::{Context, Result, bail};
use candle_core::quantized::gguf_file::{Content, Value};

/// The architectures the adapter runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arch {
    /// Gemma 3 (text): q/k norms, post-norms, GELU-tanh MLP, scaled embeddings, local layers.
    Gemma3,
    /// Llama family (Llama 2/3, SmolLM2, ...): pre-norm, SwiGLU, interleaved rotary.
    Llama,
}

/// What the forward pass needs to know.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// The architecture.
    pub arch: Arch,
    /// Transformer blocks.
    pub n_layer: usize,
    /// Model width.
    pub n_embd: usize,
    /// Query heads.
    pub n_head: usize,
    /// Key/value heads (grouped-query attention).
    pub n_kv_head: usize,
    /// Width of one head.
    pub head_dim: usize,
    /// RMSNorm epsilon.
    pub eps: f64,
    /// Rotary base of global layers.
    pub rope_base: f32,
    /// Rotary base of local (sliding-window) layers.
    pub rope_base_local: f32,
    /// Sliding window of local layers (Gemma 3).
    pub sliding_window: Option<usize>,
    /// Every `swa_pattern`-th layer is global, the others local (Gemma 3: 6).
    pub swa_pattern: usize,
    /// Training context length.
    pub context_length: usize,
}

impl Config {
    /// Whether layer `i` uses the sliding window (llama.cpp: `il % pattern < pattern - 1`).
    pub fn is_local(&self, i: usize) -> bool {
        self.sliding_window.is_some() && i % self.swa_pattern < self.swa_pattern - 1
    }

    /// Reads the hyperparameters of `content`.
    pub fn from_gguf(content: &Content) -> Result<Self> {
        let md = &content.metadata;
        let arch_name = md
            .get("general.architecture")
            .context("no general.architecture")?
            .to_string()?
            .clone();
        let arch = match arch_name.as_str() {
            "gemma3" => Arch::Gemma3,
            "llama" => Arch::Llama,
            other => bail!("GGUF architecture `{other}` is not supported (gemma3, llama)"),
        };
        let get = |k: &str| -> Result<&Value> {
            md.get(&format!("{arch_name}.{k}"))
                .with_context(|| format!("no {arch_name}.{k} in the GGUF metadata"))
        };
        let u = |k: &str| -> Result<usize> { Ok(get(k)?.to_u32()? as usize) };
        let f = |k: &str| -> Result<f32> { Ok(get(k)?.to_f32()?) };
        let n_embd = u("embedding_length")?;
        let n_head = u("attention.head_count")?;
        let head_dim = u("attention.key_length").unwrap_or(n_embd / n_head);
        let (rope_base, rope_base_local, sliding_window, swa_pattern) = match arch {
            Arch::Gemma3 => (
                f("rope.freq_base").unwrap_or(1_000_000.0),
                // llama.cpp's default for Gemma 3's local layers.
                f("rope.local_freq_base").unwrap_or(10_000.0),
                Some(u("attention.sliding_window")?),
                u("attention.sliding_window_pattern").unwrap_or(6),
            ),
            Arch::Llama => {
                let base = f("rope.freq_base").unwrap_or(10_000.0);
                (base, base, None, 1)
            }
        };
        Ok(Config {
            arch,
            n_layer: u("block_count")?,
            n_embd,
            n_head,
            n_kv_head: u("attention.head_count_kv").unwrap_or(n_head),
            head_dim,
            eps: f("attention.layer_norm_rms_epsilon")? as f64,
            rope_base,
            rope_base_local,
            sliding_window,
            swa_pattern,
            context_length: u("context_length")?,
        })
    }
}
