//! The Hugging Face export against an independent forward pass: `tests/hf_reference.py`
//! (standard library only) is written from the reference implementation's code and reads the
//! exported folder by the reference's names, layouts and config fields. Its logits must match
//! zflow's own forward pass on the checkpoint that was exported: a wrong name, a missing
//! transpose (the router MLP's matrices are square, so shapes alone would not catch one), a
//! misplaced bias or a wrong config field shows up as different logits.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use burn::tensor::{Int, Tensor, TensorData};
use burn_flex::Flex;
use safetensors::SafeTensors;
use safetensors::tensor::TensorView;
use zflow_runtime::checkpoint::{TrainerState, commit, load_weights, weights_to_safetensors};
use zflow_runtime::data::mixture::DataCursor;
use zflow_runtime::hf::{ExportOptions, export_hf};
use zflow_runtime::model::Zaya;
use zflow_runtime::model::config::{ModelConfig, SkipOutput};
use zflow_runtime::trainer::balance::BalanceState;

fn config() -> ModelConfig {
    ModelConfig {
        hidden_size: 16,
        num_blocks: 2,
        vocab_size: 13,
        num_query_heads: 4,
        num_kv_heads: 2,
        head_dim: 4,
        num_experts: 3,
        expert_ffn: 6,
        router_dim: 8,
        ..ModelConfig::default()
    }
}

/// A deterministic value in [-1, 1) for index `i` of tensor number `t`.
fn noise(t: usize, i: usize) -> f32 {
    let mut s = (t as u64) << 32 ^ i as u64 ^ 0x9e37_79b9_7f4a_7c15;
    s = (s ^ (s >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    s = (s ^ (s >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    s ^= s >> 31;
    (s >> 40) as f32 / (1u64 << 23) as f32 - 1.0
}

#[test]
fn exported_folder_gives_the_same_logits_in_a_reference_forward_pass() {
    reference_forward(SkipOutput::Input);
}

#[test]
fn with_a_zero_skip_output_too() {
    reference_forward(SkipOutput::Zero);
}

/// The legacy export of a random model with skip semantics `skip_output`, against the
/// reference forward pass.
fn reference_forward(skip_output: SkipOutput) {
    let c = ModelConfig {
        skip_output,
        ..config()
    };
    let device = Default::default();
    // Every tensor perturbed, so norms, gates, biases and temperatures are not their 0/1 init
    // and a mix-up between any two of them changes the output.
    let init = Zaya::<Flex>::new(&c, 21, &device);
    let meta = || BTreeMap::from([("format".to_string(), "zflow-zaya1".to_string())]);
    let bytes = weights_to_safetensors(&init, meta()).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let mut perturbed: Vec<(String, Vec<usize>, Vec<u8>)> = Vec::new();
    // By name: `tensors()` comes in hash-map order, and the noise must not change between runs.
    let mut tensors = st.tensors();
    tensors.sort_by(|a, b| a.0.cmp(&b.0));
    for (t, (name, view)) in tensors.into_iter().enumerate() {
        let data = view
            .data()
            .chunks_exact(4)
            .enumerate()
            .flat_map(|(i, b)| {
                (f32::from_le_bytes(b.try_into().unwrap()) + noise(t, i)).to_le_bytes()
            })
            .collect();
        perturbed.push((name, view.shape().to_vec(), data));
    }
    let views: Vec<(&str, TensorView<'_>)> = perturbed
        .iter()
        .map(|(n, s, d)| {
            (
                n.as_str(),
                TensorView::new(safetensors::Dtype::F32, s.clone(), d).unwrap(),
            )
        })
        .collect();
    let weights = safetensors::serialize(views, Some(meta().into_iter().collect())).unwrap();
    let mut model = load_weights(
        Zaya::<Flex>::new(&c, 1, &device),
        &weights,
        Path::new("perturbed"),
    )
    .unwrap();
    let rope_base = 20_000.0;
    model.options.rope_base = rope_base;

    // Small biases that steer some choices (this seed sends tokens to every route).
    let routes = model.routes();
    let balance: Vec<BalanceState> = (0..c.num_blocks)
        .map(|l| BalanceState {
            biases: (0..routes).map(|r| 0.1 * noise(99 + l, r)).collect(),
            ..BalanceState::new(routes, true)
        })
        .collect();
    let biases: Vec<Vec<f32>> = balance.iter().map(|b| b.biases.clone()).collect();
    let tokens = [1i64, 5, 3, 7, 2, 12, 0, 9, 4, 4, 11, 6, 8, 10, 1, 3];
    let input = Tensor::<Flex, 2, Int>::from_data(
        TensorData::new(tokens.to_vec(), [1, tokens.len()]),
        &device,
    );
    let (logits, routing) = model.logits(input, &biases);
    let ours: Vec<f32> = logits.into_data().convert::<f32>().into_vec().unwrap();

    let dir = tempfile::tempdir().unwrap();
    let state = TrainerState {
        phase: "p".into(),
        step: 1,
        total_steps: 1,
        cursor: DataCursor {
            phase: "p".into(),
            sample: 0,
            fingerprint: String::new(),
        },
        balance,
        tokens: 0,
        seed: 21,
        legacy_rope_base: None,
        loss_history: Vec::new(),
        skipped_batches: Vec::new(),
        rollbacks: 0,
    };
    let files = vec![
        ("model.safetensors".to_string(), weights),
        (
            "trainer.json".to_string(),
            serde_json::to_vec(&state).unwrap(),
        ),
    ];
    let ckpt = commit(&dir.path().join("ckpts"), 1, files).unwrap();
    let hf = dir.path().join("hf");
    export_hf(
        &ckpt,
        &ModelConfig {
            rope_base,
            ..c.clone()
        },
        &ExportOptions {
            layout: zflow_runtime::hf::Layout::Legacy,
            ..Default::default()
        },
        &hf,
    )
    .unwrap();

    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/hf_reference.py");
    let out = Command::new("python3")
        .arg(&script)
        .arg(&hf)
        .arg(serde_json::to_string(&tokens).unwrap())
        .output()
        .expect("this test needs python3 on PATH");
    assert!(
        out.status.success(),
        "{} failed: {}",
        script.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let theirs: Vec<f64> = v["logits"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|row| row.as_array().unwrap().iter().map(|x| x.as_f64().unwrap()))
        .collect();
    let choices: Vec<Vec<u64>> = serde_json::from_value(v["choices"].clone()).unwrap();

    // The same routes, per MoE layer...
    for (layer, counts) in routing.counts.iter().enumerate() {
        let mut theirs = vec![0u64; routes];
        for &r in &choices[layer] {
            theirs[r as usize] += 1;
        }
        assert_eq!(counts, &theirs, "MoE layer {layer}: tokens per route");
    }
    assert!(
        (0..routes).all(|r| routing.counts.iter().any(|c| c[r] > 0)),
        "every expert and the skip route should see tokens: {:?}",
        routing.counts
    );
    // ...and the same logits (f32 against float64).
    assert_eq!(ours.len(), theirs.len());
    let worst = ours
        .iter()
        .zip(&theirs)
        .map(|(a, b)| (*a as f64 - b).abs())
        .fold(0.0, f64::max);
    let scale = theirs.iter().map(|b| b.abs()).fold(0.0, f64::max);
    eprintln!(
        "max |logit difference| {worst:.2e} (largest logit {scale:.2}); tokens per route {:?}",
        routing.counts
    );
    assert!(
        worst < 1e-4 * scale.max(1.0),
        "logits differ by up to {worst}"
    );
}
