//! One node's ranks under one process: `zflow node-agent`, which a Slurm launch runs as one
//! job step per node (`crate::launch`), torchrun-style. It starts the node's ranks, each in a
//! process group of its own, and relays what each says and how each ends to the supervisor
//! as [`AgentLine`]s on its stdout, so the supervisor keeps a pipe and an exit status per rank
//! with one `srun` client per node.
//!
//! The ranks inherit the agent's environment (the launch's variables, which `srun` carries),
//! plus their own place: [`env::RANK`], [`env::LOCAL_RANK`] and, on GPUs, [`env::DEVICE`]
//! (their local rank among the GPUs the step was given). On a CPU node the ranks of a torch
//! engine are forked from the agent's own fork server (`crate::forkserver`), which imports
//! torch once per node, not once per rank. Their stderr is the agent's, which
//! `srun` forwards to the stage's log. When the agent is stopped (`srun` forwards the
//! supervisor's SIGTERM, or the node's step ends), its ranks die with it (`PR_SET_PDEATHSIG`,
//! `zflow_pipeline::supervise::spawn_supervised`).

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use zflow_pipeline::supervise::spawn_supervised;
use zflow_runtime::contract::env;

/// One line of a node agent's stdout: a rank's line, or its end.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "agent", rename_all = "snake_case")]
pub enum AgentLine {
    /// A line the rank wrote to its stdout (the engine contract's messages, or any text).
    Line {
        /// The rank (in the launch).
        rank: usize,
        /// The line, without its newline.
        line: String,
    },
    /// The agent is still starting the rank (its fork server imports torch): a sign of life,
    /// sent every heartbeat period ([`env::HEARTBEAT_S`]) until the ranks start, so a slow
    /// start is not taken for a hang.
    Starting {
        /// The rank.
        rank: usize,
    },
    /// The rank's output ended and it exited.
    Exit {
        /// The rank.
        rank: usize,
        /// Its wait status as `waitpid(2)` gives it (`ExitStatusExt::from_raw` reads it).
        status: i32,
    },
}

impl AgentLine {
    /// Parses one line of an agent's stdout; `None` for anything else (a line `srun` itself
    /// wrote, say).
    pub fn parse(line: &str) -> Option<AgentLine> {
        serde_json::from_str(line).ok()
    }

    /// The exit status this line reports, if it is an [`AgentLine::Exit`].
    pub fn exit_status(&self) -> Option<ExitStatus> {
        use std::os::unix::process::ExitStatusExt;
        match self {
            AgentLine::Exit { status, .. } => Some(ExitStatus::from_raw(*status)),
            AgentLine::Line { .. } | AgentLine::Starting { .. } => None,
        }
    }
}

/// What one node agent runs: ranks `first_rank..first_rank + local_world`, each `program`
/// with `args`.
#[derive(Clone, Debug)]
pub struct NodeRanks {
    /// The node's first rank.
    pub first_rank: usize,
    /// Ranks on the node.
    pub local_world: usize,
    /// Whether each rank binds a GPU (the one at its local rank).
    pub bind_devices: bool,
    /// The engine's program.
    pub program: String,
    /// Its arguments.
    pub args: Vec<String>,
}

impl NodeRanks {
    /// Its ranks.
    pub fn ranks(&self) -> std::ops::Range<usize> {
        self.first_rank..self.first_rank + self.local_world
    }

    /// The agent's arguments after `zflow node-agent` (`src/main.rs` reads them back).
    pub fn to_args(&self) -> Vec<String> {
        let mut a = vec![
            self.first_rank.to_string(),
            self.local_world.to_string(),
            if self.bind_devices { "gpu" } else { "cpu" }.to_string(),
            "--".to_string(),
            self.program.clone(),
        ];
        a.extend(self.args.iter().cloned());
        a
    }
}

/// Runs the node's ranks and relays them (see the module page). Returns when every rank has
/// exited: 0 when all succeeded, else 1 (the supervisor reads each rank's own status).
pub fn run(node: &NodeRanks) -> Result<i32> {
    relay(node, std::io::stdout())
}

/// [`run`], writing the [`AgentLine`]s to `out`.
fn relay<W: Write + Send + 'static>(node: &NodeRanks, out: W) -> Result<i32> {
    let out = Arc::new(Mutex::new(out));
    let emit = |out: &Mutex<W>, line: &AgentLine| {
        let text = serde_json::to_string(line).expect("serialisable");
        let mut out = out.lock().expect("stdout lock");
        // A supervisor that is gone reads nothing: the ranks go on until the step ends.
        let _ = writeln!(out, "{text}");
        let _ = out.flush();
    };
    let mut engine = crate::engine::EngineCommand {
        program: node.program.clone().into(),
        args: node.args.iter().map(Into::into).collect(),
        env: Vec::new(),
    };
    if !node.bind_devices {
        // The server imports torch first, seconds in which no rank can speak: a sign of life
        // for each rank every heartbeat period until it is up (the sender dropped).
        let (started, waiting) = std::sync::mpsc::channel::<()>();
        let signs = {
            let (out, ranks) = (out.clone(), node.ranks());
            let every = std::time::Duration::from_secs_f64(
                std::env::var(env::HEARTBEAT_S)
                    .ok()
                    .and_then(|s| s.parse().ok())
                    .unwrap_or(15.0),
            );
            std::thread::spawn(move || {
                loop {
                    for rank in ranks.clone() {
                        emit(&out, &AgentLine::Starting { rank });
                    }
                    if waiting.recv_timeout(every)
                        != Err(std::sync::mpsc::RecvTimeoutError::Timeout)
                    {
                        return;
                    }
                }
            })
        };
        engine = crate::forkserver::wrap(engine);
        drop(started);
        let _ = signs.join();
    }
    let mut relays = Vec::new();
    for local in 0..node.local_world {
        let rank = node.first_rank + local;
        let mut cmd = Command::new(&engine.program);
        cmd.args(&engine.args)
            .envs(engine.env.iter().map(|(k, v)| (k, v)))
            .env(env::RANK, rank.to_string())
            .env(env::LOCAL_RANK, local.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::piped());
        if node.bind_devices {
            cmd.env(env::DEVICE, local.to_string());
        }
        let mut child = spawn_supervised(&mut cmd)
            .with_context(|| format!("starting rank {rank}: {}", node.program))?;
        let stdout = child.stdout.take().expect("piped stdout");
        let out = out.clone();
        relays.push(std::thread::spawn(move || -> bool {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                emit(&out, &AgentLine::Line { rank, line });
            }
            use std::os::unix::process::ExitStatusExt;
            // A rank that cannot be waited for is reported as killed (SIGKILL's status).
            let status = child.wait().map(|s| s.into_raw()).unwrap_or(libc::SIGKILL);
            emit(&out, &AgentLine::Exit { rank, status });
            status == 0
        }));
    }
    let mut all_ok = true;
    for relay in relays {
        all_ok &= relay.join().unwrap_or(false);
    }
    Ok(if all_ok { 0 } else { 1 })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arguments_and_lines_read_back() {
        let node = NodeRanks {
            first_rank: 8,
            local_world: 4,
            bind_devices: true,
            program: "/venv/bin/python".into(),
            args: vec!["-m".into(), "zflow_torch.worker".into()],
        };
        assert_eq!(
            node.to_args(),
            [
                "8",
                "4",
                "gpu",
                "--",
                "/venv/bin/python",
                "-m",
                "zflow_torch.worker"
            ]
        );

        let line = AgentLine::Line {
            rank: 9,
            line: r#"{"type":"heartbeat","step":3}"#.into(),
        };
        let text = serde_json::to_string(&line).unwrap();
        assert_eq!(AgentLine::parse(&text), Some(line));
        // Exit status 3, as waitpid gives it (code << 8), and a SIGKILL.
        let exit = AgentLine::parse(r#"{"agent":"exit","rank":9,"status":768}"#).unwrap();
        assert_eq!(exit.exit_status().unwrap().code(), Some(3));
        let killed = AgentLine::Exit { rank: 9, status: 9 };
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(killed.exit_status().unwrap().signal(), Some(9));
        assert_eq!(AgentLine::parse("srun: error: node lost"), None);
    }

    /// A writer into a buffer the test keeps.
    #[derive(Clone, Default)]
    struct Shared(Arc<Mutex<Vec<u8>>>);

    impl Write for Shared {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().write(buf)
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn the_agent_runs_its_ranks_and_reports_each_line_and_exit() {
        let node = NodeRanks {
            first_rank: 2,
            local_world: 2,
            bind_devices: true,
            program: "sh".into(),
            args: vec![
                "-c".into(),
                format!(
                    "echo rank ${} device ${}; exit ${}",
                    env::RANK,
                    env::DEVICE,
                    env::LOCAL_RANK
                ),
            ],
        };
        let out = Shared::default();
        assert_eq!(relay(&node, out.clone()).unwrap(), 1);
        let text = String::from_utf8(out.0.lock().unwrap().clone()).unwrap();
        let mut lines: Vec<AgentLine> =
            text.lines().map(|l| AgentLine::parse(l).unwrap()).collect();
        lines.sort_by_key(|l| match l {
            AgentLine::Starting { rank } => (*rank, 0),
            AgentLine::Line { rank, .. } => (*rank, 1),
            AgentLine::Exit { rank, .. } => (*rank, 2),
        });
        assert_eq!(
            lines[0],
            AgentLine::Line {
                rank: 2,
                line: "rank 2 device 0".into()
            }
        );
        assert_eq!(lines[1].exit_status().unwrap().code(), Some(0));
        assert_eq!(
            lines[2],
            AgentLine::Line {
                rank: 3,
                line: "rank 3 device 1".into()
            }
        );
        assert_eq!(lines[3].exit_status().unwrap().code(), Some(1));
    }
}
