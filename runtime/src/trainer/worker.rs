//! `zflow worker`: one training rank. Reads a [`TrainJob`] (JSON), probes its device, trains,
//! and speaks the [`protocol`](crate::contract::protocol) on stdout. Logs go to stderr.

use std::io::Write;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use anyhow::Result;
use burn::backend::Autodiff;

use burn::tensor::backend::AutodiffBackend;

use crate::backend::{self, BackendKind};
use crate::checkpoint;
use crate::contract::env;
use crate::contract::exit::Failure;
use crate::contract::exit::Fatal;
use crate::contract::job::TrainJob;
use crate::contract::protocol::{Emit, WorkerMessage};
use crate::dist::collective::{Group, Placement};
use crate::trainer;
use crate::trainer::faults::{self, Faults};

/// `zflow worker --probe`: probes `backend` device `device` (the preflight GEMM and memory
/// bandwidth) and reports it as one `preflight` message; returns the process exit code. The
/// rank, for injected faults, comes from `ZFLOW_RANK` (0 when unset).
pub fn probe(backend: &str, device: usize) -> i32 {
    let run = || -> Result<WorkerMessage> {
        let rank = match std::env::var(env::RANK) {
            Ok(r) => r
                .parse()
                .map_err(|_| anyhow::anyhow!("{}={r:?} is not a number", env::RANK))?,
            Err(_) => 0,
        };
        let slow_ms = Faults::from_env(rank)?.delay_ms(0);
        let (description, probe) = crate::dist::preflight::probe_backend(backend, device, slow_ms)?;
        Ok(WorkerMessage::preflight(rank, probe, description))
    };
    let message = run().unwrap_or_else(|e| {
        eprintln!("error: {e:#}");
        WorkerMessage::Error {
            message: format!("{e:#}"),
            class: Failure::of(&e),
        }
    });
    println!("{}", message.to_line());
    match message {
        WorkerMessage::Error { class, .. } => class.exit_code(),
        _ => 0,
    }
}

/// Runs the job in `job_path` on `backend` device `device`; returns the process exit code.
/// The rank, world and rendezvous come from the environment ([`Placement::from_env`]).
pub fn run(job_path: &Path, backend: &str, device: usize) -> i32 {
    let step = Arc::new(AtomicU64::new(0));
    let out = Arc::new(Mutex::new(std::io::stdout()));
    let emit: Emit = {
        let (out, step) = (out.clone(), step.clone());
        Arc::new(move |m: WorkerMessage| {
            if let WorkerMessage::Step(s) = &m {
                step.store(s.step, Ordering::Relaxed);
            }
            if faults::HUNG.load(Ordering::SeqCst) {
                return;
            }
            let mut out = out.lock().unwrap_or_else(|e| e.into_inner());
            // A supervisor that went away closes the pipe; there is nothing left to report to.
            let _ = writeln!(out, "{}", m.to_line());
            let _ = out.flush();
        })
    };
    {
        let (emit, step) = (emit.clone(), step.clone());
        let every: u64 = std::env::var(env::HEARTBEAT_S)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(15);
        std::thread::spawn(move || {
            loop {
                std::thread::sleep(std::time::Duration::from_secs(every.max(1)));
                emit(WorkerMessage::Heartbeat {
                    step: step.load(Ordering::Relaxed),
                });
            }
        });
    }
    match run_inner(job_path, backend, device, &emit) {
        Ok(()) => 0,
        Err(e) => {
            let class = Failure::of(&e);
            emit(WorkerMessage::Error {
                message: format!("{e:#}"),
                class,
            });
            eprintln!("error: {e:#}");
            class.exit_code()
        }
    }
}

fn run_inner(job_path: &Path, backend: &str, device: usize, emit: &Emit) -> Result<()> {
    let bad_settings = |e: anyhow::Error| e.context(Fatal("bad settings".into()));
    let job = TrainJob::read(job_path).map_err(bad_settings)?;
    let kind = BackendKind::parse(backend).map_err(bad_settings)?;
    let description = backend::probe(kind, device)?;
    let placement = Placement::from_env()?;
    let rank = placement.as_ref().map_or(0, |p| p.rank);
    let faults = Faults::from_env(rank)?;
    if rank == 0 {
        // Before any rank reads the checkpoints (the others wait for rank 0 in `Group::join`).
        checkpoint::quarantine_damaged(&job.checkpoints)?;
    }
    match kind {
        BackendKind::Cpu => {
            let device = burn_flex::FlexDevice;
            go::<Autodiff<burn_flex::Flex>>(
                &job,
                &device,
                &description,
                emit,
                &faults,
                placement.as_ref(),
            )
        }
        #[cfg(feature = "cuda")]
        BackendKind::Cuda => {
            let device = burn::backend::cuda::CudaDevice::new(device);
            go::<Autodiff<burn::backend::Cuda>>(
                &job,
                &device,
                &description,
                emit,
                &faults,
                placement.as_ref(),
            )
        }
        #[cfg(feature = "rocm")]
        BackendKind::Rocm => {
            let device = burn::backend::rocm::RocmDevice::new(device);
            go::<Autodiff<burn::backend::Rocm>>(
                &job,
                &device,
                &description,
                emit,
                &faults,
                placement.as_ref(),
            )
        }
        #[allow(unreachable_patterns)]
        _ => unreachable!("probe rejects backends that are not compiled in"),
    }
}

fn go<B: AutodiffBackend>(
    job: &TrainJob,
    device: &B::Device,
    description: &str,
    emit: &Emit,
    faults: &Faults,
    placement: Option<&Placement>,
) -> Result<()> {
    if std::env::var_os(env::PREFLIGHT).is_some() {
        let probe = crate::dist::preflight::probe::<B::InnerBackend>(device, faults.delay_ms(0));
        emit(WorkerMessage::preflight(
            placement.map_or(0, |p| p.rank),
            probe,
            description.to_string(),
        ));
    }
    let mut group = match placement {
        Some(p) => Group::join(p)?,
        None => Group::single(),
    };
    trainer::train::<B>(job, device, description, emit, faults, &mut group)
}
