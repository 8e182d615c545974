//! The environment a rank gets from its supervisor. Every variable a worker engine reads is
//! named here and nowhere else.
//!
//! Besides these, a rank gets the stage's own variables (`ZFLOW_OUT`, `ZFLOW_STAGE`,
//! `ZFLOW_THREADS`, `ZFLOW_IN_<INPUT>`: `zflow_pipeline::stage::StageContext::child_env`; a rank's
//! `ZFLOW_THREADS` is its own share of the stage's cores), its
//! working directory is the train stage's output folder, and its stdin is closed.

/// This rank, 0-based. Absent (with the rest of the placement) in a single-rank run.
pub const RANK: &str = "ZFLOW_RANK";
/// Ranks in the launch.
pub const WORLD: &str = "ZFLOW_WORLD";
/// `host:port` where rank 0 waits for the others.
pub const RENDEZVOUS: &str = "ZFLOW_RENDEZVOUS";
/// The launch's secret, which every rank proves it holds ([`crate::dist::secret`]). Fresh for
/// every launch; never on a command line.
pub const SECRET: &str = "ZFLOW_GROUP_SECRET";
/// Seconds between heartbeats (a step can take longer than the supervisor's hang timeout
/// would like to wait for a sign of life); set from the hang timeout.
pub const HEARTBEAT_S: &str = "ZFLOW_HEARTBEAT_S";
/// Seconds a rank waits on the launch's store (rank 0's `TCPStore`) for a key another rank
/// has yet to set: at the rendezvous, the wait for the slowest rank to start.
pub const STORE_TIMEOUT_S: &str = "ZFLOW_STORE_TIMEOUT_S";
/// Seconds one collective may take before the process group gives up on it (NCCL's watchdog,
/// gloo's operation timeout): the longest a rank waits on the others, as at resume, while
/// rank 0 reads the checkpoint.
pub const COLLECTIVE_TIMEOUT_S: &str = "ZFLOW_COLLECTIVE_TIMEOUT_S";
/// Set (to `1`) when the ranks are to probe their devices before training and send a
/// `preflight` message.
pub const PREFLIGHT: &str = "ZFLOW_PREFLIGHT";
/// Faults to inject, for testing (`workers/torch/zflow_torch/faults.py` reads them).
pub const FAULTS: &str = "ZFLOW_FAULTS";
/// The launch number, 1 for the first; injected faults fire in their attempt only.
pub const ATTEMPT: &str = "ZFLOW_ATTEMPT";
/// This rank's index among the ranks of its node (torch's name, which libraries read too).
pub const LOCAL_RANK: &str = "LOCAL_RANK";
/// Ranks on this rank's node.
pub const LOCAL_WORLD: &str = "LOCAL_WORLD_SIZE";
/// The index of the one GPU this rank binds, among those visible to it (absent on the CPU).
/// On this machine it is `LOCAL_RANK`; in a Slurm step that asked for one GPU, 0.
pub const DEVICE: &str = "ZFLOW_DEVICE";
