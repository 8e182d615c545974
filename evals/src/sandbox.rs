//! A sandbox for model-written programs (HumanEval, MBPP): each program runs in a child process
//! that cannot reach the network, the store or the user's files, and cannot outlive its limits.
//!
//! The isolation is [hakoniwa]'s (Linux namespaces and rlimits), not ours:
//! - its own user, mount, PID and network namespaces: the network namespace has only a loopback
//!   that is down, and the PID namespace dies with its first process, children included;
//! - a root file system of read-only binds of the system folders (`/usr`, `/bin`, `/lib*`,
//!   `/etc`, `/sbin`), the Python installation's own folder, a fresh `/tmp` and `/dev`, and a
//!   scratch folder (`/sandbox`, the working directory) removed afterwards; nothing else of the
//!   host is mounted;
//! - rlimits on CPU time, address space, file size and processes, and a wall-clock timeout.
//!
//! A program passes when it exits with status 0 within its limits; anything else (an exception,
//! a signal, a limit, the timeout) is a failure, as in lm-eval's `code_eval`.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};
use hakoniwa::{Container, Namespace, Rlimit};

/// What a sandboxed program may use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Wall-clock seconds before the program and all its children are killed.
    pub wall_secs: u64,
    /// CPU seconds (`RLIMIT_CPU`).
    pub cpu_secs: u64,
    /// Address space in bytes (`RLIMIT_AS`).
    pub memory_bytes: u64,
    /// The largest file it may write, in bytes (`RLIMIT_FSIZE`).
    pub file_bytes: u64,
    /// Processes it may have at once, itself included (`RLIMIT_NPROC`).
    pub processes: u64,
}

impl Default for Limits {
    /// lm-eval's `code_eval` timeout (3 s), 1 GiB, 16 MiB files, 16 processes.
    fn default() -> Self {
        Limits {
            wall_secs: 3,
            cpu_secs: 3,
            memory_bytes: 1 << 30,
            file_bytes: 16 << 20,
            processes: 16,
        }
    }
}

/// How a sandboxed run ended.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// Exit status 0.
    Passed,
    /// Any other exit status.
    Failed {
        /// The exit status.
        code: i32,
    },
    /// Killed by a signal (an rlimit's, or the wall-clock timeout's SIGKILL).
    Killed {
        /// The signal's number.
        signal: i32,
    },
    /// The sandbox itself could not start the program.
    NotRun {
        /// Why.
        reason: String,
    },
}

impl Outcome {
    /// Whether the program passed.
    pub fn passed(&self) -> bool {
        *self == Outcome::Passed
    }
}

/// One program's result.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Run {
    /// How it ended.
    pub outcome: Outcome,
    /// The last 2 KB of what it wrote to stderr (a traceback, usually), for samples.
    pub stderr: String,
}

/// A Python interpreter behind the sandbox's walls.
#[derive(Debug, Clone)]
pub struct PythonSandbox {
    /// The interpreter's real path (no venv, no symlink), the same inside and out.
    executable: PathBuf,
    /// The installation's folder, bound read-only at its own path when not under a system folder.
    prefix: PathBuf,
    limits: Limits,
}

/// Host folders every sandbox sees, read-only (hakoniwa's `rootfs("/")` set).
const SYSTEM_DIRS: [&str; 7] = ["/bin", "/etc", "/lib", "/lib64", "/lib32", "/sbin", "/usr"];

impl PythonSandbox {
    /// A sandbox running programs with `python` (any interpreter, a venv's included: its base
    /// installation is what runs, with the standard library only, as HumanEval's and MBPP's
    /// programs need).
    pub fn new(python: &Path, limits: Limits) -> Result<PythonSandbox> {
        let out = Command::new(python)
            .args([
                "-I",
                "-c",
                "import sys; print(sys.base_prefix); print(getattr(sys, '_base_executable', sys.executable))",
            ])
            .output()
            .with_context(|| format!("running {}", python.display()))?;
        if !out.status.success() {
            bail!(
                "{} did not say where it is installed: {}",
                python.display(),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let text = String::from_utf8(out.stdout).context("a non-UTF-8 Python path")?;
        let mut lines = text.lines();
        let (Some(prefix), Some(exe)) = (lines.next(), lines.next()) else {
            bail!("{} answered {text:?}", python.display());
        };
        let prefix =
            std::fs::canonicalize(prefix).with_context(|| format!("the Python prefix {prefix}"))?;
        let executable =
            std::fs::canonicalize(exe).with_context(|| format!("the Python executable {exe}"))?;
        Ok(PythonSandbox {
            executable,
            prefix,
            limits,
        })
    }

    /// The limits every program runs under.
    pub fn limits(&self) -> Limits {
        self.limits
    }

    fn container(&self, scratch: &Path) -> Result<Container> {
        let mut c = Container::new();
        c.unshare(Namespace::Network)
            .unshare(Namespace::Ipc)
            .unshare(Namespace::Uts);
        c.rootfs("/")
            .map_err(|e| anyhow::anyhow!("the sandbox's root file system: {e}"))?;
        let under_system = SYSTEM_DIRS
            .iter()
            .any(|d| self.prefix.starts_with(d) || self.executable.starts_with(d));
        if !under_system {
            let prefix = self.prefix.to_str().context("a non-UTF-8 Python prefix")?;
            c.bindmount_ro(prefix, prefix);
        }
        let scratch = scratch.to_str().context("a non-UTF-8 scratch folder")?;
        c.bindmount_rw(scratch, "/sandbox")
            .tmpfsmount("/tmp")
            .devfsmount("/dev");
        let l = self.limits;
        c.setrlimit(Rlimit::Cpu, l.cpu_secs, l.cpu_secs)
            .setrlimit(Rlimit::As, l.memory_bytes, l.memory_bytes)
            .setrlimit(Rlimit::Fsize, l.file_bytes, l.file_bytes)
            .setrlimit(Rlimit::Nproc, l.processes, l.processes)
            .setrlimit(Rlimit::Core, 0, 0);
        Ok(c)
    }

    /// Runs one program (its source text) to its end or its limits.
    pub fn run(&self, program: &str) -> Result<Run> {
        let scratch = tempfile::Builder::new()
            .prefix("zflow-sandbox-")
            .tempdir()
            .context("making the sandbox's scratch folder")?;
        std::fs::write(scratch.path().join("program.py"), program)?;
        let container = self.container(scratch.path())?;
        let exe = self
            .executable
            .to_str()
            .context("a non-UTF-8 Python path")?;
        let output = container
            .command(exe)
            // -I: no user site, no PYTHON* variables, no script folder on sys.path beyond /sandbox.
            .args(["-I", "/sandbox/program.py"])
            .env("PATH", "/usr/bin:/bin")
            .env("HOME", "/sandbox")
            .env("LANG", "C.UTF-8")
            .env("PYTHONHASHSEED", "0")
            .current_dir("/sandbox")
            .wait_timeout(self.limits.wall_secs)
            .output();
        let run = match output {
            Ok(out) => {
                let status = out.status;
                let outcome = match (status.exit_code, status.code) {
                    (Some(0), _) => Outcome::Passed,
                    (Some(code), _) => Outcome::Failed { code },
                    (None, code) if code > 128 && code != 125 => {
                        Outcome::Killed { signal: code - 128 }
                    }
                    (None, _) => Outcome::NotRun {
                        reason: status.reason,
                    },
                };
                Run {
                    outcome,
                    stderr: tail(&out.stderr, 2048),
                }
            }
            Err(e) => Run {
                outcome: Outcome::NotRun {
                    reason: e.to_string(),
                },
                stderr: String::new(),
            },
        };
        // A program that made its scratch folder unremovable (a file without write
        // permission in a read-only directory, say) must not fail the evaluation.
        if let Err(e) = make_removable(scratch.path()) {
            tracing::warn!("sandbox scratch {}: {e}", scratch.path().display());
        }
        drop(scratch);
        Ok(run)
    }

    /// Runs every program, `threads` at a time, results in input order.
    pub fn run_all(&self, programs: &[String], threads: usize) -> Result<Vec<Run>> {
        let threads = threads.clamp(1, programs.len().max(1));
        let next = std::sync::atomic::AtomicUsize::new(0);
        let results: Vec<std::sync::Mutex<Option<Result<Run>>>> =
            programs.iter().map(|_| Default::default()).collect();
        std::thread::scope(|s| {
            for _ in 0..threads {
                s.spawn(|| {
                    loop {
                        let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let Some(p) = programs.get(i) else { break };
                        *results[i].lock().expect("unpoisoned") = Some(self.run(p));
                    }
                });
            }
        });
        results
            .into_iter()
            .map(|r| {
                r.into_inner()
                    .expect("unpoisoned")
                    .expect("every program ran")
            })
            .collect()
    }
}

/// The last `n` bytes of `bytes` as text (cut at a character boundary).
fn tail(bytes: &[u8], n: usize) -> String {
    let text = String::from_utf8_lossy(bytes);
    let mut start = text.len().saturating_sub(n);
    while !text.is_char_boundary(start) {
        start += 1;
    }
    text[start..].to_string()
}

/// Gives the owner write and execute permission on every folder under `dir`, so it can be
/// removed whatever the program did to its permissions.
fn make_removable(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let meta = entry.path().symlink_metadata()?;
        if meta.is_dir() {
            let mut perms = meta.permissions();
            perms.set_mode(perms.mode() | 0o700);
            std::fs::set_permissions(entry.path(), perms)?;
            make_removable(&entry.path())?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
