//! How a stage starts its per-rank processes (training workers, device probes): as children
//! of the stage on this machine, or, inside a Slurm job (the Slurm executor sets
//! `ZFLOW_EXECUTOR=slurm`), as one `srun` job step per rank on the job's nodes. One step per
//! rank keeps what the supervisor relies on: a pipe, an exit status and a process group per
//! rank, so a crash is blamed on the right rank and a hung rank can be stopped alone.

use std::process::Command;

use anyhow::{Context, Result, ensure};
use zflow_runtime::dist::placement::{Placement, free_port};

/// The job this stage runs in, when it runs under the Slurm executor.
#[derive(Clone, Debug, PartialEq)]
pub struct SlurmJob {
    /// `SLURM_JOB_ID`.
    pub id: u64,
    /// The job's nodes, in Slurm's order (`scontrol show hostnames $SLURM_JOB_NODELIST`).
    pub hosts: Vec<String>,
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
        Ok(Some(SlurmJob {
            id: id.parse().with_context(|| format!("SLURM_JOB_ID={id:?}"))?,
            hosts,
        }))
    }

    /// The node rank `rank` of `world` runs on: ranks fill nodes in blocks, as `srun` places
    /// tasks.
    pub fn node_of(&self, rank: usize, world: usize) -> usize {
        rank * self.hosts.len() / world.max(1)
    }

    /// Placements for `world` ranks on the job's nodes. Rank 0's rendezvous is on the first
    /// node (where this supervisor runs).
    pub fn placements(&self, world: usize) -> Result<Vec<Placement>> {
        if self.hosts.len() == 1 {
            return Placement::local(world);
        }
        let rendezvous = format!("{}:{}", self.hosts[0], free_port()?);
        let secret = zflow_runtime::dist::secret::generate_secret()?;
        Ok((0..world)
            .map(|rank| Placement {
                rank,
                world,
                rendezvous: rendezvous.clone(),
                secret: secret.clone(),
            })
            .collect())
    }

    /// `srun` running `program` as rank `rank`'s own job step on its node.
    pub fn step(
        &self,
        program: &std::path::Path,
        rank: usize,
        world: usize,
        name: &str,
    ) -> Command {
        let mut cmd = Command::new("srun");
        cmd.args([
            "--ntasks=1",
            "--nodes=1",
            "--exact",
            "--kill-on-bad-exit=0",
            "--quiet",
            &format!("--relative={}", self.node_of(rank, world)),
            &format!("--job-name={name}-rank{rank}"),
        ]);
        cmd.arg(program);
        cmd
    }
}

/// The command for rank `rank` of `world`: `program` itself, or an `srun` step inside a job.
pub fn rank_command(
    job: Option<&SlurmJob>,
    program: &std::path::Path,
    rank: usize,
    world: usize,
    name: &str,
) -> Command {
    match job {
        Some(job) => job.step(program, rank, world, name),
        None => Command::new(program),
    }
}

/// Placements for `world` ranks: on this machine, or on the Slurm job's nodes.
pub fn placements(job: Option<&SlurmJob>, world: usize) -> Result<Vec<Placement>> {
    match job {
        Some(job) => job.placements(world),
        None => Placement::local(world),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranks_fill_nodes_in_blocks_and_steps_name_their_node() {
        let job = SlurmJob {
            id: 42,
            hosts: vec!["a".into(), "b".into()],
        };
        let nodes: Vec<usize> = (0..4).map(|r| job.node_of(r, 4)).collect();
        assert_eq!(nodes, [0, 0, 1, 1]);
        let p = job.placements(4).unwrap();
        assert!(
            p.iter().all(|p| p.rendezvous.starts_with("a:")) && p[3].rank == 3,
            "{p:?}"
        );
        let cmd = job.step(std::path::Path::new("/bin/zflow"), 3, 4, "train.p1");
        let args: Vec<String> = cmd
            .get_args()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        assert_eq!(cmd.get_program(), "srun");
        assert!(
            args.contains(&"--relative=1".to_string()) && args.last().unwrap() == "/bin/zflow",
            "{args:?}"
        );
    }
}
