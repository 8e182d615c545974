//! Hardware microbenchmarks for sizing a run: GEMM throughput over the model's own matrix
//! shapes (and the same shapes knocked off alignment), and STREAM-style memory bandwidth.
//! `zflow bench gemm` / `zflow bench membw` print them and write Parquet.

use std::time::Instant;

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

/// f32 GFLOP/s of `shape` on this machine's cores (best of `reps` after a warm-up), through
/// the `gemm` crate (pure-Rust kernels, the ones candle uses on CPUs; GPUs are measured through torch,
/// `scripts/gpu_check.sh`).
pub fn gemm_gflops(shape: &GemmShape, reps: usize) -> f64 {
    let (m, n, k) = (shape.m, shape.n, shape.k);
    // Values do not change the time; a fixed pattern keeps the inputs free of NaNs and denormals.
    let a: Vec<f32> = (0..m * k).map(|i| (i % 17) as f32 * 0.01).collect();
    let b: Vec<f32> = (0..k * n).map(|i| (i % 13) as f32 * 0.01).collect();
    let mut c = vec![0.0f32; m * n];
    let mut run = || {
        // SAFETY: a is m x k, b is k x n and c is m x n, all row-major and alive for the call
        // (column stride 1, row strides k, n and n); c does not alias a or b.
        unsafe {
            gemm::gemm(
                m,
                n,
                k,
                c.as_mut_ptr(),
                1,
                n as isize,
                false,
                a.as_ptr(),
                1,
                k as isize,
                b.as_ptr(),
                1,
                n as isize,
                0.0,
                1.0,
                false,
                false,
                false,
                gemm::Parallelism::Rayon(0),
            )
        }
    };
    run();
    let mut best = f64::MAX;
    for _ in 0..reps.max(1) {
        let t = Instant::now();
        run();
        best = best.min(t.elapsed().as_secs_f64());
    }
    2.0 * (m * n * k) as f64 / best / 1e9
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

/// [`gemm_gflops`] for every shape, in `shapes`' order.
pub fn gemm_sweep(shapes: &[GemmShape], reps: usize) -> Vec<f64> {
    shapes.iter().map(|s| gemm_gflops(s, reps)).collect()
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
            gemm_gflops(
                &GemmShape {
                    name: "t".into(),
                    m: 64,
                    n: 48,
                    k: 32
                },
                1
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
