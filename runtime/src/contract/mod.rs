//! The engine contract: what a training worker and zflow's supervisor (the train stage,
//! `stages/src/train/`) agree on. The torch engine (`workers/torch/zflow_torch/worker.py`)
//! implements the worker side; any other engine that keeps this contract can be supervised the
//! same way, and is added in `stages/src/engine.rs` without touching the supervisor.
//!
//! A worker engine is a program the supervisor starts once per rank, per launch:
//!
//! 1. **Its input** is the train job, a JSON file ([`job::TrainJob`], versioned by
//!    [`job::JOB_VERSION`]): the phase, the model, the training settings
//!    ([`settings::TrainSettings`]), the mixture index
//!    and token sources, the checkpoint folder and the checkpoint to start from.
//! 2. **Its environment** ([`env`](mod@env)) places it in the launch: rank, world, the rendezvous
//!    address, the launch secret that every rank must prove
//!    ([`crate::dist::secret`]), the heartbeat interval, whether to probe the device first, and
//!    the faults to inject in tests.
//! 3. **It reports on stdout**, one JSON object per line ([`protocol::WorkerMessage`]):
//!    `hello` first, then `preflight` when asked, `step` per optimizer step, `eval`,
//!    `checkpoint_committed`, `loss_spike`, `heartbeat` when a step takes long, and last
//!    `done` or `error`. Anything else it prints (stderr) goes to the stage log.
//!    Started with `--probe` instead of a job (`stages/src/engine.rs`: `probe_command`), it
//!    only measures its device and answers with one `preflight` message: what the `preflight`
//!    stage runs on every rank.
//! 4. **It ends** with an exit code that says what the supervisor should do ([`exit`]): done,
//!    retry, lost peer, fatal.
//! 5. **It reads and writes checkpoints** in the format of [`crate::checkpoint`]: `step-N/`
//!    folders with `model.safetensors` (the reference's tensor names), per-rank optimizer
//!    shards laid out by [`crate::checkpoint::layout::Layout`] (`layout.json`), each parameter's state a
//!    record of [`crate::checkpoint::optimizer`] (Muon and AdamW state), `trainer.json` (step, data
//!    cursor, balancing state, loss history), `model.json` (the model trained) and a manifest
//!    of BLAKE3 hashes written last; a folder without a manifest that verifies does not exist.
//!    It resumes from the newest checkpoint that verifies, else from the job's `init`.
//! 6. **It reads samples** through the mixture index ([`crate::data::mixture`], whose module
//!    page gives the byte layout: `samples.idx`, a header then one u64 per sample, source id
//!    and source-local sample number, in training order; `samples.idx.json` beside it) from
//!    the sources' Megatron datasets ([`crate::data::megatron`]). The global batch at the data
//!    cursor is split over ranks as [`crate::data::mixture::MixtureReader::batch`] does, so the
//!    order does not depend on the number of ranks.

pub mod backend;
pub mod balance;
pub mod env;
pub mod exit;
pub mod job;
pub mod protocol;
pub mod schedule;
pub mod schema;
pub mod settings;
pub mod spike;
