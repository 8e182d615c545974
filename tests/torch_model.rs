//! The torch engine's model (`workers/torch/zflow_torch/model.py`) against zflow's formats: the
//! same tensor list in the same order, with the same shapes and Muon/AdamW split
//! (`zflow_runtime::model::tensors`), so the checkpoints it writes name and shape every tensor
//! as export, import and inspect read them; and the same
//! optimizer-state record format (`runtime/src/checkpoint/optimizer.rs`). Runs the Python of the
//! torch engine's environment.

mod common;

use zflow_runtime::model::config::ModelConfig;

#[test]
#[cfg_attr(
    not(zflow_torch),
    ignore = "needs the torch engine's Python: scripts/setup.sh creates it, scripts/test.sh sets ZFLOW_TORCH_PYTHON"
)]
fn the_torch_model_names_shapes_and_ids_every_tensor_as_zflow_does() {
    let dir = tempfile::tempdir().unwrap();
    // ZAYA1-base, and a small config with other sizes (3-tap convolutions, 3 KV heads).
    let small = ModelConfig {
        hidden_size: 48,
        num_blocks: 3,
        vocab_size: 300,
        num_query_heads: 6,
        num_kv_heads: 3,
        head_dim: 12,
        num_experts: 5,
        expert_ffn: 24,
        router_dim: 16,
        conv_kernel: 3,
        ..ModelConfig::default()
    };
    for config in [ModelConfig::default(), small] {
        let path = dir.path().join("model.json");
        std::fs::write(&path, serde_json::to_vec(&config).unwrap()).unwrap();
        let lines = common::torch_module_stdout("zflow_torch.model", vec![path.into()]);
        let python: Vec<serde_json::Value> = lines
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        let rust = zflow_runtime::model::tensors(&config);
        assert_eq!(python.len(), rust.len());
        for (p, r) in python.iter().zip(&rust) {
            assert_eq!(p["name"], r.name.as_str());
            assert_eq!(p["shape"], serde_json::json!(r.shape), "{}", r.name);
            assert_eq!(p["linear"], r.linear, "{}", r.name);
        }
    }
    // The optimizer-state record (runtime's checkpoint::optimizer).
    use zflow_runtime::checkpoint::optimizer as record;
    let format: serde_json::Value = serde_json::from_str(&common::torch_module_stdout(
        "zflow_torch.checkpoint",
        vec![],
    ))
    .unwrap();
    assert_eq!(
        format["record"].as_str().unwrap().as_bytes(),
        record::RECORD
    );
    assert_eq!(format["velocity"], record::VELOCITY);
    assert_eq!(format["momentum_buffer"], record::MOMENTUM_BUFFER);
    assert_eq!(
        format["adamw"],
        serde_json::json!([record::EXP_AVG, record::EXP_AVG_SQ, record::STEP])
    );
}
