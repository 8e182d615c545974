//! The PyTorch worker's side of the engine contract (`workers/torch/zflow_torch/contract.py`)
//! against the Rust definitions: the same environment variable names, exit codes and job
//! version, and every message it writes parses with the supervisor's own parser into the
//! variant it means.

mod common;

use serde_json::Value;
use zflow_runtime::contract::env;
use zflow_runtime::contract::exit::{EXIT_FATAL, EXIT_LOST_PEER, Failure};
use zflow_runtime::contract::job::JOB_VERSION;
use zflow_runtime::contract::protocol::WorkerMessage;

#[test]
fn the_python_contract_has_the_rust_names_numbers_and_messages() {
    let text = String::from_utf8(common::zflow_torch("contract", [] as [&str; 0])).unwrap();
    let mut lines = text.lines();
    let constants: Value = serde_json::from_str(lines.next().unwrap()).unwrap();
    let names = [
        env::RANK,
        env::WORLD,
        env::RENDEZVOUS,
        env::SECRET,
        env::HEARTBEAT_S,
        env::STORE_TIMEOUT_S,
        env::COLLECTIVE_TIMEOUT_S,
        env::PREFLIGHT,
        env::FAULTS,
        env::ATTEMPT,
        env::LOCAL_RANK,
        env::LOCAL_WORLD,
        env::DEVICE,
    ];
    assert_eq!(constants["env"], serde_json::json!(names));
    assert_eq!(constants["job_version"], JOB_VERSION);
    let exit = &constants["exit"];
    assert_eq!(exit["done"], 0);
    assert_eq!(exit["retry"], Failure::Retry.exit_code());
    assert_eq!(exit["fatal"], EXIT_FATAL);
    assert_eq!(exit["lost_peer"], EXIT_LOST_PEER);

    let messages: Vec<WorkerMessage> = lines
        .map(|l| WorkerMessage::parse(l).unwrap_or_else(|| panic!("not a protocol line: {l}")))
        .collect();
    let kinds: Vec<&str> = messages
        .iter()
        .map(|m| match m {
            WorkerMessage::Hello { .. } => "hello",
            WorkerMessage::Preflight { .. } => "preflight",
            WorkerMessage::Heartbeat { .. } => "heartbeat",
            WorkerMessage::Step(_) => "step",
            WorkerMessage::Eval { .. } => "eval",
            WorkerMessage::CheckpointCommitted { .. } => "checkpoint_committed",
            WorkerMessage::LossSpike { .. } => "loss_spike",
            WorkerMessage::Done { .. } => "done",
            WorkerMessage::Error { .. } => "error",
        })
        .collect();
    assert_eq!(
        kinds,
        [
            "hello",
            "preflight",
            "heartbeat",
            "step",
            "eval",
            "checkpoint_committed",
            "loss_spike",
            "done",
            "error"
        ]
    );
    match &messages[3] {
        WorkerMessage::Step(s) => {
            assert_eq!((s.step, s.expert_load.clone()), (3, vec![3, 1, 0, 4]))
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        messages[8],
        WorkerMessage::Error {
            message: "token id 600 >= 512".into(),
            class: Failure::Fatal
        }
    );
    assert_eq!(
        messages[7],
        WorkerMessage::Done {
            step: 10,
            loss: None
        }
    );
}
