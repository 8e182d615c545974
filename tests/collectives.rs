//! `zflow bench collectives` through the real binary: real worker processes on the ring.

mod common;

use common::Sandbox;

#[test]
fn collectives_benchmark_runs_every_op_on_real_processes() {
    let sb = Sandbox::new();
    let out = sb.ok(&["bench", "collectives", "--ranks", "2,3", "--max-bytes", "65536", "--out", "bench"]).stdout;
    for op in ["all_reduce", "reduce_scatter", "all_gather", "broadcast"] {
        assert!(out.contains(&format!("{op}: time (us)")), "{out}");
    }
    assert!(out.contains("2 ranks") && out.contains("3 ranks") && out.contains("65536"), "{out}");
    // 4 ops x 7 sizes (1 KiB..64 KiB) x 2 rank counts.
    assert!(out.contains("56 points in"), "{out}");
    assert!(sb.path().join("bench/collectives.parquet").exists());
    let bad = sb.zflow(&["bench", "collectives", "--ranks", "1"]);
    assert!(bad.code != 0 && bad.stderr.contains("at least 2"), "{}", bad.stderr);
}
