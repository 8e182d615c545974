//! The torch engine's fork server, for processes on this machine's CPU.
//!
//! Importing torch and transformers costs a Python process 5-6 s of CPU: on a CPU, more than a
//! small model's rank spends training, and paid again at every launch, relaunch and scorer.
//! `workers/torch/zflow_torch/forkserver.py` imports them once and forks each process from
//! there. This file starts one such server per `zflow` process, at its first use, and turns a
//! torch command (`python -m MODULE ARGS`) into that of a client which has the server fork
//! `MODULE` with the client's arguments, environment, working directory, process group and
//! stdio, and then ends as the child ends (exit status or signal). To the supervisor it is the
//! process it started: same pipes, same group, same way of ending.
//!
//! Only for CPU processes (train ranks on `backend: cpu` without Slurm, CPU scorers, and the
//! ranks a node agent starts on a CPU node of a Slurm job, `crate::node_agent`, whose server is
//! its node's): on GPUs the import is nothing beside the run.
//! `ZFLOW_TORCH_FORK=0` turns it off; a server that fails to start is logged and each process
//! then starts plainly.
//!
//! Invariants: the server's socket is in a folder of its own (mode 0700) and it serves only
//! peers of this user; it is in a process group of its own (a Ctrl-C to zflow's group does not
//! reach it); it ends, with everything it forked, when its stdin (held by this process) closes,
//! so when zflow ends however it ends.

use std::ffi::OsString;
use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use anyhow::{Context, Result, bail};

use crate::engine::{EngineCommand, torch_module, torch_worker_dir};

/// Set to `0`, every torch process starts as its own Python.
pub const FORK: &str = "ZFLOW_TORCH_FORK";

/// The running server.
struct Server {
    /// Its Unix socket.
    socket: PathBuf,
    /// Held, never written: the server ends when it closes.
    _stdin: ChildStdin,
    /// To notice that it died (then processes start plainly).
    child: Mutex<Child>,
}

static SERVER: OnceLock<Option<Server>> = OnceLock::new();

/// `engine` (a torch command, `python -m MODULE ARGS`) as a client of this process's fork
/// server, which is started on first use; `engine` itself when forking is off, the server
/// could not start or has died, or the command is not of that form.
pub fn wrap(engine: EngineCommand) -> EngineCommand {
    if std::env::var_os(FORK).is_some_and(|v| v == "0") || engine.args.first() != Some(&"-m".into())
    {
        return engine;
    }
    let server = SERVER.get_or_init(|| match start() {
        Ok(server) => Some(server),
        Err(e) => {
            tracing::warn!(
                "the torch fork server did not start, so each process imports torch itself: {e:#}"
            );
            None
        }
    });
    let Some(server) = server else {
        return engine;
    };
    let alive = server
        .child
        .lock()
        .map(|mut c| matches!(c.try_wait(), Ok(None)))
        .unwrap_or(false);
    if !alive {
        tracing::warn!("the torch fork server has ended; starting the process plainly");
        return engine;
    }
    let script = torch_worker_dir().join("zflow_torch/forkserver.py");
    let mut args: Vec<OsString> = vec![
        "-E".into(),
        "-S".into(),
        script.into(),
        "run".into(),
        server.socket.clone().into(),
        "--".into(),
    ];
    args.extend(engine.args);
    EngineCommand {
        program: engine.program,
        args,
        env: engine.env,
    }
}

/// Starts the server and waits until it has imported torch and listens.
fn start() -> Result<Server> {
    let python = torch_module("zflow_torch.forkserver", Vec::new())?;
    // The server removes the folder when it ends.
    let dir = private_folder()?;
    let socket = dir.join("socket");
    let mut cmd = Command::new(&python.program);
    cmd.args(&python.args)
        .arg("serve")
        .arg(&socket)
        .envs(python.env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        // Through this process, not inherited: the server may outlive zflow by a moment, and
        // must not hold a pipe zflow's own caller waits on.
        .stderr(Stdio::piped());
    // Not `spawn_supervised`: its PR_SET_PDEATHSIG fires when the spawning thread exits, and
    // the server outlives the stage thread that first needs it. Its stdin ties it to zflow.
    {
        use std::os::unix::process::CommandExt;
        // SAFETY: setpgid is async-signal-safe.
        unsafe {
            cmd.pre_exec(|| {
                libc::setpgid(0, 0);
                Ok(())
            });
        }
    }
    let mut child = cmd.spawn().context("starting the torch fork server")?;
    let stdin = child.stdin.take().expect("piped stdin");
    let stdout = child.stdout.take().expect("piped stdout");
    let stderr = child.stderr.take().expect("piped stderr");
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            tracing::warn!("torch fork server: {line}");
        }
    });
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = BufReader::new(stdout).read_line(&mut line);
        let _ = tx.send(line);
    });
    match rx.recv_timeout(Duration::from_secs(300)) {
        Ok(line) if line.trim() == "ready" => {}
        other => {
            let _ = child.kill();
            let _ = child.wait();
            let _ = std::fs::remove_dir_all(&dir);
            bail!("it did not say `ready` (it said {other:?})");
        }
    }
    tracing::info!("torch fork server ready at {}", socket.display());
    Ok(Server {
        socket,
        _stdin: stdin,
        child: Mutex::new(child),
    })
}

/// A new folder for the server's socket, mode 0700 whatever the umask: mkdir's mode can only
/// lose bits to the umask (so no one else ever may enter it), and the chmod after it is not
/// masked. The server checks mode and owner before it binds, and each client before it
/// connects (`workers/torch/zflow_torch/forkserver.py`).
fn private_folder() -> Result<PathBuf> {
    let owner_only = || std::fs::Permissions::from_mode(0o700);
    let dir = tempfile::Builder::new()
        .prefix("zflow-fork-")
        .permissions(owner_only())
        .tempdir()
        .context("creating the fork server's folder")?
        .keep();
    std::fs::set_permissions(&dir, owner_only())
        .with_context(|| format!("making {} its owner's alone", dir.display()))?;
    Ok(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_socket_folder_is_the_owners_alone_under_any_umask() {
        for umask in [0o000, 0o002, 0o077, 0o700] {
            // SAFETY: umask only sets this process's file-creation mask.
            let before = unsafe { libc::umask(umask) };
            let dir = private_folder();
            unsafe { libc::umask(before) };
            let dir = dir.unwrap();
            let mode = std::fs::metadata(&dir).unwrap().permissions().mode() & 0o7777;
            std::fs::remove_dir(&dir).unwrap();
            assert_eq!(mode, 0o700, "umask {umask:03o}");
        }
    }

    #[test]
    fn only_python_module_commands_are_wrapped() {
        let plain = EngineCommand {
            program: "/bin/true".into(),
            args: vec!["--version".into()],
            env: vec![],
        };
        assert_eq!(wrap(plain.clone()).args, plain.args);
    }
}
