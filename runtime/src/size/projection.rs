//! Cost projection: how long a step, a phase and the whole run take on a given cluster, from a
//! roofline of the step's three costs per GPU:
//!
//! - compute: the step's model FLOPs ([`ModelConfig::flops`]) / GPUs / (bf16 peak x the
//!   fraction of peak large GEMMs reach);
//! - memory traffic: weights read three times per micro-batch pass (forward, backward for
//!   inputs, backward for weights), gradients written, and the ZeRO-1 optimizer shard read and
//!   written once, over HBM bandwidth (activations are left out: with fused kernels they mostly
//!   stay in cache, and counting them would double-count the GEMMs' own traffic);
//! - communication: ZeRO-1's reduce-scatter of the gradients plus all-gather of the parameters,
//!   (n-1)/n of (gradient + parameter bytes) through each GPU's link (nccl-tests' bus
//!   bandwidth, so a measured `busbw` plugs straight in).
//!
//! Step time = max(compute, memory) + (1 - overlap) x communication.

use serde::Serialize;

use crate::model::config::ModelConfig;

/// A device and its link, from datasheets or from measurements.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Hardware {
    /// Name.
    pub name: String,
    /// Dense bf16 matrix throughput, TFLOP/s.
    pub bf16_tflops: f64,
    /// Memory bandwidth, GB/s.
    pub hbm_gbps: f64,
    /// Bus bandwidth per GPU for collectives across nodes, GB/s.
    pub link_gbps: f64,
    /// Memory one rank may use, bytes (the GPU's HBM; a CPU's RAM).
    pub memory_bytes: u64,
    /// Where the numbers come from.
    pub source: String,
}

impl Hardware {
    /// AMD Instinct MI300X: 1307.4 TFLOP/s dense bf16, 5.3 TB/s and 192 GB of HBM3 (AMD
    /// datasheet); one
    /// 400 Gb/s Pollara NIC per GPU, as in ZAYA1's cluster (report: 8 NICs per node) = 50 GB/s.
    pub fn mi300x() -> Hardware {
        Hardware {
            name: "MI300X".into(),
            bf16_tflops: 1307.4,
            hbm_gbps: 5300.0,
            link_gbps: 50.0,
            memory_bytes: 192_000_000_000,
            source: "AMD MI300X datasheet (192 GB HBM3); 400 Gb/s NIC per GPU".into(),
        }
    }

    /// NVIDIA H200 SXM: 989.4 TFLOP/s dense bf16, 4.8 TB/s and 141 GB of HBM3e (NVIDIA
    /// datasheet); one
    /// 400 Gb/s NDR InfiniBand NIC per GPU = 50 GB/s.
    pub fn h200() -> Hardware {
        Hardware {
            name: "H200".into(),
            bf16_tflops: 989.4,
            hbm_gbps: 4800.0,
            link_gbps: 50.0,
            memory_bytes: 141_000_000_000,
            source: "NVIDIA H200 SXM datasheet (141 GB HBM3e); 400 Gb/s NIC per GPU".into(),
        }
    }

    /// A named profile (`mi300x`, `h200`).
    pub fn named(name: &str) -> Option<Hardware> {
        match name.to_ascii_lowercase().as_str() {
            "mi300x" => Some(Hardware::mi300x()),
            "h200" => Some(Hardware::h200()),
            _ => None,
        }
    }
}

/// What the projection assumes beyond the hardware.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Assumptions {
    /// Fraction of the bf16 peak the model's GEMMs reach (large, aligned GEMMs: ~0.5-0.7).
    pub gemm_efficiency: f64,
    /// Bytes per parameter of the weights used in the GEMMs and all-gathered (bf16: 2).
    pub param_bytes: f64,
    /// Bytes per gradient element reduce-scattered (bf16: 2).
    pub grad_bytes: f64,
    /// Bytes per parameter of optimizer state (fp32 master + Muon/AdamW moments: ~12).
    pub optimizer_bytes: f64,
    /// Fraction of the communication hidden behind compute (0 = none).
    pub overlap: f64,
}

impl Default for Assumptions {
    fn default() -> Self {
        Assumptions {
            gemm_efficiency: 0.5,
            param_bytes: 2.0,
            grad_bytes: 2.0,
            optimizer_bytes: 12.0,
            overlap: 0.0,
        }
    }
}

/// One optimizer step, projected.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct StepProjection {
    /// Tokens per step (global batch x sequence length).
    pub tokens: f64,
    /// Compute time (s).
    pub compute_s: f64,
    /// HBM traffic time (s).
    pub memory_s: f64,
    /// Gradient/parameter exchange time (s).
    pub comm_s: f64,
    /// The step (s).
    pub step_s: f64,
    /// Tokens per second over the cluster.
    pub tokens_per_s: f64,
    /// Model FLOPs utilisation: achieved model FLOP/s / (GPUs x peak).
    pub mfu: f64,
}

/// Projects one step of `global_batch` sequences of `seq_len` tokens, `micro_batch` sequences
/// per GPU per pass, on `gpus` GPUs of `hw`.
pub fn step(
    model: &ModelConfig,
    seq_len: usize,
    global_batch: usize,
    micro_batch: usize,
    gpus: usize,
    hw: &Hardware,
    a: &Assumptions,
) -> StepProjection {
    let gpus = gpus.max(1) as f64;
    let tokens = (global_batch * seq_len) as f64;
    let flops = model.flops(seq_len).total as f64 * tokens;
    let compute_s = flops / gpus / (hw.bf16_tflops * 1e12 * a.gemm_efficiency);
    let params = model.params().total_with_embeddings as f64;
    let passes = (global_batch as f64 / (gpus * micro_batch.max(1) as f64))
        .ceil()
        .max(1.0);
    let traffic = passes * 3.0 * params * a.param_bytes
        + params * a.grad_bytes
        + 2.0 * params * a.optimizer_bytes / gpus;
    let memory_s = traffic / (hw.hbm_gbps * 1e9);
    let comm_s =
        (gpus - 1.0) / gpus * params * (a.grad_bytes + a.param_bytes) / (hw.link_gbps * 1e9);
    let step_s = compute_s.max(memory_s) + (1.0 - a.overlap) * comm_s;
    StepProjection {
        tokens,
        compute_s,
        memory_s,
        comm_s,
        step_s,
        tokens_per_s: tokens / step_s,
        mfu: flops / step_s / (gpus * hw.bf16_tflops * 1e12),
    }
}

/// A phase of `tokens` tokens at `step`'s pace on `gpus` GPUs: (steps, hours, GPU-hours, days).
pub fn phase(step: &StepProjection, tokens: f64, gpus: usize) -> (f64, f64, f64, f64) {
    let steps = (tokens / step.tokens).ceil();
    let hours = steps * step.step_s / 3600.0;
    (steps, hours, hours * gpus as f64, hours / 24.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_roofline_arithmetic_by_hand() {
        // A made-up device: 100 TFLOP/s, 1000 GB/s HBM, 10 GB/s link; GEMMs at 50%.
        let hw = Hardware {
            name: "toy".into(),
            bf16_tflops: 100.0,
            hbm_gbps: 1000.0,
            link_gbps: 10.0,
            memory_bytes: 80_000_000_000,
            source: "test".into(),
        };
        let a = Assumptions::default();
        let m = ModelConfig::zaya1_base();
        let s = step(&m, 4096, 64, 1, 8, &hw, &a);
        let flops = m.flops(4096).total as f64 * 64.0 * 4096.0;
        let p = m.params().total_with_embeddings as f64;
        // compute: flops / 8 GPUs / 50 TFLOP/s.
        assert!((s.compute_s - flops / 8.0 / 50e12).abs() < 1e-9 * s.compute_s);
        // memory: 8 passes x 3 reads x 2 B + 2 B of gradients + 2 x 12 B / 8 of optimizer shard.
        assert!(
            (s.memory_s - (8.0 * 3.0 * 2.0 + 2.0 + 24.0 / 8.0) * p / 1e12).abs()
                < 1e-9 * s.memory_s
        );
        // communication: 7/8 x (2 + 2) B per parameter at 10 GB/s.
        assert!((s.comm_s - 7.0 / 8.0 * 4.0 * p / 10e9).abs() < 1e-9 * s.comm_s);
        assert!((s.step_s - (s.compute_s.max(s.memory_s) + s.comm_s)).abs() < 1e-12);
        assert!((s.mfu - flops / s.step_s / (8.0 * 100e12)).abs() < 1e-12);
        let (steps, hours, gpu_hours, days) = phase(&s, 64.0 * 4096.0 * 10.5, 8);
        assert_eq!(steps, 11.0);
        assert!(
            (hours - 11.0 * s.step_s / 3600.0).abs() < 1e-12
                && (gpu_hours - 8.0 * hours).abs() < 1e-9
                && (days - hours / 24.0).abs() < 1e-12
        );
        // Full overlap hides the exchange.
        let hidden = step(&m, 4096, 64, 1, 8, &hw, &Assumptions { overlap: 1.0, ..a });
        assert_eq!(hidden.step_s, s.compute_s.max(s.memory_s));
        assert!(Hardware::named("MI300X").is_some() && Hardware::named("tpu").is_none());
    }
}
