//! The torch engine's model (`workers/torch/zflow_torch/model.py`) against zflow's own
//! definition: the same tensor list in the same order, with the same shapes, Muon/AdamW split
//! and parameter ids (`zflow_runtime::model::tensors`, `param_id`), so both engines' checkpoints
//! name, shape and shard every tensor alike; and the same marker for the torch engine's
//! optimizer records. Runs the Python of the torch engine's environment.

mod common;

use zflow_runtime::model::Zaya;
use zflow_runtime::model::config::ModelConfig;

#[test]
#[cfg_attr(
    not(zflow_torch),
    ignore = "needs the torch engine's Python: scripts/setup.sh creates it, scripts/test.sh sets ZFLOW_TORCH_PYTHON"
)]
fn the_torch_model_names_shapes_and_ids_every_tensor_as_zflow_does() {
    let dir = tempfile::tempdir().unwrap();
    // ZAYA1-base, and a small config with other sizes (3-tap convolutions, 3 KV heads), whose
    // model is built to read its ids.
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
        let ids: Option<std::collections::BTreeMap<String, u64>> =
            (config.num_blocks == 3).then(|| {
                let model: Zaya<burn_flex::Flex> = Zaya::new(&config, 0, &burn_flex::FlexDevice);
                zflow_runtime::trainer::param_list(&model)
                    .into_iter()
                    .map(|(name, id, _)| (name, id))
                    .collect()
            });
        assert_eq!(python.len(), rust.len());
        for (p, r) in python.iter().zip(&rust) {
            assert_eq!(p["name"], r.name.as_str());
            assert_eq!(p["shape"], serde_json::json!(r.shape), "{}", r.name);
            assert_eq!(p["linear"], r.linear, "{}", r.name);
            if let Some(ids) = &ids {
                assert_eq!(p["id"].as_u64().unwrap(), ids[&r.name], "{}", r.name);
            }
        }
    }
    let marker = common::torch_module_stdout("zflow_torch.checkpoint", vec![]);
    assert_eq!(
        marker.trim().as_bytes(),
        zflow_runtime::dist::zero::TORCH_RECORD
    );
}
