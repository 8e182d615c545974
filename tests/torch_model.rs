//! The torch engine's model (`workers/torch/zflow_torch/model.py`) against zflow's own
//! definition: the same tensor list in the same order, with the same shapes, Muon/AdamW split
//! and parameter ids (`zflow_runtime::model::tensors`, `param_id`), so both engines' checkpoints
//! name, shape and shard every tensor alike, and give Muon the same ones; and the same
//! optimizer-state record format (`runtime/src/checkpoint/optimizer.rs`). Runs the Python of the torch engine's environment.

mod common;

use std::collections::BTreeSet;

use burn::backend::Autodiff;
use zflow_runtime::contract::settings::TrainSettings;
use zflow_runtime::model::Zaya;
use zflow_runtime::model::config::ModelConfig;
use zflow_runtime::trainer::Optimizers;

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
        // The small model is built to read its ids and the native engine's Muon set.
        let native: Option<(std::collections::BTreeMap<String, u64>, BTreeSet<u64>)> =
            (config.num_blocks == 3).then(|| {
                let model: Zaya<Autodiff<burn_flex::Flex>> =
                    Zaya::new(&config, 0, &burn_flex::FlexDevice);
                let ids = zflow_runtime::trainer::param_list(&model)
                    .into_iter()
                    .map(|(name, id, _)| (name, id))
                    .collect();
                let muon = Optimizers::new(&TrainSettings::default(), &model)
                    .muon_ids
                    .iter()
                    .map(|id| id.val())
                    .collect();
                (ids, muon)
            });
        assert_eq!(python.len(), rust.len());
        for (p, r) in python.iter().zip(&rust) {
            assert_eq!(p["name"], r.name.as_str());
            assert_eq!(p["shape"], serde_json::json!(r.shape), "{}", r.name);
            assert_eq!(p["linear"], r.linear, "{}", r.name);
            if let Some((ids, muon)) = &native {
                let id = p["id"].as_u64().unwrap();
                assert_eq!(id, ids[&r.name], "{}", r.name);
                // The torch engine gives Muon the linear weights; the native one the matrices
                // but the embedding: one set, so each reads the other's records.
                assert_eq!(muon.contains(&id), r.linear, "{}: Muon or AdamW", r.name);
            }
        }
    }
    // The optimizer-state record both engines write (runtime's checkpoint::optimizer).
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
    assert_eq!(
        format["legacy_torch_record"].as_str().unwrap().as_bytes(),
        record::LEGACY_TORCH
    );
    assert_eq!(format["velocity"], record::VELOCITY);
    assert_eq!(format["momentum_buffer"], record::MOMENTUM_BUFFER);
    assert_eq!(
        format["adamw"],
        serde_json::json!([record::EXP_AVG, record::EXP_AVG_SQ, record::STEP])
    );
}
