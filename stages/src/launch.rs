//! How a stage starts its per-rank processes (training workers, device probes): as children
//! of the stage on this machine, or, inside a Slurm job (the Slurm executor sets
//! `ZFLOW_EXECUTOR=slurm`), as one `srun` job step per node running `zflow node-agent`
//! (`crate::node_agent`), which starts the node's ranks and relays each one's lines and exit
//! status. The supervisor keeps a pipe and an exit status per rank either way
//! (`crate::running`), so a crash is blamed on the right rank; the batch host runs one `srun`
//! client per node, not one per rank.
//!
//! Ranks fill nodes in blocks ([`Slot`]). Each rank binds exactly one device, named in its
//! environment: device `LOCAL_RANK` among those visible to it, on this machine as in a Slurm
//! step, which asks for one GPU per rank of its node (`--gpus-per-task`). The worker checks at
//! start that no two ranks of a node share a (host, device).

use std::ffi::OsString;
use std::process::Command;

use anyhow::{Context, Result, ensure};
use zflow_pipeline::stage::THREADS;
use zflow_runtime::contract::env;
use zflow_runtime::dist::placement::{Placement, free_port};

/// Python's module search path, which a recipe's `train.launch.env` extends rather than
/// replaces.
const PYTHONPATH: &str = "PYTHONPATH";

/// The job this stage runs in, when it runs under the Slurm executor.
#[derive(Clone, Debug, PartialEq)]
pub struct SlurmJob {
    /// `SLURM_JOB_ID`.
    pub id: u64,
    /// The job's nodes, in Slurm's order (`scontrol show hostnames $SLURM_JOB_NODELIST`).
    pub hosts: Vec<String>,
    /// The address Slurm reaches each of them at (its `NodeAddr`; the host name where the
    /// cluster's configuration gives none): rank 0's rendezvous is on the first.
    pub addresses: Vec<String>,
}

impl SlurmJob {
    /// The job from the environment: `None` outside the Slurm executor.
    pub fn from_env() -> Result<Option<SlurmJob>> {
        use zflow_pipeline::slurm::{EXECUTOR_ENV, EXECUTOR_SLURM};
        if std::env::var(EXECUTOR_ENV).as_deref() != Ok(EXECUTOR_SLURM) {
            return Ok(None);
        }
        let id = std::env::var("SLURM_JOB_ID").with_context(|| {
            format!("{EXECUTOR_ENV}={EXECUTOR_SLURM} but SLURM_JOB_ID is unset")
        })?;
        let nodelist = std::env::var("SLURM_JOB_NODELIST")
            .context("SLURM_JOB_NODELIST is unset in a Slurm job")?;
        let out = Command::new("scontrol")
            .args(["show", "hostnames", &nodelist])
            .output()
            .context("running `scontrol show hostnames`")?;
        ensure!(
            out.status.success(),
            "`scontrol show hostnames {nodelist}` failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
        let hosts: Vec<String> = String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .map(str::to_string)
            .collect();
        ensure!(
            !hosts.is_empty(),
            "SLURM_JOB_NODELIST={nodelist} names no host"
        );
        let addresses = node_addresses(&nodelist, &hosts)?;
        Ok(Some(SlurmJob {
            id: id.parse().with_context(|| format!("SLURM_JOB_ID={id:?}"))?,
            hosts,
            addresses,
        }))
    }

    /// The job's nodes that do not run a trivial job step (`true`) within `timeout`: nodes
    /// that died or whose slurmd stopped answering. One probe per node, all at once.
    pub fn unreachable(&self, timeout: std::time::Duration) -> Vec<String> {
        let probes: Vec<_> = (0..self.hosts.len())
            .map(|node| {
                Command::new("srun")
                    .args([
                        "--ntasks=1",
                        "--nodes=1",
                        "--exact",
                        "--quiet",
                        "--job-name=zflow-node-probe",
                        &format!("--relative={node}"),
                        "true",
                    ])
                    .stdin(std::process::Stdio::null())
                    .stdout(std::process::Stdio::null())
                    .stderr(std::process::Stdio::null())
                    .spawn()
            })
            .collect();
        let deadline = std::time::Instant::now() + timeout;
        probes
            .into_iter()
            .zip(&self.hosts)
            .filter_map(|(probe, host)| {
                let Ok(mut child) = probe else {
                    return Some(host.clone());
                };
                loop {
                    match child.try_wait() {
                        Ok(Some(status)) if status.success() => return None,
                        Ok(None) if std::time::Instant::now() < deadline => {
                            std::thread::sleep(std::time::Duration::from_millis(100));
                        }
                        _ => {
                            let _ = child.kill();
                            let _ = child.wait();
                            return Some(host.clone());
                        }
                    }
                }
            })
            .collect()
    }

    /// A job on `hosts`, reached by their names (tests, and `zflow plan --launch`).
    pub fn on_hosts(id: u64, hosts: Vec<String>) -> SlurmJob {
        SlurmJob {
            id,
            addresses: hosts.clone(),
            hosts,
        }
    }
}

/// Each host's `NodeAddr` (`scontrol show node -o`), in the order of `hosts`.
fn node_addresses(nodelist: &str, hosts: &[String]) -> Result<Vec<String>> {
    let out = Command::new("scontrol")
        .args(["show", "node", "-o", nodelist])
        .output()
        .context("running `scontrol show node`")?;
    ensure!(
        out.status.success(),
        "`scontrol show node -o {nodelist}` failed: {}",
        String::from_utf8_lossy(&out.stderr).trim()
    );
    let text = String::from_utf8_lossy(&out.stdout);
    Ok(hosts
        .iter()
        .map(|host| node_addr(&text, host).unwrap_or_else(|| host.clone()))
        .collect())
}

/// `host`'s `NodeAddr=` in `scontrol show node -o` output (one node per line).
fn node_addr(text: &str, host: &str) -> Option<String> {
    let line = text.lines().find(|l| {
        l.split_whitespace()
            .any(|w| w.strip_prefix("NodeName=") == Some(host))
    })?;
    line.split_whitespace()
        .find_map(|w| w.strip_prefix("NodeAddr="))
        .map(str::to_string)
}

/// Where one rank runs: its node and its place on it. Ranks fill nodes in blocks, as `srun`
/// places tasks: with 2 nodes and 4 ranks, ranks 0-1 on node 0 and 2-3 on node 1.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Slot {
    /// The rank.
    pub rank: usize,
    /// Its node, 0-based in the job's order.
    pub node: usize,
    /// Its index among the ranks of its node (`LOCAL_RANK`).
    pub local_rank: usize,
    /// Ranks on its node (`LOCAL_WORLD_SIZE`).
    pub local_world: usize,
}

/// The slots of `world` ranks over `nodes` nodes.
pub fn slots(world: usize, nodes: usize) -> Vec<Slot> {
    let per = world.div_ceil(nodes.max(1)).max(1);
    (0..world)
        .map(|rank| {
            let node = rank / per;
            Slot {
                rank,
                node,
                local_rank: rank % per,
                local_world: per.min(world - node * per),
            }
        })
        .collect()
}

/// Where the ranks run: this machine, or the nodes of a Slurm job.
#[derive(Clone, Debug)]
pub enum Target<'a> {
    /// Children of the stage on this machine.
    Local,
    /// `srun` job steps in the job.
    Slurm(&'a SlurmJob),
}

/// Everything one launch of ranks needs to know besides each rank's program.
#[derive(Clone, Debug)]
pub struct LaunchSpec<'a> {
    /// Where.
    pub target: Target<'a>,
    /// Ranks in all.
    pub world: usize,
    /// The training backend (`cpu`, `cuda`, `rocm`): a GPU backend binds one device per rank.
    pub backend: &'a str,
    /// Threads (CPU cores) per rank.
    pub threads: usize,
    /// Variables for every rank (`train.launch.env`).
    pub env: Vec<(String, String)>,
    /// The stage's name, for the steps' job names.
    pub stage: &'a str,
}

/// One process of a launch: a rank on this machine, or under Slurm one node's `srun` step
/// running `zflow node-agent` (`crate::node_agent`), which starts that node's ranks.
#[derive(Clone, Debug)]
pub struct ProcessLaunch {
    /// The ranks it runs: one on this machine, a node's under Slurm.
    pub ranks: std::ops::Range<usize>,
    /// Whether it is a node agent, which reports its ranks as [`crate::node_agent::AgentLine`]s.
    pub agent: bool,
    /// The program: the engine's, or `srun` in a Slurm job.
    pub program: OsString,
    /// Its arguments.
    pub args: Vec<OsString>,
    /// Its environment: the placement, the device and threads, and the launch's `env` (under
    /// Slurm, what all the node's ranks share: the agent adds each rank's own place).
    pub env: Vec<(String, String)>,
}

impl ProcessLaunch {
    /// The process as a [`Command`], with the stage's own variables `stage_env` under the
    /// rank's (its share of the threads wins); stdio and working directory are the caller's.
    pub fn command(&self, stage_env: Vec<(String, String)>) -> Command {
        let mut c = Command::new(&self.program);
        c.args(&self.args)
            .envs(stage_env)
            .envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        c
    }

    /// One shell line: the environment, then the command (`zflow plan --launch`).
    pub fn shell_line(&self) -> String {
        let mut words: Vec<String> = self
            .env
            .iter()
            .map(|(k, v)| format!("{k}={}", shell_quote(v)))
            .collect();
        words.push(shell_quote(&self.program.to_string_lossy()));
        words.extend(self.args.iter().map(|a| shell_quote(&a.to_string_lossy())));
        words.join(" ")
    }
}

impl LaunchSpec<'_> {
    /// Nodes the ranks spread over.
    pub fn nodes(&self) -> usize {
        match self.target {
            Target::Local => 1,
            Target::Slurm(job) => job.hosts.len(),
        }
    }

    /// Whether the ranks run on this machine's CPU (where the torch fork server may start
    /// them: `crate::forkserver`).
    pub fn local_cpu(&self) -> bool {
        matches!(self.target, Target::Local) && !self.gpus()
    }

    /// Whether each rank binds its own device.
    fn gpus(&self) -> bool {
        self.backend != "cpu"
    }

    /// The processes of a launch running `engine` (program, arguments, environment) on every
    /// rank, meeting at `placements` (one per rank, in rank order; none for ranks that form
    /// no group, such as device probes): one per rank on this machine; under Slurm one
    /// `srun` step per node, whose node agent starts the node's ranks, so the batch host runs
    /// one `srun` client per node and slurmctld creates one step per node.
    pub fn processes(
        &self,
        engine: &crate::engine::EngineCommand,
        placements: &[Placement],
    ) -> Result<Vec<ProcessLaunch>> {
        let slots = slots(self.world, self.nodes());
        let Target::Slurm(_) = self.target else {
            return Ok(slots
                .into_iter()
                .map(|slot| {
                    let mut env = self.shared_env(engine, placements, slot);
                    if self.world > 1 && !placements.is_empty() {
                        env.push((env::RANK.into(), slot.rank.to_string()));
                    }
                    env.push((env::LOCAL_RANK.into(), slot.local_rank.to_string()));
                    if self.gpus() {
                        env.push((env::DEVICE.into(), slot.local_rank.to_string()));
                    }
                    ProcessLaunch {
                        ranks: slot.rank..slot.rank + 1,
                        agent: false,
                        program: engine.program.clone().into_os_string(),
                        args: engine.args.clone(),
                        env,
                    }
                })
                .collect());
        };
        let zflow = zflow_pipeline::supervise::zflow_exe()?;
        Ok(slots
            .iter()
            .filter(|slot| slot.local_rank == 0)
            .map(|&first| {
                let node = crate::node_agent::NodeRanks {
                    first_rank: first.rank,
                    local_world: first.local_world,
                    bind_devices: self.gpus(),
                    program: engine.program.to_string_lossy().into_owned(),
                    args: engine
                        .args
                        .iter()
                        .map(|a| a.to_string_lossy().into_owned())
                        .collect(),
                };
                let mut args: Vec<OsString> = self
                    .step_options(first)
                    .into_iter()
                    .map(OsString::from)
                    .collect();
                args.push(zflow.clone().into_os_string());
                args.push("node-agent".into());
                args.extend(node.to_args().into_iter().map(OsString::from));
                ProcessLaunch {
                    ranks: first.rank..first.rank + first.local_world,
                    agent: true,
                    program: "srun".into(),
                    args,
                    env: self.shared_env(engine, placements, first),
                }
            })
            .collect())
    }

    /// What every rank of `slot`'s node gets: the engine's variables, the launch's placement
    /// less the rank, the node's rank count, the threads and `train.launch.env`.
    fn shared_env(
        &self,
        engine: &crate::engine::EngineCommand,
        placements: &[Placement],
        slot: Slot,
    ) -> Vec<(String, String)> {
        let mut env: Vec<(String, String)> = engine
            .env
            .iter()
            .map(|(k, v)| (k.clone(), v.to_string_lossy().into_owned()))
            .collect();
        if self.world > 1 && !placements.is_empty() {
            env.extend(
                placements[slot.rank]
                    .to_env()
                    .into_iter()
                    .filter(|(k, _)| *k != env::RANK)
                    .map(|(k, v)| (k.to_string(), v)),
            );
        }
        env.push((env::LOCAL_WORLD.into(), slot.local_world.to_string()));
        env.push((THREADS.into(), self.threads.to_string()));
        for (key, value) in &self.env {
            // A recipe's PYTHONPATH adds to the engine's: the worker's own package must stay
            // importable (without the fork server, which has it, a replaced one ended every
            // rank with "No module named 'zflow_torch'").
            let ours = engine.env.iter().find(|(k, _)| k == PYTHONPATH && key == k);
            let value = match ours {
                Some((_, ours)) => format!("{}:{value}", ours.to_string_lossy()),
                None => value.clone(),
            };
            env.push((key.clone(), value));
        }
        env
    }

    /// `srun` options running the node agent of `first`'s node as one job step there, with
    /// the cores of its ranks and (on GPUs) one GPU per rank.
    fn step_options(&self, first: Slot) -> Vec<String> {
        let mut o = vec![
            "--ntasks=1".to_string(),
            "--nodes=1".to_string(),
            "--exact".to_string(),
            "--kill-on-bad-exit=0".to_string(),
            "--quiet".to_string(),
            format!("--relative={}", first.node),
            format!("--cpus-per-task={}", self.threads * first.local_world),
            format!("--job-name={}-node{}", self.stage, first.node),
        ];
        if self.gpus() {
            o.push(format!("--gpus-per-task={}", first.local_world));
        }
        o
    }

    /// Placements for the ranks: on this machine (loopback), or with rank 0's rendezvous on
    /// the job's first node. Each launch has a fresh secret.
    pub fn placements(&self) -> Result<Vec<Placement>> {
        match self.target {
            Target::Slurm(job) if job.hosts.len() > 1 => {
                let rendezvous = format!("{}:{}", job.addresses[0], free_port()?);
                let secret = zflow_runtime::dist::secret::generate_secret()?;
                Ok(Placement::all(self.world, &rendezvous, &secret))
            }
            _ => Placement::local(self.world),
        }
    }
}

/// Threads for each rank: `cpus_per_rank` when the recipe gives it, else the stage's cores
/// shared by the ranks on one machine (at least 1). Two ranks with every core each would
/// spin against each other: on a 2-core machine a 2-rank phase ran 3-7x slower so.
pub fn threads_per_rank(cpus_per_rank: Option<u32>, stage_threads: usize, local: usize) -> usize {
    match cpus_per_rank {
        Some(n) => n as usize,
        None => (stage_threads / local.max(1)).max(1),
    }
}

/// `text` as one word of a POSIX shell.
fn shell_quote(text: &str) -> String {
    let plain = !text.is_empty()
        && text
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./=:,+@%".contains(c));
    if plain {
        text.to_string()
    } else {
        format!("'{}'", text.replace('\'', r"'\''"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn engine() -> crate::engine::EngineCommand {
        crate::engine::EngineCommand {
            program: "/venv/bin/python".into(),
            args: vec!["-m".into(), "zflow_torch.worker".into()],
            env: vec![("PYTHONPATH".into(), "/w".into())],
        }
    }

    fn var<'a>(r: &'a ProcessLaunch, name: &str) -> Option<&'a str> {
        r.env
            .iter()
            .rev()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    fn spec<'a>(target: Target<'a>, world: usize, backend: &'a str) -> LaunchSpec<'a> {
        LaunchSpec {
            target,
            world,
            backend,
            threads: 2,
            env: vec![
                ("NCCL_DEBUG".into(), "WARN".into()),
                (PYTHONPATH.into(), "/recipe/lib".into()),
            ],
            stage: "train.p1",
        }
    }

    #[test]
    fn on_this_machine_every_rank_is_a_process_binding_its_own_device() {
        for per_node in [1, 2, 8] {
            let spec = spec(Target::Local, per_node, "cuda");
            let placements = Placement::local(per_node).unwrap();
            let processes = spec.processes(&engine(), &placements).unwrap();
            assert_eq!(processes.len(), per_node);
            for (rank, p) in processes.iter().enumerate() {
                assert_eq!((p.ranks.clone(), p.agent), (rank..rank + 1, false));
                assert_eq!(var(p, "NCCL_DEBUG"), Some("WARN"));
                // The recipe's path after the engine's: the worker stays importable.
                assert_eq!(var(p, PYTHONPATH), Some("/w:/recipe/lib"));
                assert_eq!(var(p, THREADS), Some("2"));
                let want = rank.to_string();
                assert_eq!(var(p, env::LOCAL_RANK), Some(want.as_str()));
                assert_eq!(var(p, env::DEVICE), Some(want.as_str()));
                if per_node > 1 {
                    assert_eq!(var(p, env::RANK), Some(want.as_str()));
                }
            }
            // On the CPU no device is bound.
            let cpu = spec_cpu(per_node);
            assert!(cpu.iter().all(|p| var(p, env::DEVICE).is_none()));
        }
    }

    fn spec_cpu(world: usize) -> Vec<ProcessLaunch> {
        spec(Target::Local, world, "cpu")
            .processes(&engine(), &[])
            .unwrap()
    }

    #[test]
    fn under_slurm_each_node_is_one_step_whose_agent_starts_its_ranks() {
        let job = SlurmJob {
            id: 42,
            hosts: vec!["a".into(), "b".into()],
            addresses: vec!["10.0.0.1".into(), "10.0.0.2".into()],
        };
        let spec = LaunchSpec {
            threads: 6,
            ..spec(Target::Slurm(&job), 8, "cuda")
        };
        let p = spec.placements().unwrap();
        assert!(
            p.iter().all(|p| p.rendezvous.starts_with("10.0.0.1:")) && p[3].rank == 3,
            "{p:?}"
        );
        let nodes = spec.processes(&engine(), &p).unwrap();
        assert_eq!(nodes.len(), 2);
        let second = &nodes[1];
        assert_eq!((second.ranks.clone(), second.agent), (4..8, true));
        let args: Vec<String> = second
            .args
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        assert_eq!(second.program, "srun");
        for want in [
            "--relative=1",
            "--cpus-per-task=24",
            "--gpus-per-task=4",
            "--job-name=train.p1-node1",
            "node-agent",
        ] {
            assert!(args.contains(&want.to_string()), "{want}: {args:?}");
        }
        let agent = args.iter().position(|a| a == "node-agent").unwrap();
        assert_eq!(
            &args[agent + 1..],
            [
                "4",
                "4",
                "gpu",
                "--",
                "/venv/bin/python",
                "-m",
                "zflow_torch.worker"
            ]
        );
        // What the node's ranks share; each rank's own place is the agent's to set.
        assert_eq!(var(second, env::LOCAL_WORLD), Some("4"));
        assert_eq!(var(second, env::WORLD), Some("8"));
        for own in [env::RANK, env::LOCAL_RANK, env::DEVICE] {
            assert_eq!(var(second, own), None, "{own}");
        }
        let line = second.shell_line();
        assert!(
            line.contains("LOCAL_WORLD_SIZE=4 ") && line.contains(" srun --ntasks=1"),
            "{line}"
        );
    }

    #[test]
    fn node_addresses_come_from_scontrol() {
        let text = "NodeName=n0 Arch=x86_64 CoresPerSocket=1 NodeAddr=10.77.0.10 NodeHostName=n0\n\
                    NodeName=n1 Arch=x86_64 NodeAddr=10.77.0.11 NodeHostName=n1\n";
        assert_eq!(node_addr(text, "n1").as_deref(), Some("10.77.0.11"));
        assert_eq!(node_addr(text, "n2"), None);
    }

    #[test]
    fn blocks_fill_nodes_and_threads_share_the_machine() {
        let s = slots(3, 2);
        assert_eq!(
            s.iter()
                .map(|s| (s.node, s.local_rank, s.local_world))
                .collect::<Vec<_>>(),
            [(0, 0, 2), (0, 1, 2), (1, 0, 1)]
        );
        assert_eq!(threads_per_rank(None, 2, 2), 1);
        assert_eq!(threads_per_rank(None, 16, 3), 5);
        assert_eq!(threads_per_rank(None, 1, 8), 1);
        assert_eq!(threads_per_rank(Some(12), 2, 2), 12);
    }
}
