//! `zflow worker`: one training rank. Reads a [`TrainJob`] (JSON), probes its device, trains,
//! and speaks the [`protocol`](crate::protocol) on stdout. Logs go to stderr.

use std::io::Write;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use anyhow::{Context, Result};
use burn::backend::Autodiff;

use crate::backend::{self, BackendKind};
use crate::protocol::WorkerMessage;
use crate::trainer::{self, TrainJob};

/// Environment variable for fault injection in tests: abort the worker right after this step.
pub const CRASH_AFTER_STEP: &str = "ZFLOW_FAULT_CRASH_AFTER_STEP";

/// Seconds between heartbeats (a step can take longer than the supervisor's hang timeout
/// would like to wait for a sign of life).
const HEARTBEAT_S: u64 = 15;

/// Runs the job in `job_path` on `backend` device `device`; returns the process exit code.
pub fn run(job_path: &Path, backend: &str, device: usize) -> i32 {
    let step = Arc::new(AtomicU64::new(0));
    let out = Arc::new(Mutex::new(std::io::stdout()));
    let send = {
        let out = out.clone();
        move |m: &WorkerMessage| {
            let mut out = out.lock().unwrap_or_else(|e| e.into_inner());
            // A supervisor that went away closes the pipe; there is nothing left to report to.
            let _ = writeln!(out, "{}", m.to_line());
            let _ = out.flush();
        }
    };
    {
        let (send, step) = (send.clone(), step.clone());
        std::thread::spawn(move || {
            loop {
                std::thread::sleep(std::time::Duration::from_secs(HEARTBEAT_S));
                send(&WorkerMessage::Heartbeat { step: step.load(Ordering::Relaxed) });
            }
        });
    }
    let mut emit = |m: WorkerMessage| {
        if let WorkerMessage::Step(s) = &m {
            step.store(s.step, Ordering::Relaxed);
        }
        send(&m);
    };
    match run_inner(job_path, backend, device, &mut emit) {
        Ok(()) => 0,
        Err(e) => {
            emit(WorkerMessage::Error { message: format!("{e:#}") });
            eprintln!("error: {e:#}");
            1
        }
    }
}

fn run_inner(job_path: &Path, backend: &str, device: usize, emit: &mut dyn FnMut(WorkerMessage)) -> Result<()> {
    let job: TrainJob = serde_json::from_slice(&std::fs::read(job_path).with_context(|| format!("reading {}", job_path.display()))?)
        .with_context(|| format!("parsing the train job {}", job_path.display()))?;
    let kind = BackendKind::parse(backend)?;
    let description = backend::probe(kind, device)?;
    let crash_after = std::env::var(CRASH_AFTER_STEP).ok().and_then(|v| v.parse().ok());
    match kind {
        BackendKind::Cpu => {
            let device = burn_flex::FlexDevice;
            trainer::train::<Autodiff<burn_flex::Flex>>(&job, &device, &description, emit, crash_after)
        }
        #[cfg(feature = "cuda")]
        BackendKind::Cuda => {
            let device = burn::backend::cuda::CudaDevice::new(device);
            trainer::train::<Autodiff<burn::backend::Cuda>>(&job, &device, &description, emit, crash_after)
        }
        #[cfg(feature = "rocm")]
        BackendKind::Rocm => {
            let device = burn::backend::rocm::RocmDevice::new(device);
            trainer::train::<Autodiff<burn::backend::Rocm>>(&job, &device, &description, emit, crash_after)
        }
        #[allow(unreachable_patterns)]
        _ => unreachable!("probe rejects backends that are not compiled in"),
    }
}
