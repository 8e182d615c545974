//! The preflight health check: before a train stage trains, every rank measures its device
//! with a short GEMM and a memory-bandwidth probe (the torch engine's `probe`, in
//! `workers/torch/zflow_torch/distributed.py`) and reports a [`Probe`]. The
//! supervisor compares the ranks: one far below the median (a throttled GPU, a bad DIMM, a
//! noisy neighbour) is reported and, if the recipe says so, left out of the run, since one slow
//! rank sets the pace of every synchronous step. It also compares each device's bf16 matmuls
//! with its f32 ones: a phase that asks for bf16 work where bf16 is slow is warned
//! ([`slow_bf16`]).

use serde::{Deserialize, Serialize};

/// One rank's probe results.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Probe {
    /// Matmul throughput in the number format training multiplies in, GFLOP/s (best of 3): bf16
    /// at the model's own expert shape on GPUs, f32 512^2 on the CPU. The ranks are compared on
    /// it.
    pub gemm_gflops: f64,
    /// Device memory bandwidth of an elementwise add (read two, write one), GB/s (best of 3).
    pub membw_gbps: f64,
    /// One matmul in f32, GFLOP/s (best of 3): the GPU's expert shape; 256^3 on one thread of
    /// the CPU.
    /// (0 in records made before it was measured.)
    #[serde(default)]
    pub f32_gflops: f64,
    /// The same matmul in bf16, GFLOP/s (best of 3).
    #[serde(default)]
    pub bf16_gflops: f64,
}

/// bf16 matmuls slower than this fraction of f32's make a phase's bf16 work a warning: a CPU
/// without AMX or AVX512-BF16 units runs them at ~1/50 of f32's speed, where GPUs and CPUs
/// with such units run them at 2-10x f32's.
pub const SLOW_BF16_RATIO: f64 = 0.5;

/// The ranks whose bf16 matmuls run at under [`SLOW_BF16_RATIO`] x their f32 ones.
pub fn slow_bf16(probes: &[Probe]) -> Vec<usize> {
    probes
        .iter()
        .enumerate()
        .filter(|(_, p)| p.bf16_gflops < SLOW_BF16_RATIO * p.f32_gflops)
        .map(|(rank, _)| rank)
        .collect()
}

/// The warning for a phase whose `setting` (a recipe path, e.g. `train.muon.ns_dtype`, set to
/// bf16) asks for bf16 work on ranks where bf16 is slow ([`slow_bf16`]), with each such rank's
/// two figures and place (`places`, one per rank); `None` where no rank is slow.
pub fn slow_bf16_warning(probes: &[Probe], places: &[String], setting: &str) -> Option<String> {
    let slow = slow_bf16(probes);
    let shown: Vec<String> = slow
        .iter()
        .take(4)
        .map(|&r| {
            let p = &probes[r];
            format!(
                "rank {r} on {}: bf16 {:.1} GFLOP/s, f32 {:.1} GFLOP/s",
                places.get(r).map_or("?", String::as_str),
                p.bf16_gflops,
                p.f32_gflops
            )
        })
        .collect();
    let more = match slow.len().saturating_sub(shown.len()) {
        0 => String::new(),
        n => format!(" and {n} more"),
    };
    (!slow.is_empty()).then(|| {
        format!(
            "bf16 matmuls run at under {:.0}% of f32's on {} of {} rank(s) ({}{more}), and {setting} is bf16: set {setting}: f32 (`--set {setting}=f32`) for work in f32 there",
            100.0 * SLOW_BF16_RATIO,
            slow.len(),
            probes.len(),
            shown.join("; ")
        )
    })
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

/// One rank's exchange with a peer, measured after the process group forms: both send and
/// receive the same buffer at once, and this is the bytes one way over the time.
///
/// Peers are the rank's two neighbours on a ring of nodes (the same local rank one node
/// after and one before; on one node, the next and previous rank), exchanged in rounds where
/// no rank has two partners. A slow link or network card then shows in both of its rank's
/// figures, and in only one of each neighbour's: that is how [`link_outliers`] names it.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct LinkProbe {
    /// The other rank.
    pub peer: usize,
    /// GB/s one way, best of 3.
    pub gbps: f64,
}

impl std::fmt::Display for LinkProbe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:.2} GB/s with rank {}", self.gbps, self.peer)
    }
}

/// Ranks whose best link figure is below `min_ratio` x the median of the ranks' best figures,
/// with why. A neighbour of a slow rank has one fast link besides its slow one, so it is not
/// named; with only two ranks (or nodes) on the ring the two cannot be told apart, and both are
/// named when other pairs are fast.
pub fn link_outliers(links: &[Vec<LinkProbe>], min_ratio: f64) -> Vec<(usize, String)> {
    let best = |l: &[LinkProbe]| l.iter().map(|l| l.gbps).fold(f64::NEG_INFINITY, f64::max);
    let mut bests: Vec<f64> = links
        .iter()
        .filter(|l| !l.is_empty())
        .map(|l| best(l))
        .collect();
    if bests.is_empty() {
        return Vec::new();
    }
    bests.sort_by(|a, b| a.total_cmp(b));
    let median = bests[bests.len() / 2];
    links
        .iter()
        .enumerate()
        .filter(|(_, l)| !l.is_empty() && best(l) < min_ratio * median)
        .map(|(r, l)| {
            let shown: Vec<String> = l.iter().map(ToString::to_string).collect();
            (
                r,
                format!(
                    "rank {r}: network {} (median best {median:.2})",
                    shown.join(", ")
                ),
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slow_link_names_its_rank_and_not_its_neighbours() {
        // A ring of 4 nodes, one rank each; rank 2's card is slow, so its exchanges with
        // ranks 1 and 3 are.
        let l = |peer, gbps| LinkProbe { peer, gbps };
        let links = vec![
            vec![l(1, 10.0), l(3, 11.0)],
            vec![l(2, 1.0), l(0, 10.0)],
            vec![l(3, 1.2), l(1, 1.0)],
            vec![l(0, 11.0), l(2, 1.2)],
        ];
        let slow = link_outliers(&links, 0.5);
        assert_eq!(slow.len(), 1, "{slow:?}");
        assert_eq!(slow[0].0, 2);
        assert!(slow[0].1.contains("1.20 GB/s with rank 3"), "{slow:?}");
        // Two on the ring: both named; none measured: nothing.
        let pair = vec![vec![l(1, 1.0)], vec![l(0, 1.0)]];
        assert_eq!(link_outliers(&pair, 0.5).len(), 0);
        let pair_with_fast = vec![
            vec![l(1, 1.0)],
            vec![l(0, 1.0)],
            vec![l(3, 9.0)],
            vec![l(2, 9.0)],
        ];
        assert_eq!(
            link_outliers(&pair_with_fast, 0.5)
                .iter()
                .map(|o| o.0)
                .collect::<Vec<_>>(),
            vec![0, 1]
        );
        assert!(link_outliers(&[vec![], vec![]], 0.5).is_empty());
    }

    #[test]
    fn slow_bf16_names_the_setting_and_both_figures_of_each_slow_rank() {
        let p = |f32_gflops, bf16_gflops| Probe {
            gemm_gflops: 40.0,
            membw_gbps: 10.0,
            f32_gflops,
            bf16_gflops,
        };
        let places = ["a (cpu)".to_string(), "b (cpu)".to_string()];
        // AMX or AVX512-BF16 units, a GPU: bf16 beats f32.
        assert!(slow_bf16_warning(&[p(80.0, 160.0)], &places, "train.muon.ns_dtype").is_none());
        // AVX2 alone: bf16 at 1/50 of f32 on rank 1.
        let why = slow_bf16_warning(
            &[p(80.0, 160.0), p(78.0, 1.6)],
            &places,
            "train.muon.ns_dtype",
        )
        .unwrap();
        assert!(
            why.contains("1 of 2 rank(s)")
                && why.contains("rank 1 on b (cpu): bf16 1.6 GFLOP/s, f32 78.0 GFLOP/s")
                && why.contains("set train.muon.ns_dtype: f32"),
            "{why}"
        );
        assert_eq!(slow_bf16(&[p(80.0, 39.0), p(80.0, 41.0)]), vec![0]);
    }

    #[test]
    fn finds_the_slow_rank_against_the_median() {
        let p = |g, b| Probe {
            gemm_gflops: g,
            membw_gbps: b,
            f32_gflops: g,
            bf16_gflops: g,
        };
        let probes = [p(40.0, 10.0), p(41.0, 11.0), p(12.0, 10.5), p(39.0, 2.0)];
        let slow: Vec<usize> = outliers(&probes, 0.5).into_iter().map(|(r, _)| r).collect();
        assert_eq!(slow, vec![2, 3]);
        assert!(outliers(&probes[..2], 0.5).is_empty());
    }
}
