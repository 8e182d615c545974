//! Gradient checks of ZAYA1's custom pieces against central finite differences on tiny shapes:
//! the CCA convolution path, the QK-mean skip, the time-shifted value head, the router (EDA +
//! MLP + softmax), residual scaling, and the whole model's loss.

use burn::backend::Autodiff;
use burn::module::Param;
use burn::tensor::{Tensor, TensorData};
use burn_flex::Flex;
use zflow_runtime::model::config::ModelConfig;
use zflow_runtime::model::{Zaya, causal_conv, shift_right};

type B = Autodiff<Flex>;

/// Deterministic pseudo-random values in [-1, 1].
fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0) as f32
        })
        .collect()
}

fn tensor<const D: usize>(v: Vec<f32>, shape: [usize; D]) -> Tensor<B, D> {
    Tensor::from_data(TensorData::new(v, shape), &Default::default())
}

/// Checks d f / d x for a scalar function of one input by central differences on every element
/// (f32 arithmetic, so the step is large and the tolerance relative).
fn check<const D: usize>(
    name: &str,
    x: Vec<f32>,
    shape: [usize; D],
    f: impl Fn(Tensor<B, D>) -> Tensor<B, 1>,
) {
    let input = tensor(x.clone(), shape).require_grad();
    let out = f(input.clone());
    let grads = out.backward();
    let analytic: Vec<f32> = input
        .grad(&grads)
        .expect("gradient")
        .into_data()
        .into_vec()
        .unwrap();
    let eval = |v: Vec<f32>| -> f64 {
        f(tensor(v, shape)).into_data().into_vec::<f32>().unwrap()[0] as f64
    };
    let eps = 1e-2f32;
    let mut worst = 0.0f64;
    for i in 0..x.len() {
        let mut plus = x.clone();
        plus[i] += eps;
        let mut minus = x.clone();
        minus[i] -= eps;
        let numeric = (eval(plus) - eval(minus)) / (2.0 * eps as f64);
        let a = analytic[i] as f64;
        let err = (a - numeric).abs() / (a.abs().max(numeric.abs()) + 1e-2);
        worst = worst.max(err);
        assert!(
            err < 3e-2,
            "{name}: element {i}: autodiff {a} vs finite difference {numeric}"
        );
    }
    eprintln!(
        "{name}: {} elements, worst relative error {worst:.2e}",
        x.len()
    );
}

/// A fixed random projection to a scalar, so every output element carries a distinct weight.
fn project<const D: usize>(y: Tensor<B, D>, seed: u64) -> Tensor<B, 1> {
    let shape = y.shape();
    let w = Tensor::<B, D>::from_data(
        TensorData::new(values(shape.num_elements(), seed), shape),
        &Default::default(),
    );
    (y * w).sum()
}

#[test]
fn causal_conv_path() {
    // [batch 2, seq 5, channels 6] in 3 groups of 2, kernels 2 and 2, as in ZAYA1.
    let (b, s, c, g) = (2, 5, 6, 3);
    let w0 = tensor(values(c * 2, 1), [c, 1, 2]);
    let b0 = tensor(values(c, 2), [c]);
    let w1 = tensor(values(c * (c / g) * 2, 3), [c, c / g, 2]);
    let b1 = tensor(values(c, 4), [c]);
    check("conv input", values(b * s * c, 5), [b, s, c], |x| {
        project(
            causal_conv(x, w0.clone(), b0.clone(), w1.clone(), b1.clone(), g),
            6,
        )
    });
    let x = tensor(values(b * s * c, 5), [b, s, c]);
    check("conv depthwise weight", values(c * 2, 1), [c, 1, 2], |w| {
        project(
            causal_conv(x.clone(), w, b0.clone(), w1.clone(), b1.clone(), g),
            6,
        )
    });
    check(
        "conv grouped weight",
        values(c * (c / g) * 2, 3),
        [c, c / g, 2],
        |w| {
            project(
                causal_conv(x.clone(), w0.clone(), b0.clone(), w, b1.clone(), g),
                6,
            )
        },
    );
    check("conv depthwise bias", values(c, 2), [c], |bias| {
        project(
            causal_conv(x.clone(), w0.clone(), bias, w1.clone(), b1.clone(), g),
            6,
        )
    });
}

#[test]
fn causal_conv_is_causal_and_matches_a_direct_loop() {
    let (b, s, c, g) = (1, 4, 4, 2);
    let (x, w0, b0, w1, b1) = (
        values(b * s * c, 7),
        values(c * 2, 8),
        values(c, 9),
        values(c * 2 * 2, 10),
        values(c, 11),
    );
    let y: Vec<f32> = causal_conv(
        tensor(x.clone(), [b, s, c]),
        tensor(w0.clone(), [c, 1, 2]),
        tensor(b0.clone(), [c]),
        tensor(w1.clone(), [c, 2, 2]),
        tensor(b1.clone(), [c]),
        g,
    )
    .into_data()
    .into_vec()
    .unwrap();
    // Reference: pad 2 zeros in front, depthwise conv (k=2), grouped conv (k=2), as PyTorch's Conv1d.
    let xp = |t: isize, ch: usize| if t < 0 { 0.0 } else { x[t as usize * c + ch] };
    let z =
        |j: isize, ch: usize| b0[ch] + w0[ch * 2] * xp(j - 2, ch) + w0[ch * 2 + 1] * xp(j - 1, ch);
    for t in 0..s {
        for o in 0..c {
            let group = o / (c / g);
            let mut want = b1[o];
            for i in 0..c / g {
                let ch = group * (c / g) + i;
                want += w1[(o * 2 + i) * 2] * z(t as isize, ch)
                    + w1[(o * 2 + i) * 2 + 1] * z(t as isize + 1, ch);
            }
            let got = y[t * c + o];
            assert!((got - want).abs() < 1e-5, "t={t} o={o}: {got} vs {want}");
        }
    }
}

#[test]
fn value_shift() {
    check("shift_right", values(2 * 4 * 3, 12), [2, 4, 3], |x| {
        project(shift_right(x), 13)
    });
}

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
        ..ModelConfig::default()
    }
}

/// Replaces a parameter's value (keeping its id).
fn set<const D: usize>(p: &mut Param<Tensor<B, D>>, t: Tensor<B, D>) {
    *p = Param::initialized(p.id, t.require_grad());
}

#[test]
fn cca_qk_mean_skip_and_value_heads() {
    let config = tiny();
    let model = Zaya::<B>::new(&config, 1, &Default::default());
    let cca = &model.blocks[0].self_attn.qkv;
    let o = &model.options;
    // Through each output separately: the query carries the QK-mean skip of q and k, the key its
    // group mean, the value both time streams.
    for (which, seed) in [(0usize, 20u64), (1, 21), (2, 22)] {
        check(
            &format!("cca output {which}"),
            values(2 * 3 * 8, 14),
            [2, 3, 8],
            |x| {
                let (q, k, v) = cca.forward(x, o);
                project([q, k, v].into_iter().nth(which).unwrap(), seed)
            },
        );
    }
}

#[test]
fn router_with_eda() {
    let config = tiny();
    let model = Zaya::<B>::new(&config, 2, &Default::default());
    // The second MoE layer has EDA: its output depends on the previous router state too.
    let router = &model.blocks[1].moe.router;
    assert!(
        router.router_states_scale.is_some()
            && model.blocks[0].moe.router.router_states_scale.is_none()
    );
    let prev = tensor(values(5 * 4, 30), [5, 4]);
    check("router input", values(5 * 8, 31), [5, 8], |x| {
        let (p, state) = router.forward(x, Some(prev.clone()), 1e-5);
        project(p, 32) + project(state, 33)
    });
    let x = tensor(values(5 * 8, 31), [5, 8]);
    check(
        "router previous state (EDA)",
        values(5 * 4, 30),
        [5, 4],
        |prev| {
            let (p, _) = router.forward(x.clone(), Some(prev), 1e-5);
            project(p, 32)
        },
    );
    check("router EDA scale", values(4, 34), [4], |scale| {
        let mut r = model.blocks[1].moe.router.clone();
        set(r.router_states_scale.as_mut().unwrap(), scale);
        let (p, _) = r.forward(x.clone(), Some(prev.clone()), 1e-5);
        project(p, 32)
    });
}

#[test]
fn residual_scaling() {
    let config = tiny();
    let model = Zaya::<B>::new(&config, 3, &Default::default());
    let scaling = model.blocks[1].attn_res_scale.clone().unwrap();
    let hidden = tensor(values(2 * 3 * 8, 40), [2, 3, 8]);
    let residual = tensor(values(2 * 3 * 8, 41), [2, 3, 8]);
    check("residual scale", values(8, 42), [8], |scale| {
        let mut s = scaling.clone();
        set(s.residual_scale.as_mut().unwrap(), scale);
        let (r, h) = s.forward(Some(residual.clone()), hidden.clone());
        project(r.unwrap() + h, 43)
    });
    check("hidden-state bias", values(8, 44), [8], |bias| {
        let mut s = scaling.clone();
        set(&mut s.hidden_states_bias, bias);
        let (r, h) = s.forward(Some(residual.clone()), hidden.clone());
        project(r.unwrap() + h, 43)
    });
}

#[test]
fn whole_model_loss_wrt_key_temperature_and_conv_bias() {
    // End to end through attention, routing (fixed by the biases' argmax) and the tied head.
    let config = tiny();
    let model = Zaya::<B>::new(&config, 4, &Default::default());
    let tokens = Tensor::<B, 2, burn::tensor::Int>::from_data(
        TensorData::new(vec![1i64, 5, 3, 7, 2, 9, 4, 0], [2, 4]),
        &Default::default(),
    );
    let targets = Tensor::<B, 2, burn::tensor::Int>::from_data(
        TensorData::new(vec![5i64, 3, 7, 2, 9, 4, 0, 1], [2, 4]),
        &Default::default(),
    );
    let biases = vec![vec![0.0, 0.0, 0.0, -1.0]; 2];
    check("loss wrt temp", vec![0.7, 1.3], [2], |temp| {
        let mut m = model.clone();
        set(&mut m.blocks[0].self_attn.qkv.temp, temp);
        m.loss(tokens.clone(), targets.clone(), &biases).0
    });
    check(
        "loss wrt grouped conv bias",
        values(24, 50).iter().map(|v| v * 0.1).collect(),
        [24],
        |bias| {
            let mut m = model.clone();
            set(&mut m.blocks[1].self_attn.qkv.conv1_bias, bias);
            m.loss(tokens.clone(), targets.clone(), &biases).0
        },
    );
}

#[test]
fn every_parameter_has_a_reference_name() {
    let model = Zaya::<B>::new(&tiny(), 5, &Default::default());
    let names = zflow_runtime::checkpoint::param_names::<B, _>(&model);
    let mapped: Vec<String> = names
        .iter()
        .map(|(n, _)| {
            zflow_runtime::model::reference_name(n)
                .unwrap_or_else(|| panic!("no reference name for {n}"))
        })
        .collect();
    let unique: std::collections::BTreeSet<&String> = mapped.iter().collect();
    assert_eq!(unique.len(), mapped.len(), "two parameters map to one name");
    for want in [
        "model.embed_tokens.weight",
        "model.layers.0.self_attn.qkv.linear_q.weight",
        "model.layers.0.self_attn.qkv.conv_qk.1.weight",
        "model.layers.0.self_attn.qkv.temp",
        "model.layers.0.self_attn.o_proj.weight",
        "model.layers.0.input_norm.weight",
        "model.layers.1.res_scale.residual_scale",
        "model.layers.1.zaya_block.router.down_proj.bias",
        "model.layers.1.zaya_block.router.rmsnorm_eda.weight",
        "model.layers.1.zaya_block.router.router_mlp.4.weight",
        "model.layers.3.zaya_block.router.router_states_scale",
        "model.layers.3.zaya_block.experts.local_experts.2.linear_fc2.weight",
        "model.res_scale.hidden_states_scale",
        "model.final_norm.weight",
    ] {
        assert!(
            unique.contains(&want.to_string()),
            "{want} missing from {unique:?}"
        );
    }
    // Layer 0 has no residual pair; the first MoE layer no EDA scale (as in the reference).
    assert!(!unique.contains(&"model.layers.0.res_scale.residual_scale".to_string()));
    assert!(!unique.contains(&"model.layers.1.zaya_block.router.router_states_scale".to_string()));
}
