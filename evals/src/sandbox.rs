//! A sandbox for model-written programs (HumanEval, MBPP): each program runs in a child process
//! that cannot reach the network, the store or the user's files, and cannot outlive its limits.
//!
//! The isolation is [hakoniwa]'s (Linux namespaces and rlimits), not ours:
//! - its own user, mount, PID and network namespaces: the network namespace has only a loopback
//!   that is down, and the PID namespace dies with its first process, children included;
//! - inside, the program is `nobody` (uid and gid [`INSIDE_ID`]), not root: it holds no
//!   capability after its exec, so it can neither remount the read-only binds writable nor
//!   mount anything (in a user namespace of its own, the copied mounts are locked read-only);
//! - on the host, it is the user who runs zflow, or [`ROOT_RUN_ID`] (`nobody`) when that user
//!   is root: a child process that gave up root starts it ([`become_unprivileged`]), so host
//!   root's files (`/etc/shadow`) and root-only kernel settings stay closed to it, and its
//!   process limit binds (the kernel exempts root from it);
//! - a root file system of read-only binds of the system folders (`/usr`, `/bin`, `/lib*`,
//!   `/etc`, `/sbin`) and of the Python installation's own folder, a read-only `/proc` of its own
//!   PID namespace, a minimal `/dev`, and two memory folders of [`Limits::folder_bytes`] each:
//!   `/sandbox` (the working directory, holding `program.py`) and `/tmp`; nothing else of the
//!   host is mounted, and nothing of the host is written;
//! - rlimits on CPU time, address space, file size and processes, and a wall-clock timeout;
//! - stdout discarded and stderr's last [`STDERR_TAIL_BYTES`] kept, read as it comes: a program
//!   that writes without end costs zflow no memory.
//!
//! The rlimits are per process, except the process count: the kernel counts processes per user
//! namespace, so [`Limits::processes`] bounds the whole sandbox, and its memory is at most
//! `processes` x [`Limits::memory_bytes`] plus its two folders. When zflow runs as root (as on
//! GPU nodes and in containers) and a cgroup hierarchy is writable, each sandbox also gets a
//! cgroup of its own (`sandbox/cgroup.rs`): all its processes and folders together hold at most
//! [`Limits::memory_bytes`] plus its two folders, and at most [`Limits::processes`] plus
//! [`SUPERVISING_PROCESSES`] processes.
//!
//! A program passes when it exits with status 0 within its limits; anything else (an exception,
//! a signal, a limit, the timeout) is a failure, as in lm-eval's `code_eval`.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};
use hakoniwa::{Container, MountOptions, Namespace, Rlimit, Stdio};

/// The uid and gid of a program inside its sandbox: `nobody`'s, not root's.
pub const INSIDE_ID: u32 = 65534;

/// The host uid and gid a sandbox runs as when zflow runs as root: `nobody`'s. It owns nothing
/// the sandbox can reach (every host folder is bound read-only, and nothing is written), and
/// the sandbox's PID namespace hides the host's other `nobody` processes.
pub const ROOT_RUN_ID: u32 = 65534;

/// How much of a program's stderr a [`Run`] keeps: its end, where a traceback ends.
pub const STDERR_TAIL_BYTES: usize = 2048;

/// The program's file inside the sandbox.
const PROGRAM: &str = "/sandbox/program.py";

/// Processes (and threads) in a sandbox's cgroup besides the program's own: zflow's child that
/// starts it and hakoniwa's.
pub const SUPERVISING_PROCESSES: u64 = 4;

mod cgroup;
use cgroup::Cgroup;

/// What a sandboxed program may use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Wall-clock seconds before the program and all its children are killed.
    pub wall_secs: u64,
    /// CPU seconds (`RLIMIT_CPU`).
    pub cpu_secs: u64,
    /// Address space in bytes (`RLIMIT_AS`), per process.
    pub memory_bytes: u64,
    /// The largest file it may write, in bytes (`RLIMIT_FSIZE`).
    pub file_bytes: u64,
    /// Processes the sandbox may hold at once, the program included (`RLIMIT_NPROC`, which
    /// the kernel counts in the sandbox's own user namespace).
    pub processes: u64,
    /// Bytes each of its memory folders (`/sandbox`, `/tmp`) may hold.
    pub folder_bytes: u64,
}

impl Default for Limits {
    /// lm-eval's `code_eval` timeout (3 s), 1 GiB a process, 16 MiB files, 8 processes, 32 MiB
    /// folders.
    fn default() -> Self {
        Limits {
            wall_secs: 3,
            cpu_secs: 3,
            memory_bytes: 1 << 30,
            file_bytes: 16 << 20,
            processes: 8,
            folder_bytes: 32 << 20,
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
    /// The last [`STDERR_TAIL_BYTES`] of what it wrote to stderr (a traceback, usually), for
    /// samples.
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
        let sandbox = PythonSandbox {
            executable,
            prefix,
            limits,
        };
        sandbox.check_it_starts()?;
        Ok(sandbox)
    }

    /// Runs an empty program, so that a sandbox that cannot start here is an error that says
    /// why, before any model's program is scored as failing in it.
    fn check_it_starts(&self) -> Result<()> {
        let run = self.run("pass\n")?;
        let why = match run.outcome {
            Outcome::Passed => return Ok(()),
            Outcome::NotRun { reason } => reason,
            other => format!("{other:?}: {}", run.stderr.trim()),
        };
        bail!(
            "the sandbox for model-written programs cannot run an empty program here ({why}). \
             It needs unprivileged user namespaces: Ubuntu 23.10 and later restrict them through \
             AppArmor (`sysctl kernel.apparmor_restrict_unprivileged_userns=0` lifts that, as does \
             an AppArmor profile that allows `userns` for zflow), and a container must permit them"
        )
    }

    /// The limits every program runs under.
    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// The sandbox for `program`: its user namespace maps [`INSIDE_ID`] to this process's uid
    /// and gid, and the Python installation is bound from `prefix_source` (its path, or where
    /// a root run bound it for `nobody`: [`bind_privately`]).
    fn container(&self, program: &str, prefix_source: &str) -> Result<Container> {
        // SAFETY: geteuid and getegid cannot fail.
        let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
        let mut c = Container::new();
        c.uidmaps(&[(INSIDE_ID, uid, 1)]);
        c.gidmaps(&[(INSIDE_ID, gid, 1)]);
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
            c.bindmount_ro(prefix_source, prefix);
        }
        // `mount` is hakoniwa's hidden general form (pinned in Cargo.lock): its named ones take
        // no size for a tmpfs, nor a read-only procfs. This /proc replaces `Container::new`'s.
        let plain = MountOptions::NOSUID | MountOptions::NODEV;
        c.mount(
            "proc",
            "/proc",
            "proc",
            plain | MountOptions::NOEXEC | MountOptions::RDONLY,
            None,
        );
        let l = self.limits;
        for (folder, mode) in [("/sandbox", "0700"), ("/tmp", "1777")] {
            let data = format!("size={},nr_inodes=4096,mode={mode}", l.folder_bytes);
            c.mount("tmpfs", folder, "tmpfs", plain, Some(data));
        }
        c.devfsmount("/dev").file(PROGRAM, program);
        c.setrlimit(Rlimit::Cpu, l.cpu_secs, l.cpu_secs)
            .setrlimit(Rlimit::As, l.memory_bytes, l.memory_bytes)
            .setrlimit(Rlimit::Fsize, l.file_bytes, l.file_bytes)
            .setrlimit(Rlimit::Nproc, l.processes, l.processes)
            .setrlimit(Rlimit::Core, 0, 0);
        Ok(c)
    }

    /// Runs one program (its source text) to its end or its limits.
    pub fn run(&self, program: &str) -> Result<Run> {
        // SAFETY: geteuid cannot fail.
        if unsafe { libc::geteuid() } == 0 {
            self.run_as_nobody(program)
        } else {
            let prefix = self.prefix.to_str().context("a non-UTF-8 Python prefix")?;
            self.run_here(program, prefix)
        }
    }

    /// Runs one program from a child of this process that has given up root
    /// ([`become_unprivileged`]); its [`Run`] comes back as JSON on a pipe. A child process, not
    /// a thread: a process that changed its user is not dumpable, and its sandbox cannot write
    /// its own uid map until it is made so again, which for zflow itself would let `nobody`
    /// trace the thread that changed. The Python installation is bound where `nobody` may reach
    /// it, in a mount namespace of the child's own, before root is given up ([`bind_privately`]):
    /// `nobody` may not walk to one under `/root`, where pyenv and conda put root's.
    fn run_as_nobody(&self, program: &str) -> Result<Run> {
        use std::io::Write;
        use std::os::unix::fs::PermissionsExt;
        // An empty folder anyone may enter, for that bind; removed afterwards.
        let reachable = tempfile::Builder::new()
            .prefix("zflow-sandbox-")
            .tempdir()
            .context("making the sandbox's folder")?;
        std::fs::set_permissions(reachable.path(), std::fs::Permissions::from_mode(0o755))?;
        let python = reachable.path().join("python");
        std::fs::create_dir(&python)?;
        let (mut reader, writer) = std::io::pipe().context("a pipe for the sandbox's result")?;
        let cgroup = self.cgroup();
        // SAFETY: the child runs only the closure below and always ends in `_exit`, never
        // returning into this process's code; the sandbox it starts forks from it the same way
        // hakoniwa forks from any caller.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            drop(reader);
            let sent = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                // Into the cgroup while still root, before anything of the sandbox starts.
                let result = cgroup
                    .as_ref()
                    .map_or(Ok(()), |g| g.add(std::process::id()))
                    .and_then(|()| bind_privately(&self.prefix, &python))
                    .and_then(|()| become_unprivileged(ROOT_RUN_ID))
                    .and_then(|()| {
                        let source = python.to_str().context("a non-UTF-8 temporary folder")?;
                        self.run_here(program, source)
                    })
                    .map_err(|e| format!("{e:#}"));
                let bytes = serde_json::to_vec(&result).unwrap_or_default();
                (&writer).write_all(&bytes).is_ok()
            }));
            // SAFETY: ends the child without running the parent's destructors or atexit.
            unsafe { libc::_exit(if matches!(sent, Ok(true)) { 0 } else { 1 }) }
        }
        if pid < 0 {
            bail!(
                "forking the sandbox's process: {}",
                std::io::Error::last_os_error()
            );
        }
        drop(writer);
        let mut bytes = Vec::new();
        let read = (&mut reader).take(1 << 20).read_to_end(&mut bytes);
        let mut status = 0;
        // SAFETY: waits for the child forked above.
        unsafe { libc::waitpid(pid, &mut status, 0) };
        read.context("reading the sandbox's result")?;
        // The OOM killer may pick any process of the cgroup, this child (a copy of zflow, with
        // its resident memory) included: the sandbox as a whole held its bound, so the program
        // failed, and whatever is left of it is killed as the cgroup is dropped.
        if bytes.is_empty() && cgroup.as_ref().is_some_and(Cgroup::killed_for_memory) {
            return Ok(Run {
                outcome: Outcome::Killed {
                    signal: libc::SIGKILL,
                },
                stderr:
                    "killed for memory: the sandbox's processes together held its cgroup's bound"
                        .into(),
            });
        }
        let result: std::result::Result<Run, String> = serde_json::from_slice(&bytes)
            .with_context(|| {
                format!("the sandbox's process ended (status {status}) with no result")
            })?;
        result.map_err(anyhow::Error::msg)
    }

    /// The cgroup a root run puts its sandbox in, where one can be made ([`Cgroup`]).
    fn cgroup(&self) -> Option<Cgroup> {
        let l = self.limits;
        Cgroup::create(
            l.memory_bytes.saturating_add(2 * l.folder_bytes),
            l.processes + SUPERVISING_PROCESSES,
        )
    }

    /// Runs one program as this process's user, the Python installation bound from
    /// `prefix_source` (see [`PythonSandbox::container`]).
    fn run_here(&self, program: &str, prefix_source: &str) -> Result<Run> {
        let container = self.container(program, prefix_source)?;
        let exe = self
            .executable
            .to_str()
            .context("a non-UTF-8 Python path")?;
        let null = std::fs::OpenOptions::new().write(true).open("/dev/null")?;
        let child = container
            .command(exe)
            // -I: no user site, no PYTHON* variables, no script folder on sys.path beyond /sandbox.
            .args(["-I", PROGRAM])
            .env("PATH", "/usr/bin:/bin")
            .env("HOME", "/sandbox")
            .env("LANG", "C.UTF-8")
            .env("PYTHONHASHSEED", "0")
            .current_dir("/sandbox")
            .wait_timeout(self.limits.wall_secs)
            .stdin(Stdio::from(std::fs::File::open("/dev/null")?))
            .stdout(Stdio::from(null))
            .stderr(Stdio::piped())
            .spawn();
        let mut child = match child {
            Ok(child) => child,
            Err(e) => {
                return Ok(Run {
                    outcome: Outcome::NotRun {
                        reason: e.to_string(),
                    },
                    stderr: String::new(),
                });
            }
        };
        let stderr = match child.stderr.take() {
            Some(pipe) => read_tail(pipe, STDERR_TAIL_BYTES),
            None => Vec::new(),
        };
        let outcome = match child.wait() {
            Ok(status) => match (status.exit_code, status.code) {
                (Some(0), _) => Outcome::Passed,
                (Some(code), _) => Outcome::Failed { code },
                (None, code) if code > 128 && code != 125 => Outcome::Killed { signal: code - 128 },
                (None, _) => Outcome::NotRun {
                    reason: status.reason,
                },
            },
            Err(e) => Outcome::NotRun {
                reason: e.to_string(),
            },
        };
        Ok(Run {
            outcome,
            stderr: tail(&stderr, STDERR_TAIL_BYTES),
        })
    }

    /// Runs every program, `threads` at a time, results in input order. A program the sandbox
    /// could not start is an error, not a failing program.
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
        let runs: Vec<Run> = results
            .into_iter()
            .map(|r| {
                r.into_inner()
                    .expect("unpoisoned")
                    .expect("every program ran")
            })
            .collect::<Result<_>>()?;
        if let Some((i, reason)) = runs.iter().enumerate().find_map(|(i, r)| match &r.outcome {
            Outcome::NotRun { reason } => Some((i, reason)),
            _ => None,
        }) {
            bail!("the sandbox could not start program {i}: {reason}");
        }
        Ok(runs)
    }
}

/// Binds folder `from` at `to` in a mount namespace of this process's own (a child of zflow's,
/// with one thread, still root), from which no mount reaches the host. (The sandbox binds it
/// on, read-only.)
fn bind_privately(from: &Path, to: &Path) -> Result<()> {
    use std::ffi::CString;
    use std::os::unix::ffi::OsStrExt;
    let path = |p: &Path| CString::new(p.as_os_str().as_bytes()).context("a path with a NUL byte");
    let (from_c, to_c) = (path(from)?, path(to)?);
    let why = |call: &str| format!("binding {} for the sandbox ({call})", from.display());
    // SAFETY: plain system calls with NUL-terminated paths that outlive them; each runs only
    // once the one before it succeeded (a bind made before the unshare would be the host's).
    unsafe {
        checked(libc::unshare(libc::CLONE_NEWNS)).with_context(|| why("unshare(CLONE_NEWNS)"))?;
        checked(libc::mount(
            std::ptr::null(),
            c"/".as_ptr(),
            std::ptr::null(),
            libc::MS_REC | libc::MS_PRIVATE,
            std::ptr::null(),
        ))
        .with_context(|| why("making / private"))?;
        checked(libc::mount(
            from_c.as_ptr(),
            to_c.as_ptr(),
            std::ptr::null(),
            libc::MS_BIND | libc::MS_REC,
            std::ptr::null(),
        ))
        .with_context(|| why("bind"))?;
    }
    Ok(())
}

/// Gives this process (a child of zflow's, with one thread) the host uid and gid `id`, no
/// supplementary groups and no capability (leaving root clears them, for good), then makes it
/// dumpable again, as any process of that user's is: the sandbox it starts writes its own
/// `/proc/self/uid_map`, which the kernel gives to root while a process is not dumpable. It
/// dies with its parent.
fn become_unprivileged(id: u32) -> Result<()> {
    let why =
        |call: &str| format!("the sandbox's process could not give up root ({call}, id {id})");
    // SAFETY: plain system calls on this process's credentials (a null list with a count of
    // 0), each only once the one before it succeeded.
    unsafe {
        checked(libc::setgroups(0, std::ptr::null())).with_context(|| why("setgroups"))?;
        checked(libc::setresgid(id, id, id)).with_context(|| why("setresgid"))?;
        checked(libc::setresuid(id, id, id)).with_context(|| why("setresuid"))?;
        checked(libc::prctl(libc::PR_SET_DUMPABLE, 1)).with_context(|| why("PR_SET_DUMPABLE"))?;
        checked(libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL))
            .with_context(|| why("PR_SET_PDEATHSIG"))?;
    }
    Ok(())
}

/// A system call's return code as a result, its error read from `errno` at once.
fn checked(rc: libc::c_int) -> std::io::Result<()> {
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Reads `pipe` to its end, keeping only its last `n` bytes (and at most `n` more while
/// reading).
fn read_tail(mut pipe: impl Read, n: usize) -> Vec<u8> {
    let mut kept = Vec::with_capacity(2 * n);
    let mut buf = vec![0u8; 64 << 10];
    loop {
        match pipe.read(&mut buf) {
            Ok(0) => break,
            Ok(len) => {
                kept.extend_from_slice(&buf[len.saturating_sub(2 * n)..len]);
                if kept.len() > 2 * n {
                    kept.drain(..kept.len() - n);
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => break,
        }
    }
    kept
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

#[cfg(test)]
mod tests;
