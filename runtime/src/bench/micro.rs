//! Hardware microbenchmarks for sizing a run: GEMM throughput over the model's own matrix
//! shapes (and the same shapes knocked off alignment), and STREAM-style memory bandwidth.
//! `zflow bench gemm` / `zflow bench membw` print them and write Parquet.

use std::time::Instant;

use burn::tensor::backend::Backend;
use burn::tensor::{Distribution, Tensor};
use serde::{Deserialize, Serialize};

use crate::model::config::ModelConfig;

/// One GEMM shape: `[m, k] x [k, n]`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GemmShape {
    /// Where the model uses it.
    pub name: String,
    /// Rows (tokens).
    pub m: usize,
    /// Columns of the output.
    pub n: usize,
    /// Inner dimension.
    pub k: usize,
}

/// The model's GEMMs for `tokens` tokens at once (forward), each also with `n` and `k` moved
/// off a multiple of 64 (`-odd` variants), which is what the sweep compares.
pub fn model_shapes(model: &ModelConfig, tokens: usize) -> Vec<GemmShape> {
    let h = model.hidden_size;
    let base = [
        ("attn linear_q", h, model.q_latent()),
        ("attn linear_k", h, model.kv_latent()),
        ("attn o_proj", model.q_latent(), h),
        ("router down_proj", h, model.router_dim),
        ("expert fc1 (gate+up)", h, 2 * model.expert_ffn),
        ("expert fc2", model.expert_ffn, h),
        ("lm head (tied embedding)", h, model.vocab_size),
    ];
    let mut out = Vec::new();
    for (name, k, n) in base {
        out.push(GemmShape {
            name: name.to_string(),
            m: tokens,
            n,
            k,
        });
        out.push(GemmShape {
            name: format!("{name} -odd"),
            m: tokens,
            n: odd(n),
            k: odd(k),
        });
    }
    out
}

/// Square-ish GEMMs `[tokens, d] x [d, d]` for `d` from `center - span` to `center + span` in
/// steps of 8: where throughput dips between multiples of 64/128, the dims the sizing lint asks
/// for pay off.
pub fn dimension_sweep(tokens: usize, center: usize, span: usize, step: usize) -> Vec<GemmShape> {
    let lo = center.saturating_sub(span).max(step);
    (lo..=center + span)
        .step_by(step.max(1))
        .map(|d| GemmShape {
            name: format!("d={d}"),
            m: tokens,
            n: d,
            k: d,
        })
        .collect()
}

/// `x` moved off every power-of-two multiple: the next number of the form 64j + 33.
fn odd(x: usize) -> usize {
    x / 64 * 64 + 33
}

/// GFLOP/s of `shape` on `device` (best of `reps` after a warm-up).
pub fn gemm_gflops<B: Backend>(shape: &GemmShape, reps: usize, device: &B::Device) -> f64 {
    let a = Tensor::<B, 2>::random([shape.m, shape.k], Distribution::Normal(0.0, 1.0), device);
    let b = Tensor::<B, 2>::random([shape.k, shape.n], Distribution::Normal(0.0, 1.0), device);
    let run = || {
        let _ = a.clone().matmul(b.clone()).slice([0..1, 0..1]).into_data();
    };
    run();
    let mut best = f64::MAX;
    for _ in 0..reps.max(1) {
        let t = Instant::now();
        run();
        best = best.min(t.elapsed().as_secs_f64());
    }
    2.0 * (shape.m * shape.n * shape.k) as f64 / best / 1e9
}

/// A STREAM kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Stream {
    /// a = b
    Copy,
    /// a = q b
    Scale,
    /// a = b + c
    Add,
    /// a = b + q c
    Triad,
}

impl Stream {
    /// All four, in STREAM's order.
    pub const ALL: [Stream; 4] = [Stream::Copy, Stream::Scale, Stream::Add, Stream::Triad];

    /// Bytes moved per element (f64 arrays, as STREAM counts: reads plus the write).
    pub fn bytes_per_element(self) -> usize {
        match self {
            Stream::Copy | Stream::Scale => 16,
            Stream::Add | Stream::Triad => 24,
        }
    }
}

/// STREAM bandwidth (GB/s, best of `reps`) over arrays of `len` f64, split across `threads`
/// threads (each touches its own part of every array first, so pages land near it).
pub fn stream_gbps(kernel: Stream, len: usize, threads: usize, reps: usize) -> f64 {
    let threads = threads.max(1);
    let mut a = vec![0.0f64; len];
    let b = vec![1.0f64; len];
    let c = vec![2.0f64; len];
    let q = 3.0;
    let chunk = len.div_ceil(threads);
    let mut best = f64::MAX;
    for _ in 0..reps.max(1) + 1 {
        let t = Instant::now();
        std::thread::scope(|s| {
            for ((a, b), c) in a
                .chunks_mut(chunk)
                .zip(b.chunks(chunk))
                .zip(c.chunks(chunk))
            {
                s.spawn(move || match kernel {
                    Stream::Copy => a.copy_from_slice(b),
                    Stream::Scale => a.iter_mut().zip(b).for_each(|(a, b)| *a = q * b),
                    Stream::Add => a
                        .iter_mut()
                        .zip(b)
                        .zip(c)
                        .for_each(|((a, b), c)| *a = b + c),
                    Stream::Triad => a
                        .iter_mut()
                        .zip(b)
                        .zip(c)
                        .for_each(|((a, b), c)| *a = b + q * c),
                });
            }
        });
        best = best.min(t.elapsed().as_secs_f64());
    }
    std::hint::black_box(&a);
    (kernel.bytes_per_element() * len) as f64 / best / 1e9
}

/// [`gemm_gflops`] for every shape on `backend` (`cpu`, `cuda`, `rocm`) device `device`;
/// returns the device description and the GFLOP/s in `shapes`' order.
pub fn gemm_sweep(
    backend: &str,
    device: usize,
    shapes: &[GemmShape],
    reps: usize,
) -> anyhow::Result<(String, Vec<f64>)> {
    use crate::backend::BackendKind;
    let kind = BackendKind::parse(backend)?;
    let description = crate::backend::probe(kind, device)?;
    let results = match kind {
        BackendKind::Cpu => shapes
            .iter()
            .map(|s| gemm_gflops::<burn_flex::Flex>(s, reps, &burn_flex::FlexDevice))
            .collect(),
        #[cfg(feature = "cuda")]
        BackendKind::Cuda => {
            let d = burn::backend::cuda::CudaDevice::new(device);
            shapes
                .iter()
                .map(|s| gemm_gflops::<burn::backend::Cuda>(s, reps, &d))
                .collect()
        }
        #[cfg(feature = "rocm")]
        BackendKind::Rocm => {
            let d = burn::backend::rocm::RocmDevice::new(device);
            shapes
                .iter()
                .map(|s| gemm_gflops::<burn::backend::Rocm>(s, reps, &d))
                .collect()
        }
        #[allow(unreachable_patterns)]
        _ => unreachable!("probe rejects backends that are not compiled in"),
    };
    Ok((description, results))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_follow_the_model_and_odd_variants_are_misaligned() {
        let m = ModelConfig::zaya1_base();
        let shapes = model_shapes(&m, 4096);
        let fc1 = shapes
            .iter()
            .find(|s| s.name == "expert fc1 (gate+up)")
            .unwrap();
        assert_eq!((fc1.m, fc1.k, fc1.n), (4096, 2048, 4096));
        let odd_fc1 = shapes
            .iter()
            .find(|s| s.name == "expert fc1 (gate+up) -odd")
            .unwrap();
        assert_eq!((odd_fc1.k % 64, odd_fc1.n % 64), (33, 33));
        assert_eq!(
            shapes
                .iter()
                .find(|s| s.name == "lm head (tied embedding)")
                .unwrap()
                .n,
            262_272
        );
        assert!(
            gemm_gflops::<burn_flex::Flex>(
                &GemmShape {
                    name: "t".into(),
                    m: 64,
                    n: 64,
                    k: 64
                },
                1,
                &burn_flex::FlexDevice
            ) > 0.0
        );
        assert!(stream_gbps(Stream::Triad, 1 << 16, 2, 1) > 0.0);
        assert_eq!(Stream::Triad.bytes_per_element(), 24);
        let sweep: Vec<usize> = dimension_sweep(16, 64, 16, 8).iter().map(|s| s.n).collect();
        assert_eq!(sweep, [48, 56, 64, 72, 80]);
        assert_eq!(
            dimension_sweep(16, 8, 64, 8)[0].k,
            8,
            "never a zero dimension"
        );
    }
}
