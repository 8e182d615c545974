//! `zflow bench collectives`: the trainer's own collectives ([`Group`]) between real worker
//! processes, timed over message sizes, reported as nccl-tests does: time, algorithm bandwidth
//! (bytes / time) and bus bandwidth (algorithm bandwidth x the fraction of the data each link
//! must carry, so numbers compare across rank counts and against the link speed).

use std::time::Instant;

use anyhow::Result;
use serde::{Deserialize, Serialize};

use crate::dist::collective::{Group, even_blocks};

/// A collective operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Op {
    /// Sum everywhere.
    AllReduce,
    /// Each rank ends with its block of the sum.
    ReduceScatter,
    /// Each rank's block to everyone.
    AllGather,
    /// Rank 0's buffer to everyone.
    Broadcast,
}

impl Op {
    /// All of them, in report order.
    pub const ALL: [Op; 4] = [
        Op::AllReduce,
        Op::ReduceScatter,
        Op::AllGather,
        Op::Broadcast,
    ];

    /// The nccl-tests name.
    pub fn name(self) -> &'static str {
        match self {
            Op::AllReduce => "all_reduce",
            Op::ReduceScatter => "reduce_scatter",
            Op::AllGather => "all_gather",
            Op::Broadcast => "broadcast",
        }
    }

    /// Bus bandwidth / algorithm bandwidth for `n` ranks (nccl-tests' PERFORMANCE.md):
    /// all-reduce moves 2(n-1)/n of the data over each link, reduce-scatter and all-gather
    /// (n-1)/n, a broadcast all of it.
    pub fn bus_factor(self, n: usize) -> f64 {
        let n = n as f64;
        match self {
            Op::AllReduce => 2.0 * (n - 1.0) / n,
            Op::ReduceScatter | Op::AllGather => (n - 1.0) / n,
            Op::Broadcast => 1.0,
        }
    }
}

/// One measured point.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Point {
    /// The operation.
    pub op: Op,
    /// Ranks.
    pub ranks: usize,
    /// Message size in bytes (the whole buffer, as in nccl-tests).
    pub bytes: u64,
    /// Mean time per operation (s).
    pub time_s: f64,
}

impl Point {
    /// Algorithm bandwidth, GB/s.
    pub fn algbw_gbps(&self) -> f64 {
        self.bytes as f64 / self.time_s / 1e9
    }

    /// Bus bandwidth, GB/s.
    pub fn busbw_gbps(&self) -> f64 {
        self.algbw_gbps() * self.op.bus_factor(self.ranks)
    }
}

/// Message sizes: powers of two from 1 KiB to `max_bytes`.
pub fn sizes(max_bytes: u64) -> Vec<u64> {
    std::iter::successors(Some(1024u64), |s| Some(s * 2))
        .take_while(|s| *s <= max_bytes.max(1024))
        .collect()
}

/// Runs every operation at every size on `group` (all ranks call this together); returns
/// rank 0's timings, from a barrier before the repetitions to a barrier after them.
pub fn measure(group: &mut Group, max_bytes: u64) -> Result<Vec<Point>> {
    let mut out = Vec::new();
    for op in Op::ALL {
        for bytes in sizes(max_bytes) {
            let len = (bytes / 4) as usize;
            let mut buf = vec![1.0f32; len];
            let blocks = even_blocks(len, group.world);
            // Enough repetitions for ~64 MiB of traffic per size, at least 3, plus a warm-up.
            let reps = ((64u64 << 20) / bytes).clamp(3, 200) as usize;
            let run = |group: &mut Group, buf: &mut Vec<f32>| -> Result<()> {
                match op {
                    Op::AllReduce => group.all_reduce_sum(buf),
                    Op::ReduceScatter => group.reduce_scatter(buf, &blocks),
                    Op::AllGather => group.all_gather(buf, &blocks),
                    Op::Broadcast => group.broadcast(buf, 0),
                }
            };
            run(group, &mut buf)?;
            group.barrier()?;
            let t = Instant::now();
            for _ in 0..reps {
                run(group, &mut buf)?;
            }
            // A broadcast's root is done once its bytes are in the socket: the closing barrier
            // makes every operation's time run until the last rank has its result.
            group.barrier()?;
            out.push(Point {
                op,
                ranks: group.world,
                bytes,
                time_s: t.elapsed().as_secs_f64() / reps as f64,
            });
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bus_bandwidth_by_the_nccl_tests_definitions() {
        // 1 GB all-reduce on 4 ranks in 0.5 s: algbw 2 GB/s, busbw 2 x 2 x 3/4 = 3 GB/s.
        let p = Point {
            op: Op::AllReduce,
            ranks: 4,
            bytes: 1_000_000_000,
            time_s: 0.5,
        };
        assert!((p.algbw_gbps() - 2.0).abs() < 1e-12 && (p.busbw_gbps() - 3.0).abs() < 1e-12);
        // All-gather of 1 GB on 2 ranks in 1 s: busbw 0.5 GB/s; broadcast: busbw = algbw.
        let p = Point {
            op: Op::AllGather,
            ranks: 2,
            bytes: 1_000_000_000,
            time_s: 1.0,
        };
        assert!((p.busbw_gbps() - 0.5).abs() < 1e-12);
        assert_eq!(Op::Broadcast.bus_factor(8), 1.0);
        assert_eq!(Op::ReduceScatter.bus_factor(8), 7.0 / 8.0);
        // One rank moves nothing over a link.
        assert_eq!(Op::AllReduce.bus_factor(1), 0.0);
        assert_eq!(sizes(1 << 13), vec![1024, 2048, 4096, 8192]);
    }
}
