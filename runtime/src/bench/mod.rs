//! The hardware measurements `zflow bench` and `zflow size` print ([`micro`]: GEMM over the
//! model's shapes, STREAM bandwidth), and this machine's square-matmul peak.

pub mod micro;

/// Best-of-`reps` f32 GFLOP/s of an `n x n x n` matrix multiply on this machine's cores.
pub fn matmul_gflops(n: usize, reps: usize) -> f64 {
    micro::gemm_gflops(
        &micro::GemmShape {
            name: format!("{n}^3"),
            m: n,
            n,
            k: n,
        },
        reps,
    )
}
