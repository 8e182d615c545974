//! The preflight health check: before a train stage trains, every rank measures its device
//! with a short GEMM and a memory-bandwidth probe on the backend it trains with. The
//! supervisor compares the ranks: one far below the median (a throttled GPU, a bad DIMM, a
//! noisy neighbour) is reported and, if the recipe says so, left out of the run, since one slow
//! rank sets the pace of every synchronous step.

use std::time::Instant;

use burn::tensor::backend::Backend;
use burn::tensor::{Distribution, Tensor};
use serde::{Deserialize, Serialize};

/// One rank's probe results.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Probe {
    /// Square f32 matmul throughput, GFLOP/s (best of 3).
    pub gemm_gflops: f64,
    /// Device memory bandwidth of an elementwise add (read two, write one), GB/s (best of 3).
    pub membw_gbps: f64,
}

/// Measures `device` (about 0.1 s on a CPU). `slow_ms` stretches each timing (fault injection
/// of a slow device).
pub fn probe<B: Backend>(device: &B::Device, slow_ms: u64) -> Probe {
    let n = 512;
    let a = Tensor::<B, 2>::random([n, n], Distribution::Normal(0.0, 1.0), device);
    let b = Tensor::<B, 2>::random([n, n], Distribution::Normal(0.0, 1.0), device);
    let gemm = best_of(3, slow_ms, || {
        let _ = a.clone().matmul(b.clone()).sum().into_data();
    });
    let len = 1 << 22;
    let x = Tensor::<B, 1>::random([len], Distribution::Default, device);
    let y = Tensor::<B, 1>::random([len], Distribution::Default, device);
    let add = best_of(3, slow_ms, || {
        let _ = (x.clone() + y.clone()).slice(0..1).into_data();
    });
    Probe {
        gemm_gflops: 2.0 * (n as f64).powi(3) / gemm / 1e9,
        membw_gbps: 3.0 * 4.0 * len as f64 / add / 1e9,
    }
}

fn best_of(reps: usize, slow_ms: u64, mut f: impl FnMut()) -> f64 {
    f(); // warm-up: allocation, kernel compilation on GPUs
    let mut best = f64::MAX;
    for _ in 0..reps {
        let t = Instant::now();
        f();
        std::thread::sleep(std::time::Duration::from_millis(slow_ms));
        best = best.min(t.elapsed().as_secs_f64());
    }
    best
}

/// [`probe`] on `backend` (`cpu`, `cuda`, `rocm`) device `device`: the device description and
/// its probe (`zflow worker --probe`, which the `preflight` stage starts once per rank).
/// `slow_ms` as in [`probe`].
pub fn probe_backend(
    backend: &str,
    device: usize,
    slow_ms: u64,
) -> anyhow::Result<(String, Probe)> {
    use crate::backend::BackendKind;
    let kind = BackendKind::parse(backend)?;
    let description = crate::backend::probe(kind, device)?;
    let probe = match kind {
        BackendKind::Cpu => probe::<burn_flex::Flex>(&burn_flex::FlexDevice, slow_ms),
        #[cfg(feature = "cuda")]
        BackendKind::Cuda => {
            probe::<burn::backend::Cuda>(&burn::backend::cuda::CudaDevice::new(device), slow_ms)
        }
        #[cfg(feature = "rocm")]
        BackendKind::Rocm => {
            probe::<burn::backend::Rocm>(&burn::backend::rocm::RocmDevice::new(device), slow_ms)
        }
        #[allow(unreachable_patterns)]
        _ => unreachable!("probe rejects backends that are not compiled in"),
    };
    Ok((description, probe))
}

/// Ranks whose GEMM or bandwidth is below `min_ratio` x the median over all ranks, with why.
pub fn outliers(probes: &[Probe], min_ratio: f64) -> Vec<(usize, String)> {
    let median = |f: fn(&Probe) -> f64| {
        let mut v: Vec<f64> = probes.iter().map(f).collect();
        v.sort_by(|a, b| a.total_cmp(b));
        v[v.len() / 2]
    };
    let (gemm, bw) = (median(|p| p.gemm_gflops), median(|p| p.membw_gbps));
    probes
        .iter()
        .enumerate()
        .filter(|(_, p)| p.gemm_gflops < min_ratio * gemm || p.membw_gbps < min_ratio * bw)
        .map(|(r, p)| (r, format!("rank {r}: GEMM {:.1} GFLOP/s (median {gemm:.1}), memory {:.1} GB/s (median {bw:.1})", p.gemm_gflops, p.membw_gbps)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_slow_rank_against_the_median() {
        let p = |g, b| Probe {
            gemm_gflops: g,
            membw_gbps: b,
        };
        let probes = [p(40.0, 10.0), p(41.0, 11.0), p(12.0, 10.5), p(39.0, 2.0)];
        let slow: Vec<usize> = outliers(&probes, 0.5).into_iter().map(|(r, _)| r).collect();
        assert_eq!(slow, vec![2, 3]);
        assert!(outliers(&probes[..2], 0.5).is_empty());
        let p = probe::<burn_flex::Flex>(&burn_flex::FlexDevice, 0);
        assert!(p.gemm_gflops > 0.0 && p.membw_gbps > 0.0, "{p:?}");
    }
}
