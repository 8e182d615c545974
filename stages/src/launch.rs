//! How a stage starts its per-rank processes (training workers, device probes): as children
//! of the stage on this machine, or, inside a Slurm job (the Slurm executor sets
//! `ZFLOW_EXECUTOR=slurm`), as one `srun` job step per rank on the job's nodes. One step per
//! rank keeps what the supervisor relies on: a pipe, an exit status and a process group per
//! rank, so a crash is blamed on the right rank and a hung rank can be stopped alone.
//!
//! Ranks fill nodes in blocks ([`Slot`]). Each rank binds exactly one device, named in its
//! environment ([`RankLaunch::env`]): on this machine device `LOCAL_RANK`; in a Slurm step,
//! which asks for one GPU (`--gpus-per-task=1`), the one GPU Slurm made visible to it (index
//! 0). The worker checks at start that no two ranks share a (host, device).

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

/// One rank's process: its slot, program, arguments and the environment zflow gives it.
#[derive(Clone, Debug)]
pub struct RankLaunch {
    /// Where it runs.
    pub slot: Slot,
    /// The program: the engine's, or `srun` in a Slurm job.
    pub program: OsString,
    /// Its arguments.
    pub args: Vec<OsString>,
    /// Its environment: the placement, its device and threads, and the launch's `env`.
    pub env: Vec<(String, String)>,
}

impl RankLaunch {
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

    /// The processes of every rank, each running `engine` (program, arguments, environment),
    /// meeting at `placements` (one per rank, in rank order; none for ranks that form no
    /// group, such as device probes).
    pub fn ranks(
        &self,
        engine: &crate::engine::EngineCommand,
        placements: &[Placement],
    ) -> Vec<RankLaunch> {
        slots(self.world, self.nodes())
            .into_iter()
            .map(|slot| {
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
                            .map(|(k, v)| (k.to_string(), v)),
                    );
                }
                env.push((env::LOCAL_RANK.into(), slot.local_rank.to_string()));
                env.push((env::LOCAL_WORLD.into(), slot.local_world.to_string()));
                if self.gpus() {
                    // A Slurm step sees only the GPU it asked for.
                    let device = match self.target {
                        Target::Local => slot.local_rank,
                        Target::Slurm(_) => 0,
                    };
                    env.push((env::DEVICE.into(), device.to_string()));
                }
                env.push((THREADS.into(), self.threads.to_string()));
                for (key, value) in &self.env {
                    // A recipe's PYTHONPATH adds to the engine's: the worker's own package
                    // must stay importable (without the fork server, which has it, a
                    // replaced one ended every rank with "No module named 'zflow_torch'").
                    let ours = engine.env.iter().find(|(k, _)| k == PYTHONPATH && key == k);
                    let value = match ours {
                        Some((_, ours)) => format!("{}:{value}", ours.to_string_lossy()),
                        None => value.clone(),
                    };
                    env.push((key.clone(), value));
                }
                let (program, args) = match self.target {
                    Target::Local => (engine.program.clone().into_os_string(), engine.args.clone()),
                    Target::Slurm(_) => {
                        let mut args: Vec<OsString> = self
                            .step_options(slot)
                            .into_iter()
                            .map(OsString::from)
                            .collect();
                        args.push(engine.program.clone().into_os_string());
                        args.extend(engine.args.iter().cloned());
                        ("srun".into(), args)
                    }
                };
                RankLaunch {
                    slot,
                    program,
                    args,
                    env,
                }
            })
            .collect()
    }

    /// `srun` options running `slot`'s rank as its own job step on its node, with its cores
    /// and (on GPUs) one device of its own.
    fn step_options(&self, slot: Slot) -> Vec<String> {
        let mut o = vec![
            "--ntasks=1".to_string(),
            "--nodes=1".to_string(),
            "--exact".to_string(),
            "--kill-on-bad-exit=0".to_string(),
            "--quiet".to_string(),
            format!("--relative={}", slot.node),
            format!("--cpus-per-task={}", self.threads),
            format!("--job-name={}-rank{}", self.stage, slot.rank),
        ];
        if self.gpus() {
            o.push("--gpus-per-task=1".to_string());
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

    fn var<'a>(r: &'a RankLaunch, name: &str) -> Option<&'a str> {
        r.env
            .iter()
            .rev()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// Each rank's (node, LOCAL_RANK, device it binds) for `nodes` x `per_node` ranks.
    fn binding(target: Target, per_node: usize, backend: &str) -> Vec<(usize, String, String)> {
        let nodes = match target {
            Target::Local => 1,
            Target::Slurm(j) => j.hosts.len(),
        };
        let spec = LaunchSpec {
            target,
            world: nodes * per_node,
            backend,
            threads: 2,
            env: vec![
                ("NCCL_DEBUG".into(), "WARN".into()),
                (PYTHONPATH.into(), "/recipe/lib".into()),
            ],
            stage: "train.p1",
        };
        let placements = Placement::local(spec.world).unwrap();
        spec.ranks(&engine(), &placements)
            .iter()
            .map(|r| {
                assert_eq!(var(r, "NCCL_DEBUG"), Some("WARN"));
                // The recipe's path after the engine's: the worker stays importable.
                assert_eq!(var(r, PYTHONPATH), Some("/w:/recipe/lib"));
                assert_eq!(var(r, THREADS), Some("2"));
                assert_eq!(
                    var(r, env::LOCAL_WORLD),
                    Some(per_node.to_string().as_str())
                );
                (
                    r.slot.node,
                    var(r, env::LOCAL_RANK).unwrap().to_string(),
                    var(r, env::DEVICE).unwrap_or("-").to_string(),
                )
            })
            .collect()
    }

    #[test]
    fn every_rank_binds_its_own_device_for_1_2_and_8_ranks_per_node() {
        for per_node in [1, 2, 8] {
            // On this machine: device = LOCAL_RANK, all different.
            let local = binding(Target::Local, per_node, "cuda");
            let want: Vec<_> = (0..per_node)
                .map(|i| (0, i.to_string(), i.to_string()))
                .collect();
            assert_eq!(local, want);

            // Under Slurm on 2 nodes: LOCAL_RANK counts per node; each step asks for one GPU
            // and binds the one Slurm made visible (index 0).
            let job = SlurmJob::on_hosts(7, vec!["n0".into(), "n1".into()]);
            let slurm = binding(Target::Slurm(&job), per_node, "rocm");
            let want: Vec<_> = (0..2 * per_node)
                .map(|r| (r / per_node, (r % per_node).to_string(), "0".to_string()))
                .collect();
            assert_eq!(slurm, want);

            // On the CPU no device is bound.
            assert!(
                binding(Target::Local, per_node, "cpu")
                    .iter()
                    .all(|(_, _, d)| d == "-")
            );
        }
    }

    #[test]
    fn slurm_steps_run_on_their_node_with_their_cores_and_one_gpu() {
        let job = SlurmJob {
            id: 42,
            hosts: vec!["a".into(), "b".into()],
            addresses: vec!["10.0.0.1".into(), "10.0.0.2".into()],
        };
        let spec = LaunchSpec {
            target: Target::Slurm(&job),
            world: 4,
            backend: "cuda",
            threads: 6,
            env: vec![],
            stage: "train.p1",
        };
        let p = spec.placements().unwrap();
        assert!(
            p.iter().all(|p| p.rendezvous.starts_with("10.0.0.1:")) && p[3].rank == 3,
            "{p:?}"
        );
        let ranks = spec.ranks(&engine(), &p);
        let args: Vec<String> = ranks[3]
            .args
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        assert_eq!(ranks[3].program, "srun");
        for want in [
            "--relative=1",
            "--cpus-per-task=6",
            "--gpus-per-task=1",
            "--job-name=train.p1-rank3",
        ] {
            assert!(args.contains(&want.to_string()), "{want}: {args:?}");
        }
        assert_eq!(
            &args[args.len() - 3..],
            ["/venv/bin/python", "-m", "zflow_torch.worker"]
        );
        let line = ranks[3].shell_line();
        assert!(
            line.contains("LOCAL_RANK=1 ") && line.contains(" srun --ntasks=1"),
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
