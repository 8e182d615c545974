//! The PyTorch worker's learning-rate schedule and balancing controller
//! (`workers/torch/zflow_torch/{schedule,balance}.py`) against the native engine's, to the bit:
//! every shape of WSD over phase lengths with the rounding edge cases, and the controller over
//! seeded routing counts with every PID term, the MoD skip route and a skip-share target.

mod common;

use serde_json::{Value, json};
use zflow_runtime::rng::SplitMix64;
use zflow_runtime::trainer::balance::{BalanceConfig, BalanceState, target_shares, update};
use zflow_runtime::trainer::schedule::{DecayShape, WsdSchedule};

#[test]
fn the_python_schedule_and_controller_compute_the_rust_bits() {
    let shapes = [DecayShape::Linear, DecayShape::Cosine, DecayShape::Sqrt];
    // (warmup, decay, steps): 0.25 x 10 = 2.5 decay steps round half away from zero to 3, as
    // Rust rounds (Python's `round` gives 2, and this test fails); no warmup or decay; a
    // one-step phase.
    let phases = [
        (0.05, 0.25, 10u64),
        (0.1, 0.2, 97),
        (0.0, 0.0, 5),
        (0.3, 0.7, 1),
    ];
    let schedules: Vec<(WsdSchedule, u64)> = shapes
        .into_iter()
        .enumerate()
        .flat_map(|(i, shape)| {
            phases.map(|(warmup, decay, total)| {
                let s = WsdSchedule {
                    peak_lr: 3e-3 * (i + 1) as f64,
                    warmup,
                    decay,
                    min_lr_ratio: 0.1,
                    decay_shape: shape,
                };
                (s, total)
            })
        })
        .collect();
    let schedule_cases: Vec<Value> = schedules
        .iter()
        .map(|(s, total)| json!({"schedule": s, "total": total}))
        .collect();

    let configs = [
        (17, true, BalanceConfig::default()),
        (
            9,
            true,
            BalanceConfig {
                kp: 0.7,
                ki: 0.05,
                kd: 0.3,
                lr: 0.02,
                skip_share: Some(0.25),
                ..Default::default()
            },
        ),
        (
            4,
            false,
            BalanceConfig {
                beta2: 0.9,
                ..Default::default()
            },
        ),
    ];
    let mut rng = SplitMix64(2026);
    let balance_cases: Vec<(usize, bool, BalanceConfig, Vec<Vec<u64>>)> = configs
        .into_iter()
        .map(|(routes, skip, config)| {
            // 60 steps; some with no tokens at all (no update) and some with idle routes.
            let counts = (0..60)
                .map(|step| {
                    (0..routes)
                        .map(|r| {
                            if step % 13 == 5 || (r + step) % 7 == 0 {
                                0
                            } else {
                                rng.below(500)
                            }
                        })
                        .collect()
                })
                .collect();
            (routes, skip, config, counts)
        })
        .collect();
    let cases = json!({
        "schedules": schedule_cases,
        "balance": balance_cases.iter().map(|(routes, skip, config, counts)| {
            json!({"routes": routes, "mod_skip": skip, "config": config, "counts": counts})
        }).collect::<Vec<_>>(),
    });
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("cases.json");
    std::fs::write(&input, serde_json::to_vec(&cases).unwrap()).unwrap();
    let python: Value =
        serde_json::from_slice(&common::zflow_torch("control_check", [&input])).unwrap();

    for (i, (s, total)) in schedules.iter().enumerate() {
        let total = *total;
        let rust: Vec<u64> = (0..total).map(|step| s.lr(step, total).to_bits()).collect();
        let py: Vec<u64> = serde_json::from_value(python["lr"][i].clone()).unwrap();
        assert_eq!(rust, py, "schedule {i}: {s:?} over {total} steps");
    }
    for (i, (routes, skip, config, counts)) in balance_cases.iter().enumerate() {
        let mut state = BalanceState::new(*routes, *skip);
        let target = target_shares(*routes, *skip, config);
        let mut rust = Vec::new();
        for c in counts {
            update(&mut state, c, &target, config);
            rust.extend(state.biases.iter().map(|&b| (b as f64).to_bits()));
        }
        let py: Vec<u64> = serde_json::from_value(python["biases"][i].clone()).unwrap();
        assert_eq!(rust.len(), py.len());
        assert!(rust == py, "controller {i}: the biases differ");
        assert!(
            state.steps > 40,
            "the controller ran ({} updates)",
            state.steps
        );
    }
}
