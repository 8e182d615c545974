//! `zflow size`'s memory model against the torch engine's measured peak
//! (`runtime/src/size/memory.rs`, `zflow bench memory`): ZAYA1-width models (hidden 2048, 16
//! experts, ZAYA1's attention and router) trained on this machine's CPU, without and with
//! activation checkpointing, on one rank and split over two (context parallelism). Each
//! phase's prediction must be within 10% of the largest rank's measured peak.

mod common;

use common::Sandbox;

/// Three set-ups, each a phase: every activation kept (the activations' peak), selective
/// checkpointing over 2 context-parallel ranks, and full checkpointing (its recomputed
/// block). The experts are narrow (F 128) and Muon makes one Newton-Schulz iteration, to keep
/// the test short on 2 cores; the shapes that decide the activations are ZAYA1's.
const RECIPE: &str = r#"
name: memory-model
model: {hidden_size: 2048, num_blocks: 2, vocab_size: 8192, num_query_heads: 8, num_kv_heads: 2, head_dim: 128, conv_kernel: 2, rope_fraction: 0.5, num_experts: 16, top_k: 1, expert_ffn: 128, router_dim: 256, router_mlp_layers: 3}
sources:
  a: {url: /nonexistent/a.jsonl}
tokenizer: {file: /nonexistent/tokenizer.json}
train: {global_batch: 1, micro_batch: 1, backend: cpu, muon: {ns_steps: 1}}
phases:
  kept: {tokens: 1000000, seq_len: 2048, mixture: {a: 1.0}}
  selective_cp2: {tokens: 1000000, seq_len: 2048, mixture: {a: 1.0}, train: {global_batch: 2, micro_batch: 2, activation_checkpointing: selective, launch: {context_parallel: 2}}}
  full: {tokens: 1000000, seq_len: 4096, mixture: {a: 1.0}, train: {activation_checkpointing: full}}
"#;

#[test]
#[cfg_attr(
    not(zflow_torch),
    ignore = "needs the torch engine's Python: scripts/setup.sh creates it, scripts/test.sh sets ZFLOW_TORCH_PYTHON"
)]
fn the_memory_model_is_within_ten_percent_of_the_measured_peak() {
    let sb = Sandbox::new();
    sb.write("r.yaml", RECIPE);
    let out = sb.ok(&["bench", "memory", "r.yaml", "--json"]).stdout;
    let result: serde_json::Value = serde_json::from_str(out.lines().last().unwrap()).unwrap();
    let phases = result["phases"].as_array().unwrap();
    assert_eq!(phases.len(), 3, "{out}");
    for p in phases {
        let error = p["error"].as_f64().unwrap();
        eprintln!(
            "{}: predicted {} bytes, measured {} ({:+.1}%)",
            p["name"],
            p["predicted_bytes"],
            p["measured_bytes"],
            100.0 * error
        );
        assert!(
            error.abs() <= 0.10,
            "phase {}: predicted {} bytes, measured {} ({:+.1}%)",
            p["name"],
            p["predicted_bytes"],
            p["measured_bytes"],
            100.0 * error
        );
    }
    assert_eq!(phases[1]["setup"]["context_parallel"], 2);
}
