//! `zflow ckpt export --format hf` and `zflow ckpt import` through the real binary, on a
//! checkpoint of a small random ZAYA1 laid out as a train stage leaves it (`final/` next to
//! `job.json`): the round trip gives back the same weight bytes and routing biases, and damaged
//! or incomplete inputs are refused with errors that say why.

mod common;

use std::collections::BTreeMap;
use std::path::Path;

use common::Sandbox;
use zflow_runtime::checkpoint::{TrainerState, commit, weights_to_safetensors};
use zflow_runtime::contract::balance::BalanceState;
use zflow_runtime::data::mixture::DataCursor;
use zflow_runtime::model::config::ModelConfig;

fn tiny() -> ModelConfig {
    ModelConfig {
        hidden_size: 16,
        num_blocks: 2,
        vocab_size: 40,
        num_query_heads: 2,
        num_kv_heads: 1,
        head_dim: 8,
        num_experts: 3,
        expert_ffn: 12,
        router_dim: 8,
        // Not the default: the export must take it from the job's model.
        rope_base: 1.0e6,
        ..ModelConfig::default()
    }
}

/// `<sandbox>/train.p1/final/` (a committed checkpoint without model.json) and
/// `<sandbox>/train.p1/job.json`, as a train stage leaves them. Returns the routing biases.
fn train_stage_output(sb: &Sandbox) -> Vec<Vec<f32>> {
    let c = tiny();
    let weights = zflow_runtime::model::random_weights(&c, 11, 0.1);
    let routes = c.num_experts + usize::from(c.mod_skip);
    let balance: Vec<BalanceState> = (0..c.num_blocks)
        .map(|l| {
            let mut b = BalanceState::new(routes, c.mod_skip);
            b.biases
                .iter_mut()
                .enumerate()
                .for_each(|(r, v)| *v += 0.01 * (l * routes + r) as f32);
            b
        })
        .collect();
    let biases = balance.iter().map(|b| b.biases.clone()).collect();
    let state = TrainerState {
        phase: "p1".into(),
        step: 3,
        total_steps: 3,
        cursor: DataCursor {
            phase: "p1".into(),
            sample: 12,
            fingerprint: "abc".into(),
        },
        balance,
        tokens: 96,
        seed: 11,
        loss_history: Vec::new(),
        skipped_batches: Vec::new(),
        rollbacks: 0,
    };
    let meta = BTreeMap::from([("format".to_string(), "zflow-zaya1".to_string())]);
    let files = vec![
        (
            "model.safetensors".to_string(),
            weights_to_safetensors(&weights, meta).unwrap(),
        ),
        (
            "trainer.json".to_string(),
            serde_json::to_vec_pretty(&state).unwrap(),
        ),
    ];
    let stage = sb.path().join("train.p1");
    let dir = commit(&stage.join("checkpoints"), 3, files).unwrap();
    std::fs::rename(dir, stage.join("final")).unwrap();
    std::fs::write(
        stage.join("job.json"),
        serde_json::to_vec_pretty(&serde_json::json!({"phase": "p1", "model": c})).unwrap(),
    )
    .unwrap();
    biases
}

fn biases(checkpoint: &Path) -> Vec<Vec<f32>> {
    let state: TrainerState =
        serde_json::from_slice(&std::fs::read(checkpoint.join("trainer.json")).unwrap()).unwrap();
    state.balance.into_iter().map(|b| b.biases).collect()
}

#[test]
fn export_then_import_round_trips_bit_for_bit() {
    round_trip("legacy");
}

#[test]
fn export_then_import_round_trips_bit_for_bit_in_the_transformers_layout() {
    round_trip("transformers");
}

/// `zflow ckpt export --layout LAYOUT`, then `zflow ckpt import`: the same weights and routing.
fn round_trip(layout: &str) {
    let sb = Sandbox::new();
    let want = train_stage_output(&sb);
    let out = sb.ok(&[
        "ckpt",
        "export",
        "--format",
        "hf",
        "--layout",
        layout,
        "train.p1/final",
        "hf",
    ]);
    assert!(out.stdout.contains("exported"), "{}", out.stdout);
    let config: serde_json::Value = serde_json::from_str(&sb.read("hf/config.json")).unwrap();
    assert_eq!(config["model_type"], "zaya");
    assert_eq!(config["architectures"][0], "ZayaForCausalLM");
    if layout == "legacy" {
        assert_eq!(config["rope_theta"], 1.0e6);
        assert_eq!(config["num_hidden_layers"], 4);
    } else {
        assert_eq!(config["rope_parameters"]["hybrid"]["rope_theta"], 1.0e6);
        assert_eq!(config["num_hidden_layers"], 2);
    }

    sb.ok(&["ckpt", "import", "hf", "back"]);
    let read = |p: &str| std::fs::read(sb.path().join(p)).unwrap();
    assert_eq!(
        read("back/model.safetensors"),
        read("train.p1/final/model.safetensors"),
        "weights changed on the way"
    );
    let got = biases(&sb.path().join("back"));
    if layout == "legacy" {
        assert_eq!(got, want);
    } else {
        // Shifted so that the skip bias is -1.0 (transformers' loader sets it so); the
        // differences, which are all routing reads, stay.
        for (g, w) in got.iter().zip(&want) {
            assert_eq!(*g.last().unwrap(), -1.0);
            for r in 0..g.len() {
                let (dg, dw) = (g[r] - g[0], w[r] - w[0]);
                assert!((dg - dw).abs() < 1e-6, "{got:?} vs {want:?}");
            }
        }
    }
    let inspect = sb.ok(&["ckpt", "inspect", "back"]);
    assert!(
        inspect.stdout.contains("manifest verified"),
        "{}",
        inspect.stdout
    );
    // The imported checkpoint carries its model.json: it exports again without help, to the
    // same bytes.
    sb.ok(&["ckpt", "export", "--layout", layout, "back", "hf2"]);
    assert_eq!(read("hf2/model.safetensors"), read("hf/model.safetensors"));
    assert_eq!(read("hf2/config.json"), read("hf/config.json"));
}

#[test]
fn damaged_or_unknown_inputs_are_refused() {
    let sb = Sandbox::new();
    train_stage_output(&sb);

    let bad = sb.zflow(&[
        "ckpt",
        "export",
        "--format",
        "onnx",
        "train.p1/final",
        "out",
    ]);
    assert_ne!(bad.code, 0);
    assert!(
        bad.stderr.contains("onnx") && bad.stderr.contains("hf"),
        "{}",
        bad.stderr
    );

    // Without model.json or job.json the sizes are unknown; a recipe supplies them.
    std::fs::create_dir(sb.path().join("lonely")).unwrap();
    std::fs::rename(
        sb.path().join("train.p1/final"),
        sb.path().join("lonely/final"),
    )
    .unwrap();
    let e = sb.zflow(&["ckpt", "export", "lonely/final", "out"]);
    assert_eq!(e.code, 1);
    assert!(
        e.stderr.contains("no model.json") && e.stderr.contains("--recipe"),
        "{}",
        e.stderr
    );
    let model = serde_json::to_string(&tiny()).unwrap();
    sb.write("r.yaml", &format!("name: r\nmodel: {model}\n"));
    sb.ok(&[
        "ckpt",
        "export",
        "--recipe",
        "r.yaml",
        "lonely/final",
        "out",
    ]);

    // A flipped byte: refused, and nothing is left behind.
    let path = sb.path().join("lonely/final/model.safetensors");
    let mut bytes = std::fs::read(&path).unwrap();
    let n = bytes.len();
    bytes[n - 5] ^= 0x40;
    std::fs::write(&path, bytes).unwrap();
    let e = sb.zflow(&[
        "ckpt",
        "export",
        "--recipe",
        "r.yaml",
        "lonely/final",
        "out2",
    ]);
    assert_eq!(e.code, 1);
    assert!(
        e.stderr.contains("refusing to export a damaged checkpoint")
            && e.stderr.contains("checksum mismatch"),
        "{}",
        e.stderr
    );
    assert!(!sb.path().join("out2").exists());

    // A config.json with a field of the wrong type: the file and the field are named.
    let config = sb.path().join("out/config.json");
    let text = std::fs::read_to_string(&config)
        .unwrap()
        .replace("\"hidden_size\": 16", "\"hidden_size\": \"16\"");
    std::fs::write(&config, &text).unwrap();
    let e = sb.zflow(&["ckpt", "import", "out", "back"]);
    assert_eq!(e.code, 1);
    assert!(
        e.stderr
            .contains("config.json: `hidden_size`: expected a non-negative integer"),
        "{}",
        e.stderr
    );
    assert!(!sb.path().join("back").exists());

    // Hostile sizes: each is checked against the tensors present, in checked arithmetic, and
    // refused with the file named (it was an allocation abort, and a multiply overflow).
    let original: serde_json::Value =
        serde_json::from_str(&text.replace("\"hidden_size\": \"16\"", "\"hidden_size\": 16"))
            .unwrap();
    let huge = 1u64 << 33;
    for (fields, says) in [
        (
            vec![("num_hidden_layers", 200_000_000u64)],
            "but the safetensors hold only",
        ),
        (
            vec![
                ("num_attention_heads", huge),
                ("num_key_value_heads", huge),
                ("head_dim", huge),
            ],
            "config.json",
        ),
        (vec![("vocab_size", huge)], "values in all"),
    ] {
        let mut v = original.clone();
        // Without the per-layer list, the layer count stands alone (as in older folders).
        v.as_object_mut().unwrap().remove("layer_types");
        for (field, value) in &fields {
            v[*field] = serde_json::json!(value);
        }
        std::fs::write(&config, serde_json::to_vec(&v).unwrap()).unwrap();
        let e = sb.zflow(&["ckpt", "import", "out", "back"]);
        assert_eq!(e.code, 1, "{fields:?}: {}", e.stderr);
        assert!(e.stderr.contains(says), "{fields:?}: {}", e.stderr);
        assert!(!sb.path().join("back").exists());
    }
}

#[test]
fn the_export_stage_leaves_a_hugging_face_folder() {
    // A stand-in for a train stage (a shell stage that leaves `final/` and the `job.json` beside
    // it, whose model the checkpoint was trained with), then `export`.
    let sb = Sandbox::new();
    train_stage_output(&sb);
    let final_dir = sb.path().join("train.p1/final");
    sb.write(
        "export.yaml",
        &format!(
            "name: export-test\nstages:\n  - name: trained\n    kind: shell\n    run: cp -r {} {} \"$ZFLOW_OUT/\"\n  \
             - name: export\n    kind: export\n    needs: [trained]\n    format: hf\n    train: trained\n    max_position_embeddings: 64\n",
            final_dir.display(),
            sb.path().join("train.p1/job.json").display()
        ),
    );
    sb.ok(&["run", "export.yaml"]);
    let hf = sb.output("export").join("hf");
    let config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(hf.join("config.json")).unwrap()).unwrap();
    assert_eq!(config["max_position_embeddings"], 64);
    sb.ok(&["ckpt", "import", hf.to_str().unwrap(), "back"]);
    assert_eq!(
        std::fs::read(sb.path().join("back/model.safetensors")).unwrap(),
        std::fs::read(final_dir.join("model.safetensors")).unwrap()
    );
}
