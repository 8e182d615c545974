//! The hardware benchmarks (`zflow bench gemm`, `membw`), `zflow size`'s projection, and the
//! preflight stage probing every rank, through the real binary.

mod common;

use common::Sandbox;

#[test]
fn gemm_and_membw_benchmarks_measure_and_write_parquet() {
    let sb = Sandbox::new();
    sb.write("r.yaml", "name: hw\nmodel: {hidden_size: 64, num_blocks: 2, vocab_size: 512, num_query_heads: 2, num_kv_heads: 1, head_dim: 32, num_experts: 4, expert_ffn: 64, router_dim: 32}\n");
    let out = sb
        .ok(&[
            "bench", "gemm", "r.yaml", "--tokens", "64", "--out", "bench",
        ])
        .stdout;
    assert!(
        out.contains("expert fc1 (gate+up) -odd") && out.contains("lm head"),
        "{out}"
    );
    assert!(sb.path().join("bench/gemm.parquet").exists());
    // hidden 64: the sweep runs d = 8..128 in steps of 8.
    assert!(
        out.contains("d =    128") && out.contains("(x128)") && out.contains("(x64)"),
        "{out}"
    );
    assert_plot(&sb.path().join("bench/gemm-sweep"), &["multiples of 64"]);
    let out = sb
        .ok(&["bench", "membw", "--mib", "4", "--out", "bench"])
        .stdout;
    assert!(
        ["copy", "scale", "add", "triad"]
            .iter()
            .all(|k| out.contains(k)),
        "{out}"
    );
    assert!(sb.path().join("bench/membw.parquet").exists());
    assert_plot(&sb.path().join("bench/membw"), &["triad", "4M"]);
}

#[test]
fn size_projects_zaya1_on_mi300x_next_to_the_report() {
    let sb = Sandbox::new();
    let recipe = concat!(env!("CARGO_MANIFEST_DIR"), "/recipes/zaya1.yaml");
    let out = sb.ok(&["size", recipe, "--hardware", "mi300x"]).stdout;
    assert!(
        out.contains("cost projection on MI300X") && out.contains("ZAYA1 report: ~2.5 s per step"),
        "{out}"
    );
    let ratio: f64 = out
        .split("ratio ")
        .nth(1)
        .unwrap()
        .split_whitespace()
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert!(ratio > 0.0 && ratio < 10.0, "{ratio}");
    assert!(out.contains("phase3") && out.contains("512"), "{out}");
    let bad = sb.zflow(&["size", recipe, "--hardware", "tpu"]);
    assert!(
        bad.code != 0 && bad.stderr.contains("expected mi300x, h200 or this"),
        "{}",
        bad.stderr
    );
}

/// `<stem>.png` is a PNG and `<stem>.svg` carries the given labels.
fn assert_plot(stem: &std::path::Path, labels: &[&str]) {
    let png = std::fs::read(stem.with_extension("png")).unwrap();
    assert_eq!(&png[1..4], b"PNG", "{}", stem.display());
    let svg = std::fs::read_to_string(stem.with_extension("svg")).unwrap();
    for label in labels {
        assert!(svg.contains(label), "{} lacks {label}", stem.display());
    }
}

#[test]
#[cfg_attr(
    not(zflow_torch),
    ignore = "needs the torch engine's Python: scripts/setup.sh creates it, scripts/test.sh sets ZFLOW_TORCH_PYTHON"
)]
fn preflight_stage_probes_every_rank_and_fails_or_reports_an_outlier() {
    // The torch engine's probe, the default when the recipe names no engine.
    let recipe = |on_outlier: &str| {
        format!(
            "name: pf\nstages:\n  - name: preflight\n    kind: preflight\n    ranks: 3\n    on_outlier: {on_outlier}\n"
        )
    };
    // Healthy ranks: `report`, because on a busy 2-core machine (this binary's other tests run
    // beside this one) three probes at once can measure a real, passing slowdown.
    let sb = Sandbox::new();
    sb.write("r.yaml", &recipe("report"));
    sb.ok(&["run", "r.yaml"]);
    let verdict: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(sb.output("preflight").join("preflight.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(verdict["ranks"].as_array().unwrap().len(), 3, "{verdict}");
    assert!(
        verdict["ranks"][2]["probe"]["gemm_gflops"]
            .as_f64()
            .unwrap()
            > 0.0,
        "{verdict}"
    );
    assert!(sb.output("preflight").join("preflight.parquet").exists());
    assert_eq!(
        sb.ok(&["run", "r.yaml"]).ran(),
        Vec::<String>::new(),
        "a second run on the same machine is cached"
    );

    // Rank 2's device is slow (300 ms added to every timing): failing names it.
    let sb = Sandbox::new();
    let slow = || {
        sb.cmd(&["run", "r.yaml"])
            .env("ZFLOW_FAULTS", "slow@0:ms=300:rank=2")
            .output()
            .unwrap()
    };
    sb.write("r.yaml", &recipe("fail"));
    let out = slow();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success()
            && stderr.contains("1 outlier rank(s)")
            && stderr.contains("rank 2: GEMM"),
        "{stderr}"
    );
    sb.write("r.yaml", &recipe("report"));
    let out = slow();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let verdict: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(sb.output("preflight").join("preflight.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(
        verdict["exclude_hosts"].as_array().unwrap().len(),
        1,
        "{verdict}"
    );
    let bad = Sandbox::new();
    bad.write(
        "r.yaml",
        "name: pf\nstages:\n  - {name: preflight, kind: preflight, min_ratio: 2}\n",
    );
    let err = bad.zflow(&["plan", "r.yaml"]);
    assert!(
        err.code != 0 && err.stderr.contains("min_ratio") && err.stderr.contains("r.yaml:3"),
        "{}",
        err.stderr
    );
}
