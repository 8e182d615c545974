//! The preflight health check: before a train stage trains, every rank measures its device
//! with a short GEMM and a memory-bandwidth probe (the torch engine's `probe`, in
//! `workers/torch/zflow_torch/trainer.py`) and reports a [`Probe`]. The
//! supervisor compares the ranks: one far below the median (a throttled GPU, a bad DIMM, a
//! noisy neighbour) is reported and, if the recipe says so, left out of the run, since one slow
//! rank sets the pace of every synchronous step.

use serde::{Deserialize, Serialize};

/// One rank's probe results.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Probe {
    /// Square f32 matmul throughput, GFLOP/s (best of 3).
    pub gemm_gflops: f64,
    /// Device memory bandwidth of an elementwise add (read two, write one), GB/s (best of 3).
    pub membw_gbps: f64,
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
    }
}
