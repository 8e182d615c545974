use super::config::{Specials, hf_config};
use super::tensors::f32_bytes;
use super::*;
use crate::checkpoint::TrainerState;
use crate::contract::balance::BalanceState;
use crate::data::mixture::DataCursor;
use crate::model::config::{ModelConfig, SkipOutput};
use safetensors::tensor::TensorView;
use safetensors::{Dtype, SafeTensors};
use serde_json::{Map, Value, json};
use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use crate::checkpoint::{self, commit, weights_to_safetensors};

fn tiny() -> ModelConfig {
    ModelConfig {
        hidden_size: 8,
        num_blocks: 2,
        vocab_size: 11,
        num_query_heads: 4,
        num_kv_heads: 2,
        head_dim: 4,
        num_experts: 3,
        expert_ffn: 6,
        router_dim: 4,
        rope_base: 5.0e5,
        ..ModelConfig::default()
    }
}

/// Export options for the legacy layout (Zyphra's fork), which most tests here check.
fn legacy() -> ExportOptions {
    ExportOptions {
        layout: Layout::Legacy,
        ..Default::default()
    }
}

/// Random weights for every tensor of `c` (normal, std 0.5), from `seed`.
fn weights(c: &ModelConfig, seed: u64) -> Vec<(String, Vec<usize>, Vec<f32>)> {
    crate::model::random_weights(c, seed, 0.5)
}

/// A committed checkpoint of a random `c` with distinct balancing biases.
fn checkpoint(root: &Path, c: &ModelConfig, seed: u64) -> (PathBuf, TrainerState) {
    let m = weights(c, seed);
    let routes = c.num_experts + usize::from(c.mod_skip);
    let mut state = TrainerState {
        phase: "p1".into(),
        step: 7,
        total_steps: 7,
        cursor: DataCursor {
            phase: "p1".into(),
            sample: 56,
            fingerprint: "f".into(),
        },
        balance: (0..c.num_blocks)
            .map(|_| BalanceState::new(routes, c.mod_skip))
            .collect(),
        tokens: 448,
        seed,
        loss_history: Vec::new(),
        skipped_batches: Vec::new(),
        rollbacks: 0,
    };
    for (l, b) in state.balance.iter_mut().enumerate() {
        for (r, v) in b.biases.iter_mut().enumerate() {
            *v += 0.125 * (l * routes + r) as f32 - 0.3;
        }
    }
    let meta = BTreeMap::from([("format".to_string(), CHECKPOINT_FORMAT.to_string())]);
    let files = vec![
        (
            "model.safetensors".to_string(),
            weights_to_safetensors(&m, meta).unwrap(),
        ),
        (
            "trainer.json".to_string(),
            serde_json::to_vec_pretty(&state).unwrap(),
        ),
        (
            "model.json".to_string(),
            serde_json::to_vec_pretty(c).unwrap(),
        ),
    ];
    (commit(root, 7, files).unwrap(), state)
}

#[test]
fn export_then_import_is_bit_exact() {
    let dir = tempfile::tempdir().unwrap();
    let c = tiny();
    let (ckpt, state) = checkpoint(&dir.path().join("ckpts"), &c, 3);
    assert_eq!(checkpoint::model_config(&ckpt).unwrap(), c);
    let hf = dir.path().join("hf");
    export_hf(&ckpt, &c, &legacy(), &hf).unwrap();

    // The reference's names and layouts.
    let bytes = fs::read(hf.join("model.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let ours = fs::read(ckpt.join("model.safetensors")).unwrap();
    let ours = SafeTensors::deserialize(&ours).unwrap();
    let q = st
        .tensor("model.layers.2.self_attn.qkv.linear_q.weight")
        .unwrap();
    assert_eq!(q.shape(), [16, 8]); // [out, in] as nn.Linear
    let q0 = ours
        .tensor("blocks.1.self_attn.qkv.linear_q.weight")
        .unwrap();
    let at = |v: &TensorView<'_>, i: usize| {
        f32::from_le_bytes(v.data()[4 * i..4 * i + 4].try_into().unwrap())
    };
    assert_eq!(at(&q, 3 * 8 + 5).to_bits(), at(&q0, 5 * 16 + 3).to_bits()); // hf[o=3][i=5] = ours[i=5][o=3]
    assert_eq!(
        st.tensor("model.layers.3.zaya_block.router.router_mlp.4.weight")
            .unwrap()
            .shape(),
        [4, 4]
    );
    let b = st
        .tensor("model.layers.3.zaya_block.router.balancing_biases")
        .unwrap();
    assert_eq!(b.data(), f32_bytes(&state.balance[1].biases).as_slice());
    assert!(
        st.names().iter().all(|n| !n.starts_with("blocks."))
            && st.tensor("lm_head.weight").is_err()
    );
    let config: Value = serde_json::from_slice(&fs::read(hf.join("config.json")).unwrap()).unwrap();
    assert_eq!(
        (
            config["model_type"].as_str(),
            config["rope_theta"].as_f64(),
            config["num_hidden_layers"].as_u64()
        ),
        (Some("zaya"), Some(5.0e5), Some(4))
    );
    assert_eq!(
        config["bos_token_id"],
        Value::Null,
        "no tokenizer and not Gemma3's vocabulary: unknown"
    );

    let back = dir.path().join("back");
    assert_eq!(import_hf(&hf, &back).unwrap(), c);
    // The same bytes the trainer wrote, a checkpoint that verifies, and the same biases.
    assert_eq!(
        fs::read(back.join("model.safetensors")).unwrap(),
        fs::read(ckpt.join("model.safetensors")).unwrap()
    );
    let files = checkpoint::read_verified(&back).unwrap();
    let imported: TrainerState = serde_json::from_slice(&files["trainer.json"]).unwrap();
    assert_eq!(
        imported
            .balance
            .iter()
            .map(|b| b.biases.clone())
            .collect::<Vec<_>>(),
        state
            .balance
            .iter()
            .map(|b| b.biases.clone())
            .collect::<Vec<_>>()
    );
    assert_eq!(imported.phase.as_str(), IMPORTED_PHASE);
    assert_eq!(checkpoint::model_config(&back).unwrap(), c);
    let seen = checkpoint::inspect(&back);
    assert!(seen.verified && seen.text.contains("manifest verified"));
    // Exported again: the same folder, byte for byte.
    let again = dir.path().join("again");
    export_hf(&back, &c, &legacy(), &again).unwrap();
    for f in ["config.json", "model.safetensors"] {
        assert_eq!(
            fs::read(hf.join(f)).unwrap(),
            fs::read(again.join(f)).unwrap(),
            "{f}"
        );
    }
}

#[test]
fn the_transformers_layout_stacks_experts_and_round_trips_bit_exact() {
    let dir = tempfile::tempdir().unwrap();
    let c = tiny();
    let (ckpt, state) = checkpoint(&dir.path().join("ckpts"), &c, 5);
    let hf = dir.path().join("hf");
    export_hf(&ckpt, &c, &ExportOptions::default(), &hf).unwrap();
    let bytes = fs::read(hf.join("model.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let ours = fs::read(ckpt.join("model.safetensors")).unwrap();
    let ours = SafeTensors::deserialize(&ours).unwrap();
    let at = |v: &TensorView<'_>, i: usize| {
        f32::from_le_bytes(v.data()[4 * i..4 * i + 4].try_into().unwrap())
    };
    // Experts stacked: gate_up [experts, 2F, hidden], expert 2's [o][i] = ours [i][o].
    let gate_up = st
        .tensor("model.layers.1.mlp.experts.gate_up_proj")
        .unwrap();
    assert_eq!(gate_up.shape(), [3, 12, 8]);
    let fc1 = ours
        .tensor("blocks.1.moe.local_experts.2.linear_fc1.weight")
        .unwrap();
    assert_eq!(fc1.shape(), [8, 12]);
    assert_eq!(
        at(&gate_up, 2 * 96 + 7 * 8 + 3).to_bits(),
        at(&fc1, 3 * 12 + 7).to_bits()
    );
    assert_eq!(
        st.tensor("model.layers.0.mlp.experts.down_proj")
            .unwrap()
            .shape(),
        [3, 8, 6]
    );
    // Block 1's pre-attention scaling is layer 0's post-MLP one; block 0's gates the embeddings.
    assert_eq!(
        st.tensor("model.layers.0.post_mlp_residual_scale.residual_bias")
            .unwrap()
            .data(),
        ours.tensor("blocks.1.attn_res_scale.residual_bias")
            .unwrap()
            .data()
    );
    assert!(st.tensor("model.input_hidden_states_scale").is_ok());
    assert!(st.names().iter().all(|n| !n.contains("zaya_block")));
    // The biases, shifted so that the skip bias is -1.0 (transformers' loader sets it so).
    let b = st
        .tensor("model.layers.1.mlp.gate.balancing_biases")
        .unwrap();
    let exported: Vec<f32> = (0..4).map(|i| at(&b, i)).collect();
    let trained = &state.balance[1].biases;
    assert_eq!(exported[3], -1.0);
    for i in 0..3 {
        let (d_out, d_in) = (exported[i] - exported[3], trained[i] - trained[3]);
        assert!((d_out - d_in).abs() < 1e-6, "route {i}: {d_out} vs {d_in}");
    }
    let config: Value = serde_json::from_slice(&fs::read(hf.join("config.json")).unwrap()).unwrap();
    assert_eq!(config["layer_types"], json!(["hybrid", "hybrid"]));
    assert_eq!(
        config["rope_parameters"]["hybrid"]["rope_theta"],
        json!(5.0e5)
    );
    assert_eq!(config["moe_intermediate_size"], json!(6));
    assert_eq!(config["zflow_skip_output"], json!("zero"));

    // Imported: the trainer's bytes; exported again: the same folder.
    let back = dir.path().join("back");
    assert_eq!(import_hf(&hf, &back).unwrap(), c);
    assert_eq!(
        fs::read(back.join("model.safetensors")).unwrap(),
        fs::read(ckpt.join("model.safetensors")).unwrap()
    );
    let again = dir.path().join("again");
    export_hf(&back, &c, &ExportOptions::default(), &again).unwrap();
    for f in ["config.json", "model.safetensors"] {
        assert_eq!(
            fs::read(hf.join(f)).unwrap(),
            fs::read(again.join(f)).unwrap(),
            "{f}"
        );
    }
    // transformers' ZAYA has no switch for a model without EDA: refused, naming the field.
    let no_eda = ModelConfig { eda: false, ..c };
    let e = format!(
        "{:#}",
        export_hf(
            &ckpt,
            &no_eda,
            &ExportOptions::default(),
            &dir.path().join("x")
        )
        .unwrap_err()
    );
    assert!(
        e.contains("model.eda") && e.contains("--layout legacy"),
        "{e}"
    );
}

#[test]
fn bf16_weights_import_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let c = tiny();
    let (ckpt, _) = checkpoint(&dir.path().join("ckpts"), &c, 4);
    let hf = dir.path().join("hf");
    export_hf(&ckpt, &c, &legacy(), &hf).unwrap();
    // Rewrite the export in bf16, as the released ZAYA1-base is.
    let bytes = fs::read(hf.join("model.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let halves: Vec<(String, Vec<usize>, Vec<u8>)> = st
        .tensors()
        .into_iter()
        .map(|(n, v)| {
            let b = v
                .data()
                .chunks_exact(4)
                .flat_map(|x| {
                    half::bf16::from_f32(f32::from_le_bytes(x.try_into().unwrap())).to_le_bytes()
                })
                .collect();
            (n, v.shape().to_vec(), b)
        })
        .collect();
    let views: Vec<(&str, TensorView<'_>)> = halves
        .iter()
        .map(|(n, s, d)| {
            (
                n.as_str(),
                TensorView::new(Dtype::BF16, s.clone(), d).unwrap(),
            )
        })
        .collect();
    fs::write(
        hf.join("model.safetensors"),
        safetensors::serialize(views, None).unwrap(),
    )
    .unwrap();

    let back = dir.path().join("back");
    import_hf(&hf, &back).unwrap();
    let got = fs::read(back.join("model.safetensors")).unwrap();
    let got = SafeTensors::deserialize(&got).unwrap();
    let embed = got.tensor("embed_tokens").unwrap();
    let (_, _, want) = halves
        .iter()
        .find(|(n, _, _)| n == "model.embed_tokens.weight")
        .unwrap();
    let widened: Vec<u8> = want
        .chunks_exact(2)
        .flat_map(|x| {
            (f32::from_bits(u32::from(u16::from_le_bytes([x[0], x[1]])) << 16)).to_le_bytes()
        })
        .collect();
    assert_eq!(embed.dtype(), Dtype::F32);
    assert_eq!(embed.data(), widened.as_slice());
}

/// Rewrites the export's `model.safetensors` through `edit` (name -> tensor).
fn edit_weights(hf: &Path, edit: impl FnOnce(&mut BTreeMap<String, (Vec<usize>, Vec<u8>)>)) {
    let bytes = fs::read(hf.join("model.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let mut map: BTreeMap<String, (Vec<usize>, Vec<u8>)> = st
        .tensors()
        .into_iter()
        .map(|(n, v)| (n, (v.shape().to_vec(), v.data().to_vec())))
        .collect();
    edit(&mut map);
    let views: Vec<(&str, TensorView<'_>)> = map
        .iter()
        .map(|(n, (s, d))| {
            (
                n.as_str(),
                TensorView::new(Dtype::F32, s.clone(), d).unwrap(),
            )
        })
        .collect();
    fs::write(
        hf.join("model.safetensors"),
        safetensors::serialize(views, None).unwrap(),
    )
    .unwrap();
}

fn import_error(hf: &Path, out: &Path) -> String {
    let e = format!("{:#}", import_hf(hf, out).unwrap_err());
    assert!(!out.exists(), "a failed import left {}", out.display());
    e
}

#[test]
fn import_names_what_is_wrong() {
    let dir = tempfile::tempdir().unwrap();
    let c = tiny();
    let (ckpt, _) = checkpoint(&dir.path().join("ckpts"), &c, 5);
    let hf = dir.path().join("hf");
    export_hf(&ckpt, &c, &legacy(), &hf).unwrap();
    let out = dir.path().join("out");
    let expert = "model.layers.1.zaya_block.experts.local_experts.2.linear_fc2.weight";

    edit_weights(&hf, |m| {
        m.remove(expert);
    });
    let e = import_error(&hf, &out);
    assert!(e.contains(&format!("tensor `{expert}` is missing")), "{e}");

    edit_weights(&hf, |m| {
        m.insert(expert.into(), (vec![8, 5], vec![0; 160]));
    });
    let e = import_error(&hf, &out);
    assert!(
        e.contains(&format!(
            "tensor `{expert}` is [8, 5], config.json implies [8, 6]"
        )),
        "{e}"
    );

    edit_weights(&hf, |m| {
        m.insert(expert.into(), (vec![8, 6], vec![0; 192]));
        m.insert(
            "model.layers.1.mlp.gate.weight".into(),
            (vec![2], vec![0; 8]),
        );
    });
    let e = import_error(&hf, &out);
    assert!(
        e.contains("unexpected tensor `model.layers.1.mlp.gate.weight`"),
        "{e}"
    );

    let config_path = hf.join("config.json");
    let good = fs::read(&config_path).unwrap();
    let mut v: Value = serde_json::from_slice(&good).unwrap();
    v["hidden_size"] = json!("big");
    fs::write(&config_path, serde_json::to_vec(&v).unwrap()).unwrap();
    let e = import_error(&hf, &out);
    assert!(
        e.contains("config.json: `hidden_size`: expected a non-negative integer, found \"big\""),
        "{e}"
    );
    let mut v: Value = serde_json::from_slice(&good).unwrap();
    v.as_object_mut().unwrap().remove("num_experts");
    fs::write(&config_path, serde_json::to_vec(&v).unwrap()).unwrap();
    let e = import_error(&hf, &out);
    assert!(e.contains("config.json: `num_experts`: missing"), "{e}");
    let mut v: Value = serde_json::from_slice(&good).unwrap();
    v["attention_bias"] = json!(true);
    fs::write(&config_path, serde_json::to_vec(&v).unwrap()).unwrap();
    let e = import_error(&hf, &out);
    assert!(e.contains("`attention_bias`: true is not supported"), "{e}");
}

#[test]
fn sharded_folders_and_a_saved_tied_head_import() {
    let dir = tempfile::tempdir().unwrap();
    let c = tiny();
    let (ckpt, _) = checkpoint(&dir.path().join("ckpts"), &c, 8);
    let hf = dir.path().join("hf");
    export_hf(&ckpt, &c, &legacy(), &hf).unwrap();
    // Two shards and an index, as `save_pretrained` writes big models, plus the tied head.
    let bytes = fs::read(hf.join("model.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let mut tensors: Vec<(String, TensorView<'_>)> = st.tensors();
    let embed = st.tensor("model.embed_tokens.weight").unwrap();
    tensors.push(("lm_head.weight".into(), embed.clone()));
    let (a, b) = tensors.split_at(tensors.len() / 2);
    let mut weight_map = Map::new();
    for (file, part) in [
        ("model-00001-of-00002.safetensors", a),
        ("model-00002-of-00002.safetensors", b),
    ] {
        fs::write(
            hf.join(file),
            safetensors::serialize(part.iter().map(|(n, v)| (n.as_str(), v.clone())), None)
                .unwrap(),
        )
        .unwrap();
        weight_map.extend(part.iter().map(|(n, _)| (n.clone(), json!(file))));
    }
    fs::write(
        hf.join("model.safetensors.index.json"),
        serde_json::to_vec(&json!({"weight_map": weight_map})).unwrap(),
    )
    .unwrap();
    fs::remove_file(hf.join("model.safetensors")).unwrap();
    let back = dir.path().join("back");
    import_hf(&hf, &back).unwrap();
    assert_eq!(
        fs::read(back.join("model.safetensors")).unwrap(),
        fs::read(ckpt.join("model.safetensors")).unwrap()
    );

    // An untied head is refused.
    let mut head = embed.data().to_vec();
    head[0] ^= 1;
    let shard = hf.join("model-00002-of-00002.safetensors");
    let part = fs::read(&shard).unwrap();
    let part = SafeTensors::deserialize(&part).unwrap();
    let mut rest: Vec<(String, TensorView<'_>)> = part
        .tensors()
        .into_iter()
        .filter(|(n, _)| n != "lm_head.weight")
        .collect();
    rest.push((
        "lm_head.weight".into(),
        TensorView::new(Dtype::F32, embed.shape().to_vec(), &head).unwrap(),
    ));
    fs::write(&shard, safetensors::serialize(rest, None).unwrap()).unwrap();
    let e = import_error(&hf, &dir.path().join("again"));
    assert!(
        e.contains("`lm_head.weight` differs from the embedding"),
        "{e}"
    );
}

#[test]
fn export_refuses_damaged_checkpoints_and_existing_folders() {
    let dir = tempfile::tempdir().unwrap();
    let c = tiny();
    let (ckpt, _) = checkpoint(&dir.path().join("ckpts"), &c, 6);
    let hf = dir.path().join("hf");
    fs::create_dir(&hf).unwrap();
    fs::write(hf.join("keep.txt"), "mine").unwrap();
    let e = format!("{:#}", export_hf(&ckpt, &c, &legacy(), &hf).unwrap_err());
    assert!(e.contains("already exists"), "{e}");
    assert_eq!(fs::read_to_string(hf.join("keep.txt")).unwrap(), "mine");

    // The wrong model config: named, not silently reshaped.
    let wide = ModelConfig {
        expert_ffn: 8,
        ..c.clone()
    };
    let e = format!(
        "{:#}",
        export_hf(&ckpt, &wide, &legacy(), &dir.path().join("x")).unwrap_err()
    );
    assert!(
        e.contains("linear_fc1.weight` is F32 [8, 12], the model config implies F32 [8, 16]"),
        "{e}"
    );
    let e = format!(
        "{:#}",
        export_hf(
            &ckpt,
            &ModelConfig {
                router_mlp_layers: 2,
                ..c.clone()
            },
            &legacy(),
            &dir.path().join("x")
        )
        .unwrap_err()
    );
    assert!(e.contains("router_mlp_layers is 2"), "{e}");

    let path = ckpt.join("model.safetensors");
    let mut bytes = fs::read(&path).unwrap();
    let n = bytes.len();
    bytes[n - 1] ^= 1;
    fs::write(&path, bytes).unwrap();
    let out = dir.path().join("out");
    let e = format!("{:#}", export_hf(&ckpt, &c, &legacy(), &out).unwrap_err());
    assert!(
        e.contains("refusing to export a damaged checkpoint") && e.contains("checksum mismatch"),
        "{e}"
    );
    assert!(!out.exists());
    assert!(
        fs::read_dir(dir.path())
            .unwrap()
            .flatten()
            .all(|e| !e.file_name().to_string_lossy().contains(".tmp-"))
    );
}

#[test]
fn tokenizer_files_and_special_ids() {
    let dir = tempfile::tempdir().unwrap();
    let c = tiny();
    let (ckpt, _) = checkpoint(&dir.path().join("ckpts"), &c, 7);
    let tok = dir.path().join("tok");
    fs::create_dir(&tok).unwrap();
    let tokenizer = json!({
        "added_tokens": [{"id": 0, "content": "<pad>"}, {"id": 1, "content": "<eos>"}, {"id": 2, "content": "<bos>"}],
        "model": {"type": "BPE", "vocab": {"<pad>": 0, "<eos>": 1, "<bos>": 2, "a": 3, "b": 4}}
    });
    fs::write(
        tok.join("tokenizer.json"),
        serde_json::to_vec(&tokenizer).unwrap(),
    )
    .unwrap();
    let hf = dir.path().join("hf");
    let opts = ExportOptions {
        tokenizer: Some(tok.clone()),
        max_position_embeddings: 256,
        layout: Layout::Legacy,
    };
    export_hf(&ckpt, &c, &opts, &hf).unwrap();
    let read = |f: &str| serde_json::from_slice::<Value>(&fs::read(hf.join(f)).unwrap()).unwrap();
    let config = read("config.json");
    assert_eq!(
        (
            config["bos_token_id"].as_u64(),
            config["eos_token_id"].as_u64(),
            config["pad_token_id"].as_u64()
        ),
        (Some(2), Some(1), Some(0))
    );
    assert_eq!(config["max_position_embeddings"].as_u64(), Some(256));
    assert_eq!(
        fs::read(hf.join("tokenizer.json")).unwrap(),
        fs::read(tok.join("tokenizer.json")).unwrap()
    );
    assert_eq!(
        read("special_tokens_map.json"),
        json!({"bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>"})
    );
    assert_eq!(
        read("tokenizer_config.json")["tokenizer_class"],
        "PreTrainedTokenizerFast"
    );

    // A tokenizer stage's tokenizer_info.json names the ids.
    fs::write(
        tok.join("tokenizer_info.json"),
        r#"{"vocab_size": 5, "bos_id": 1, "eos_id": 2, "pad_id": 0, "dtype": "u16"}"#,
    )
    .unwrap();
    let hf2 = dir.path().join("hf2");
    export_hf(
        &ckpt,
        &c,
        &ExportOptions {
            tokenizer: Some(tok.clone()),
            ..legacy()
        },
        &hf2,
    )
    .unwrap();
    let config: Value =
        serde_json::from_slice(&fs::read(hf2.join("config.json")).unwrap()).unwrap();
    assert_eq!(
        (
            config["bos_token_id"].as_u64(),
            config["eos_token_id"].as_u64()
        ),
        (Some(1), Some(2))
    );

    // A tokenizer bigger than the vocabulary is someone else's.
    let mut big = tokenizer.clone();
    big["model"]["vocab"]["z"] = json!(40);
    fs::write(
        tok.join("tokenizer.json"),
        serde_json::to_vec(&big).unwrap(),
    )
    .unwrap();
    let e = format!(
        "{:#}",
        export_hf(&ckpt, &c, &opts, &dir.path().join("hf3")).unwrap_err()
    );
    assert!(
        e.contains("41 tokens, more than the model's vocabulary of 11"),
        "{e}"
    );
}

#[test]
fn reads_the_released_per_layer_config_form() {
    // The older ZayaConfig form: `num_attention_heads` counts uncompressed heads (16), the
    // CCA query heads are `cca_num_q_heads`, per-layer lists, no `head_dim`.
    let mut layers = Vec::new();
    for _ in 0..40 {
        layers.push(json!("a"));
        layers.push(json!(16));
    }
    let pairs = |a: u64, b: u64| (0..40).flat_map(|_| [a, b]).collect::<Vec<_>>();
    let v = json!({
        "model_type": "zaya", "architectures": ["ZayaForCausalLM"],
        "hidden_size": 2048, "vocab_size": 262272, "num_hidden_layers": 120,
        "zaya_layers": layers, "num_attention_heads": 16,
        "cca_num_q_heads": pairs(8, 0), "num_query_groups_list": pairs(2, 0),
        "ffn_hidden_size_list": pairs(0, 4096), "zaya_mlp_expansion": pairs(0, 256),
        "num_key_value_heads": 2, "rope_theta": 10000, "partial_rotary_factor": 0.5,
        "norm_epsilon": 1e-5, "zaya_use_mod": true, "zaya_use_eda": true, "scale_residual_merge": true,
        "tie_word_embeddings": true, "moe_router_topk": 1, "sliding_window": null, "rope_scaling": null
    });
    // A legacy folder that does not state its skip semantics has the older branch's.
    assert_eq!(
        model_config_from_hf(&v, Path::new("config.json")).unwrap(),
        ModelConfig {
            skip_output: SkipOutput::Input,
            ..ModelConfig::zaya1_base()
        }
    );
    // And the scalar form this module writes reads back as the same model.
    let specials = Specials::default();
    // transformers' form with one flat set of RoPE parameters (no layer types).
    let flat = json!({
        "model_type": "zaya", "moe_intermediate_size": 2048,
        "rope_parameters": {"rope_type": "default", "rope_theta": 5e6, "partial_rotary_factor": 0.5}
    });
    let read = model_config_from_hf(&flat, Path::new("config.json")).unwrap();
    assert_eq!((read.rope_base, read.expert_ffn), (5e6, 2048));
    let c = ModelConfig::zaya1_base();
    for layout in [Layout::Legacy, Layout::Transformers] {
        for skip_output in [SkipOutput::Zero, SkipOutput::Input] {
            let c = ModelConfig {
                skip_output,
                ..c.clone()
            };
            let config = hf_config(&c, layout, 4096, &specials);
            assert_eq!(Layout::of_config(&config), layout);
            assert_eq!(
                model_config_from_hf(&config, Path::new("config.json")).unwrap(),
                c,
                "{layout}"
            );
        }
    }
}
