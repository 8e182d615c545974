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
