//! The processes of one launch (`crate::launch::ProcessLaunch`), started, and what their ranks
//! write and how they end, as one stream of `(rank, RankOutput)`: a rank on this machine is
//! its own process, read directly; a node agent's ranks (`crate::node_agent`) arrive as its
//! [`AgentLine`]s. Either way each rank ends once, with its own exit status.

use std::io::{BufRead, BufReader};
use std::process::{Command, ExitStatus};
use std::sync::mpsc::{Receiver, Sender, channel};
use std::time::Duration;

use anyhow::{Context, Result};
use zflow_pipeline::supervise::{Supervised, spawn_supervised, terminate_group};

use crate::launch::ProcessLaunch;
use crate::node_agent::AgentLine;

/// What a rank of a launch did.
#[derive(Debug)]
pub enum RankOutput {
    /// It wrote a line to its stdout.
    Line(String),
    /// Its node agent is still starting it: a sign of life, not a line.
    Starting,
    /// Its output ended: with the exit status its node agent reported, or `None` where
    /// [`Running::wait`] gives it (its own process, or an agent that ended first).
    Ended(Option<ExitStatus>),
}

/// One started process and the ranks it runs.
struct Process {
    child: Supervised,
    ranks: std::ops::Range<usize>,
    exited: Option<ExitStatus>,
}

/// A launch's processes, running.
pub struct Running {
    processes: Vec<Process>,
}

impl Running {
    /// Starts `launches`, each as the [`Command`] `command` makes of it (environment,
    /// directory, stdin and stderr: its stdout is piped here), in a process group of its own.
    /// Returns them with what each rank does, in the order it happened.
    pub fn start(
        launches: &[ProcessLaunch],
        mut command: impl FnMut(&ProcessLaunch) -> Result<Command>,
    ) -> Result<(Running, Receiver<(usize, RankOutput)>)> {
        let (tx, output) = channel();
        let mut processes = Vec::new();
        for launch in launches {
            let mut cmd = command(launch)?;
            cmd.stdout(std::process::Stdio::piped());
            let mut child = spawn_supervised(&mut cmd).with_context(|| {
                format!(
                    "starting rank(s) {}..{}: {}",
                    launch.ranks.start,
                    launch.ranks.end,
                    cmd.get_program().to_string_lossy()
                )
            })?;
            let stdout = child.stdout.take().expect("piped stdout");
            let (tx, ranks, agent) = (tx.clone(), launch.ranks.clone(), launch.agent);
            std::thread::spawn(move || relay(BufReader::new(stdout), ranks, agent, tx));
            processes.push(Process {
                child,
                ranks: launch.ranks.clone(),
                exited: None,
            });
        }
        Ok((Running { processes }, output))
    }

    fn process_of(&mut self, rank: usize) -> &mut Process {
        self.processes
            .iter_mut()
            .find(|p| p.ranks.contains(&rank))
            .expect("a rank of the launch")
    }

    /// The exit status of the process that runs `rank`, once it has exited: for a rank of
    /// its own, the rank's; for a node agent's rank whose end came as [`RankOutput::Ended`]
    /// with no status, the agent's (`srun`'s, when the node was lost).
    pub fn wait(&mut self, rank: usize) -> Result<ExitStatus> {
        let p = self.process_of(rank);
        if let Some(status) = p.exited {
            return Ok(status);
        }
        let status = p.child.wait()?;
        p.exited = Some(status);
        Ok(status)
    }

    /// Whether the process that runs `rank` has exited (a node agent exits after all its
    /// ranks, whose own statuses come as [`RankOutput::Ended`]).
    pub fn try_wait(&mut self, rank: usize) -> Result<Option<ExitStatus>> {
        let p = self.process_of(rank);
        if p.exited.is_none() {
            p.exited = p.child.try_wait()?;
        }
        Ok(p.exited)
    }

    /// Stops every process still running (SIGTERM to its group, SIGKILL after 5 s): a node
    /// agent's ranks die with it.
    pub fn stop_all(&mut self) {
        for p in self.processes.iter_mut().filter(|p| p.exited.is_none()) {
            terminate_group(p.child.id() as i32, Duration::from_secs(5), &mut p.child);
            p.exited = p.child.try_wait().ok().flatten();
        }
    }
}

/// Reads one process's stdout to its end and sends what its ranks did: its own lines for a
/// process of one rank, the [`AgentLine`]s of a node agent (anything else it writes counts
/// as its first rank's). Every rank not yet ended ends with the stream.
fn relay(
    stdout: impl BufRead,
    ranks: std::ops::Range<usize>,
    agent: bool,
    tx: Sender<(usize, RankOutput)>,
) {
    let mut ended = vec![false; ranks.len()];
    for line in stdout.lines().map_while(Result::ok) {
        let (rank, what) = match agent.then(|| AgentLine::parse(&line)).flatten() {
            Some(AgentLine::Line { rank, line }) => (rank, RankOutput::Line(line)),
            Some(AgentLine::Starting { rank }) => (rank, RankOutput::Starting),
            Some(exit @ AgentLine::Exit { rank, .. }) => {
                (rank, RankOutput::Ended(exit.exit_status()))
            }
            None => (ranks.start, RankOutput::Line(line)),
        };
        if !ranks.contains(&rank) {
            continue;
        }
        if let RankOutput::Ended(_) = what {
            ended[rank - ranks.start] = true;
        }
        if tx.send((rank, what)).is_err() {
            return;
        }
    }
    for (i, rank) in ranks.enumerate() {
        if !ended[i] && tx.send((rank, RankOutput::Ended(None))).is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn collect(text: &str, ranks: std::ops::Range<usize>, agent: bool) -> Vec<String> {
        let (tx, rx) = channel();
        relay(std::io::Cursor::new(text.to_string()), ranks, agent, tx);
        rx.iter()
            .map(|(rank, what)| match what {
                RankOutput::Line(l) => format!("{rank}: {l}"),
                RankOutput::Starting => format!("{rank} starting"),
                RankOutput::Ended(s) => format!("{rank} ended {:?}", s.and_then(|s| s.code())),
            })
            .collect()
    }

    #[test]
    fn an_agents_lines_become_its_ranks_and_a_lost_agent_ends_them_all() {
        let text = [
            r#"{"agent":"starting","rank":6}"#,
            r#"{"agent":"line","rank":4,"line":"{\"type\":\"heartbeat\",\"step\":1}"}"#,
            "srun: a line of its own",
            r#"{"agent":"exit","rank":5,"status":256}"#,
            r#"{"agent":"line","rank":99,"line":"not this node's"}"#,
        ]
        .join("\n");
        assert_eq!(
            collect(&text, 4..7, true),
            [
                "6 starting",
                r#"4: {"type":"heartbeat","step":1}"#,
                "4: srun: a line of its own",
                "5 ended Some(1)",
                "4 ended None",
                "6 ended None",
            ]
        );
        // A process of one rank: its lines as they are, then its end.
        assert_eq!(
            collect(r#"{"agent":"exit","rank":0,"status":0}"#, 0..1, false),
            [r#"0: {"agent":"exit","rank":0,"status":0}"#, "0 ended None"]
        );
    }
}
