//! `zflow size` on the full ZAYA1 recipe reproduces the published parameter counts.

mod common;

use common::Sandbox;

#[test]
fn zaya1_is_8_303b_total_and_753_6m_active_without_embeddings() {
    let sb = Sandbox::new();
    let recipe = format!("{}/recipes/zaya1.yaml", env!("CARGO_MANIFEST_DIR"));
    let out = sb.ok(&["size", &recipe, "--dp", "1024"]);
    let total = out
        .stdout
        .lines()
        .find(|l| l.trim_start().starts_with("total "))
        .unwrap();
    assert!(
        total.contains("8.303 B") && total.contains("8.840 B"),
        "{}",
        out.stdout
    );
    let active = out
        .stdout
        .lines()
        .find(|l| l.trim_start().starts_with("active"))
        .unwrap();
    assert!(
        active.contains("753.609 M") && active.contains("1.291 B"),
        "{}",
        out.stdout
    );
    assert!(
        out.stdout.contains("seq_len 32768"),
        "one report per phase: {}",
        out.stdout
    );
    assert!(out.stdout.contains("sizing lint: clean"), "{}", out.stdout);
}

#[test]
fn sizing_rules_warn_by_name_and_model_typos_are_located() {
    let sb = Sandbox::new();
    sb.write("r.yaml", "model:\n  hidden_size: 200\n");
    let out = sb.ok(&["size", "r.yaml"]);
    assert!(out.stdout.contains("hidden_size"), "{}", out.stdout);
    sb.write("bad.yaml", "model:\n  hiden_size: 256\n");
    let out = sb.zflow(&["size", "bad.yaml"]);
    assert_eq!(out.code, 2, "{}", out.stderr);
    assert!(
        out.stderr.contains("bad.yaml:2:3") && out.stderr.contains("unknown field `hiden_size`"),
        "{}",
        out.stderr
    );
}

#[test]
fn zaya1_fits_an_mi300x_as_the_report_ran_it_and_plan_refuses_what_would_not() {
    let sb = Sandbox::new();
    let recipe = format!("{}/recipes/zaya1.yaml", env!("CARGO_MANIFEST_DIR"));
    let out = sb
        .ok(&["size", &recipe, "--hardware", "mi300x", "--json"])
        .stdout;
    let sized: serde_json::Value = serde_json::from_str(&out).unwrap();
    let phases = sized["phases"].as_array().unwrap();
    assert_eq!(phases.len(), 3, "{out}");
    for p in phases {
        let peak = p["peak_bytes_per_rank"].as_u64().unwrap();
        assert!(peak < 192_000_000_000, "{}: {peak}", p["name"]);
        assert_eq!(p["hardware_bytes"], 192_000_000_000u64);
        for term in [
            "master_weights",
            "gradients",
            "optimizer_shard",
            "activations",
        ] {
            assert!(p[term].as_u64().unwrap() > 0, "{term}: {p}");
        }
    }
    // Phase 3 as the report ran it: 32K split over 2 ranks, 512 groups, 1024 GPUs.
    let phase3 = &phases[2]["setup"];
    assert_eq!(
        (
            &phase3["seq_len"],
            &phase3["context_parallel"],
            &phase3["data_parallel"]
        ),
        (&32768.into(), &2.into(), &512.into())
    );
    let text = sb.ok(&["size", &recipe, "--hardware", "mi300x"]).stdout;
    assert!(
        text.contains("fits MI300X") && text.contains("headroom"),
        "{text}"
    );

    // Every activation kept and a whole 32K sequence per rank: refused when asked, named.
    let shipped = std::fs::read_to_string(&recipe).unwrap();
    let heavy = shipped
        .replace(
            "activation_checkpointing: selective",
            "activation_checkpointing: none",
        )
        .replace("launch: {context_parallel: 2}", "launch: {nodes: 64}");
    assert_ne!(heavy, shipped);
    sb.write("heavy.yaml", &heavy);
    let refused = sb.zflow(&["plan", "heavy.yaml", "--hardware", "mi300x"]);
    assert!(
        refused.code != 0
            && refused.stderr.contains("heavy.yaml")
            && refused.stderr.contains("phases.phase3")
            && refused.stderr.contains("over MI300X's 192.0 GB"),
        "{}",
        refused.stderr
    );
    // Not asked, the plan goes on.
    let planned = sb.zflow(&["plan", "heavy.yaml"]);
    assert!(
        !planned.stderr.contains("does not fit"),
        "{}",
        planned.stderr
    );
}
