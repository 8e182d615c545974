//! `train.launch`: how a phase runs, as opposed to what it computes. None of it is part of the
//! train stage's identity: more ranks, other nodes or more retries do not change what the
//! phase computes (beyond float rounding of the gradient sums), and a phase started on 2 ranks
//! can finish on 4.
//!
//! The topology is `nodes` x `ranks_per_node` ranks, one per device; `data_parallel` is their
//! product and may be left out. Ranks fill nodes in blocks (`crate::launch`).

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};
use zflow_pipeline::ConfigError;

/// How a phase runs (`train.launch` in the recipe).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LaunchSettings {
    /// Machines the phase runs on (Slurm `--nodes`). More than one needs the Slurm executor.
    pub nodes: usize,
    /// Ranks on each node, one per device (Slurm `--ntasks-per-node` and, on GPUs,
    /// `--gpus-per-node`). Default: `data_parallel / nodes`.
    pub ranks_per_node: Option<usize>,
    /// Data-parallel groups, each of `context_parallel` ranks; the optimizer state is sharded
    /// over all ranks (ZeRO-1). `global_batch` must be a multiple of `data_parallel x
    /// micro_batch`. Default: `nodes x ranks_per_node / context_parallel` (`nodes` when
    /// `ranks_per_node` is not given either); when given with `ranks_per_node`,
    /// `data_parallel x context_parallel` must equal `nodes x ranks_per_node`.
    pub data_parallel: Option<usize>,
    /// Ranks each sequence is split over (context parallelism,
    /// `workers/torch/zflow_torch/context_parallel.py`): each holds `seq_len /
    /// context_parallel` of its tokens. 1 (the default) splits nothing.
    pub context_parallel: usize,
    /// CPU cores each rank uses (its thread count; Slurm `--cpus-per-task`). Default: on this
    /// machine its cores shared by its ranks; under Slurm the cores the job's task was given.
    pub cpus_per_rank: Option<u32>,
    /// Environment variables for every rank (RCCL/NCCL and HSA settings, say). They are
    /// written into the run record (`events.parquet`'s launch rows), not into the identity.
    pub env: BTreeMap<String, EnvValue>,
    /// Relaunches after a crash or hang before the stage fails.
    pub max_restarts: u32,
    /// Seconds to wait before the first relaunch; doubled for each further one (up to 60 s).
    pub backoff_s: f64,
    /// Seconds without a message from a rank before it is declared hung. Workers send a
    /// heartbeat every quarter of this.
    pub hang_timeout_s: u64,
    /// Seconds a rank waits at the launch's store for a key another rank has yet to set: at
    /// the rendezvous, for the slowest rank to start. Default: [`LaunchSettings::store_timeout_s`].
    pub store_timeout_s: Option<u64>,
    /// Seconds one collective may take before the ranks give up on it (NCCL's watchdog,
    /// gloo's timeout). Default: [`LaunchSettings::collective_timeout_s`].
    pub collective_timeout_s: Option<u64>,
    /// The phase's wall-clock limit in minutes (Slurm `--time`; none: the executor's default).
    pub time_min: Option<u32>,
    /// Memory each node's ranks may use together, GiB (Slurm `--mem`; none: the cluster's
    /// default).
    pub memory_gb_per_node: Option<f64>,
    /// The preflight health check of every rank's device before training.
    pub preflight: PreflightSettings,
}

/// The preflight health check (`train.launch.preflight`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PreflightSettings {
    /// Probe every rank's device (a short GEMM and a bandwidth test) at each launch.
    pub enabled: bool,
    /// A rank below this fraction of the median GEMM or bandwidth is reported...
    pub min_ratio: f64,
    /// ...and, with `exclude`, the phase runs without it (on fewer ranks, when the global
    /// batch still divides).
    pub exclude: bool,
}

/// A value of `train.launch.env`: YAML scalars as the text a process sees (`NCCL_IB_DISABLE:
/// 1` and `"1"` are the same variable).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum EnvValue {
    /// Text.
    Text(String),
    /// A number, written as YAML wrote it.
    Number(serde_json::Number),
    /// `true` or `false`.
    Bool(bool),
}

impl fmt::Display for EnvValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EnvValue::Text(s) => f.write_str(s),
            EnvValue::Number(n) => write!(f, "{n}"),
            EnvValue::Bool(b) => write!(f, "{b}"),
        }
    }
}

impl Default for PreflightSettings {
    fn default() -> Self {
        PreflightSettings {
            enabled: true,
            min_ratio: 0.5,
            exclude: false,
        }
    }
}

impl Default for LaunchSettings {
    fn default() -> Self {
        LaunchSettings {
            nodes: 1,
            ranks_per_node: None,
            data_parallel: None,
            context_parallel: 1,
            cpus_per_rank: None,
            env: BTreeMap::new(),
            max_restarts: 3,
            backoff_s: 1.0,
            hang_timeout_s: 600,
            store_timeout_s: None,
            collective_timeout_s: None,
            time_min: None,
            memory_gb_per_node: None,
            preflight: PreflightSettings::default(),
        }
    }
}

/// Variables zflow sets for every rank itself; `env` may not override them.
const RESERVED: &[&str] = &[
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "RANK",
    "WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "CUDA_VISIBLE_DEVICES",
    "HIP_VISIBLE_DEVICES",
    "ROCR_VISIBLE_DEVICES",
    "OMP_NUM_THREADS",
];

impl LaunchSettings {
    /// Ranks in all: `data_parallel x context_parallel`, else `nodes x ranks_per_node`, else
    /// one context-parallel group per node.
    pub fn world(&self) -> usize {
        match (self.data_parallel, self.ranks_per_node) {
            (Some(dp), _) => dp * self.context_parallel(),
            (None, Some(per_node)) => self.nodes * per_node,
            (None, None) => self.nodes * self.context_parallel(),
        }
    }

    /// Ranks each sequence is split over (at least 1).
    pub fn context_parallel(&self) -> usize {
        self.context_parallel.max(1)
    }

    /// Data-parallel groups: ranks that read different sequences.
    pub fn data_parallel_groups(&self) -> usize {
        self.world() / self.context_parallel()
    }

    /// The store timeout of a launch of `world` ranks: `store_timeout_s`, else 300 s plus a
    /// quarter of a second per rank. The slowest of more ranks starts later (each imports
    /// torch from a shared filesystem, each connects to rank 0's one store), so the default
    /// grows with the world: 556 s at 1024 ranks.
    pub fn store_timeout_s(&self, world: usize) -> u64 {
        self.store_timeout_s.unwrap_or(300 + world as u64 / 4)
    }

    /// The collective timeout of a launch of `world` ranks: `collective_timeout_s`, else 300 s
    /// plus half a second per rank. A ring's latency grows with its ranks, and at resume every
    /// rank waits in one collective while rank 0 reads the checkpoint, so the default grows
    /// with the world: 812 s at 1024 ranks.
    pub fn collective_timeout_s(&self, world: usize) -> u64 {
        self.collective_timeout_s.unwrap_or(300 + world as u64 / 2)
    }

    /// Ranks on each node.
    pub fn ranks_per_node(&self) -> usize {
        self.ranks_per_node
            .unwrap_or(self.world() / self.nodes.max(1))
    }

    /// The settings' own consistency; the error's path is below `train.launch`.
    pub fn check(&self) -> Result<(), ConfigError> {
        if self.nodes == 0 {
            return Err(ConfigError::new(
                "nodes",
                "`nodes` must be at least 1, got 0",
            ));
        }
        if self.ranks_per_node == Some(0) {
            return Err(ConfigError::new(
                "ranks_per_node",
                "`ranks_per_node` must be at least 1 (one rank per device), got 0",
            ));
        }
        if self.data_parallel == Some(0) {
            return Err(ConfigError::new(
                "data_parallel",
                "`data_parallel` must be at least 1, got 0",
            ));
        }
        if self.context_parallel == 0 {
            return Err(ConfigError::new(
                "context_parallel",
                "`context_parallel` must be at least 1 (ranks per sequence), got 0",
            ));
        }
        let cp = self.context_parallel;
        match (self.data_parallel, self.ranks_per_node) {
            (Some(dp), Some(g)) if dp * cp != self.nodes * g => {
                return Err(ConfigError::new(
                    "data_parallel",
                    format!(
                        "`data_parallel` ({dp}) x context_parallel ({cp}) must equal nodes ({}) x ranks_per_node ({g}) = {}, or be left out",
                        self.nodes,
                        self.nodes * g
                    ),
                ));
            }
            (Some(dp), None) if !(dp * cp).is_multiple_of(self.nodes) => {
                return Err(ConfigError::new(
                    "data_parallel",
                    format!(
                        "`data_parallel` ({dp}) x context_parallel ({cp}) must be a multiple of nodes ({}): ranks fill nodes evenly (or give `ranks_per_node`)",
                        self.nodes
                    ),
                ));
            }
            (None, _) if !self.world().is_multiple_of(cp) => {
                return Err(ConfigError::new(
                    "context_parallel",
                    format!(
                        "`context_parallel` ({cp}) must divide the ranks (nodes {} x ranks_per_node {} = {}): each sequence is split over a whole group",
                        self.nodes,
                        self.ranks_per_node(),
                        self.world()
                    ),
                ));
            }
            _ => {}
        }
        for (name, value) in [
            ("store_timeout_s", self.store_timeout_s),
            ("collective_timeout_s", self.collective_timeout_s),
        ] {
            if value == Some(0) {
                return Err(ConfigError::new(
                    name,
                    format!("`{name}` must be at least 1 second, got 0"),
                ));
            }
        }
        if self.time_min == Some(0) {
            return Err(ConfigError::new(
                "time_min",
                "`time_min` must be at least 1 minute, got 0",
            ));
        }
        if let Some(gb) = self.memory_gb_per_node
            && !(gb.is_finite() && gb > 0.0)
        {
            return Err(ConfigError::new(
                "memory_gb_per_node",
                format!("`memory_gb_per_node` must be a positive number of GiB, got {gb}"),
            ));
        }
        if self.cpus_per_rank == Some(0) {
            return Err(ConfigError::new(
                "cpus_per_rank",
                "`cpus_per_rank` must be at least 1, got 0",
            ));
        }
        for name in self.env.keys() {
            let valid = name
                .chars()
                .next()
                .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
                && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
            if !valid {
                return Err(ConfigError::new(
                    format!("env.{name}"),
                    format!(
                        "`{name}` is not an environment variable name (letters, digits and `_`, not starting with a digit)"
                    ),
                ));
            }
            if name.starts_with("ZFLOW_") || RESERVED.contains(&name.as_str()) {
                return Err(ConfigError::new(
                    format!("env.{name}"),
                    format!(
                        "`{name}` is set by zflow for each rank (its place, device and threads) and cannot be overridden here"
                    ),
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn launch(json: serde_json::Value) -> LaunchSettings {
        serde_json::from_value(json).unwrap()
    }

    #[test]
    fn the_topology_gives_the_world_and_a_wrong_product_is_named() {
        let l = launch(serde_json::json!({"nodes": 128, "ranks_per_node": 8}));
        assert_eq!((l.world(), l.ranks_per_node()), (1024, 8));
        assert!(l.check().is_ok());
        let l = launch(serde_json::json!({"data_parallel": 4}));
        assert_eq!((l.world(), l.ranks_per_node(), l.nodes), (4, 4, 1));
        let l = launch(serde_json::json!({"nodes": 2, "data_parallel": 4}));
        assert_eq!((l.world(), l.ranks_per_node()), (4, 2));
        assert_eq!(LaunchSettings::default().world(), 1);

        let e = launch(serde_json::json!({"nodes": 2, "ranks_per_node": 2, "data_parallel": 8}))
            .check()
            .unwrap_err();
        assert_eq!(e.path, "data_parallel");
        assert!(
            e.message.contains("nodes (2) x ranks_per_node (2) = 4"),
            "{}",
            e.message
        );
        let e = launch(serde_json::json!({"nodes": 3, "data_parallel": 4}))
            .check()
            .unwrap_err();
        assert!(e.message.contains("multiple of nodes (3)"), "{}", e.message);
    }

    #[test]
    fn the_timeouts_grow_with_the_world_unless_given() {
        let l = LaunchSettings::default();
        assert_eq!(
            (l.store_timeout_s(1), l.collective_timeout_s(1)),
            (300, 300)
        );
        assert_eq!(
            (l.store_timeout_s(1024), l.collective_timeout_s(1024)),
            (556, 812)
        );
        let l = launch(serde_json::json!({"store_timeout_s": 30, "collective_timeout_s": 90}));
        assert_eq!(
            (l.store_timeout_s(1024), l.collective_timeout_s(1024)),
            (30, 90)
        );
        let e = launch(serde_json::json!({"collective_timeout_s": 0}))
            .check()
            .unwrap_err();
        assert_eq!(e.path, "collective_timeout_s");
    }

    #[test]
    fn a_time_limit_and_node_memory_are_checked() {
        let l = launch(serde_json::json!({"time_min": 1440, "memory_gb_per_node": 512}));
        assert!(l.check().is_ok());
        for (bad, path) in [
            (serde_json::json!({"time_min": 0}), "time_min"),
            (
                serde_json::json!({"memory_gb_per_node": 0}),
                "memory_gb_per_node",
            ),
            (
                serde_json::json!({"memory_gb_per_node": -1.5}),
                "memory_gb_per_node",
            ),
        ] {
            assert_eq!(launch(bad).check().unwrap_err().path, path);
        }
    }

    #[test]
    fn env_takes_scalars_and_refuses_what_zflow_sets() {
        let l = launch(
            serde_json::json!({"env": {"NCCL_IB_DISABLE": 1, "NCCL_SOCKET_IFNAME": "eth0", "X": true}}),
        );
        let text: Vec<String> = l.env.iter().map(|(k, v)| format!("{k}={v}")).collect();
        assert_eq!(
            text,
            ["NCCL_IB_DISABLE=1", "NCCL_SOCKET_IFNAME=eth0", "X=true"]
        );
        assert!(l.check().is_ok());
        for bad in ["LOCAL_RANK", "ZFLOW_THREADS", "1X", "A-B"] {
            let e = launch(serde_json::json!({"env": {bad: "1"}}))
                .check()
                .unwrap_err();
            assert_eq!(e.path, format!("env.{bad}"));
        }
    }
}
