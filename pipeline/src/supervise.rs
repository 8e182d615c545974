//! Process supervision: how a stage's processes start, end, and die with zflow.
//!
//! Every process a stage starts ([`spawn_supervised`]) leads its own process group and gets
//! SIGKILL when zflow dies (`PR_SET_PDEATHSIG`); [`terminate_group`] ends a group (SIGTERM,
//! then SIGKILL after a grace period), and dropping the [`Supervised`] handle ends what is left
//! of it.
//!
//! The parent-death signal reaches only the direct child: what it started (a shell's pipeline,
//! a worker's helpers) would live on and race the next attempt on the same files. So zflow
//! starts one small helper process, the reaper, the first time a stage starts a process: zflow
//! tells it each process group it starts and ends, one line each on a pipe; when that pipe
//! closes without a goodbye (zflow is gone, however it died), the reaper SIGKILLs every group
//! still listed, waits until they are empty, and exits.
//!
//! The reaper is the zflow binary itself, started as `zflow __zflow-reaper` (see
//! [`install`]); it sits in its own process group so a terminal's Ctrl-C, meant for zflow,
//! does not reach it. Its pid goes into every stage lease ([`pid`]): a rerun does not take
//! over a stage while the reaper of the run that held it is still clearing that run's
//! processes ([`crate::lease::LeaseInfo::is_stale`]).
//!
//! A process that leaves its group on purpose (`setsid`) escapes the reaper, as it escapes
//! a terminal's job control; stages have no reason to.

use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result};

/// The argument that starts the binary as a reaper.
const ARG: &str = "__zflow-reaper";

/// Whether this binary can be started as a reaper ([`install`] was called).
static INSTALLED: AtomicBool = AtomicBool::new(false);

/// The running reaper and the pipe to it, once started.
static REAPER: Mutex<Option<(Child, ChildStdin)>> = Mutex::new(None);

/// Called first thing in `main` of a binary that starts stage processes: when this process
/// was started as a reaper, serves as one and exits; otherwise lets stages start one.
///
/// Binaries that never call it (library tests) run their stage processes without a reaper:
/// direct children still die with the parent, their descendants may not.
pub fn install() {
    let mut args = std::env::args_os().skip(1);
    if args.next().is_some_and(|a| a == ARG) {
        std::process::exit(serve(std::io::stdin().lock()));
    }
    INSTALLED.store(true, Ordering::SeqCst);
}

/// The reaper's pid, starting it if needed; `None` where there is none ([`install`] was not
/// called, or it could not start: stages then run as without one, with a warning).
pub fn pid() -> Option<u32> {
    if !INSTALLED.load(Ordering::SeqCst) {
        return None;
    }
    let mut reaper = REAPER.lock().unwrap_or_else(|e| e.into_inner());
    if reaper.is_none() {
        match start() {
            Ok(r) => *reaper = Some(r),
            Err(e) => {
                tracing::warn!(
                    "could not start the process reaper ({e}): processes that stage processes start may outlive a killed zflow"
                );
                INSTALLED.store(false, Ordering::SeqCst);
                return None;
            }
        }
    }
    reaper.as_ref().map(|(child, _)| child.id())
}

fn start() -> std::io::Result<(Child, ChildStdin)> {
    use std::os::unix::process::CommandExt;
    let exe = zflow_exe().map_err(std::io::Error::other)?;
    let mut child = Command::new(exe)
        .arg(ARG)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .process_group(0)
        .spawn()?;
    let stdin = child.stdin.take().expect("piped stdin");
    Ok((child, stdin))
}

/// Tells the reaper that process group `pgid` belongs to a stage (kill it if zflow dies).
pub fn watch(pgid: u32) {
    send(&format!("+{pgid}"));
}

/// Tells the reaper that process group `pgid` is over.
pub fn forget(pgid: u32) {
    send(&format!("-{pgid}"));
}

fn send(line: &str) {
    if pid().is_none() {
        return;
    }
    let mut reaper = REAPER.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, stdin)) = reaper.as_mut()
        && let Err(e) = writeln!(stdin, "{line}")
    {
        tracing::warn!("the process reaper stopped listening ({e})");
    }
}

/// The reaper's loop: `+PGID` adds a group, `-PGID` removes one, end of input kills what is
/// left. Returns the exit code.
fn serve(input: impl BufRead) -> i32 {
    // SAFETY: signal dispositions set in a single-threaded process before anything else.
    unsafe {
        // Ctrl-C and hang-ups are for zflow; the reaper finishes when zflow is gone.
        libc::signal(libc::SIGINT, libc::SIG_IGN);
        libc::signal(libc::SIGHUP, libc::SIG_IGN);
    }
    let mut groups: Vec<i32> = Vec::new();
    for line in input.lines() {
        let Ok(line) = line else { break };
        let (op, pgid) = line.split_at(line.len().min(1));
        let Ok(pgid) = pgid.parse::<i32>() else {
            continue;
        };
        if pgid <= 1 {
            continue;
        }
        match op {
            "+" => groups.push(pgid),
            "-" => groups.retain(|&g| g != pgid),
            _ => {}
        }
    }
    kill_groups(&groups, Duration::from_secs(10));
    0
}

/// SIGKILLs each process group and waits (up to `patience`) until none has a member left.
pub fn kill_groups(groups: &[i32], patience: Duration) {
    let deadline = Instant::now() + patience;
    for &g in groups {
        // SAFETY: kill(2) on a process group zflow created.
        unsafe { libc::kill(-g, libc::SIGKILL) };
    }
    while groups.iter().any(|&g| group_running(g)) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Whether process group `pgid` has a member that is not a zombie. (A zombie counts for
/// kill(2), and one whose parent never reaps it, as in a container without an init, would
/// keep the group "alive" for ever.)
fn group_running(pgid: i32) -> bool {
    let Ok(procs) = std::fs::read_dir("/proc") else {
        // SAFETY: signal 0 only checks whether the group has members.
        return unsafe { libc::kill(-pgid, 0) } == 0;
    };
    procs.flatten().any(|p| {
        let stat = std::fs::read_to_string(p.path().join("stat")).unwrap_or_default();
        let (state, group) = stat_state_and_group(&stat);
        group == Some(pgid) && state != Some('Z')
    })
}

/// The state letter and process group of a `/proc/<pid>/stat` line. The command name (field
/// 2) is in parentheses and may itself hold spaces and parentheses, so fields are counted from
/// the last `)`.
pub(crate) fn stat_state_and_group(stat: &str) -> (Option<char>, Option<i32>) {
    let Some((_, rest)) = stat.rsplit_once(')') else {
        return (None, None);
    };
    let mut fields = rest.split_whitespace();
    let state = fields.next().and_then(|s| s.chars().next());
    let group = fields.nth(1).and_then(|g| g.parse().ok());
    (state, group)
}

/// A stage's child process, leader of its own process group. The group dies with zflow,
/// however zflow dies (the direct child by its parent-death signal, the rest through the
/// reaper), and with this value: dropping it kills what is left of the group.
pub struct Supervised {
    child: std::process::Child,
}

impl std::ops::Deref for Supervised {
    type Target = std::process::Child;
    fn deref(&self) -> &std::process::Child {
        &self.child
    }
}

impl std::ops::DerefMut for Supervised {
    fn deref_mut(&mut self) -> &mut std::process::Child {
        &mut self.child
    }
}

impl Drop for Supervised {
    fn drop(&mut self) {
        let pgid = self.child.id();
        if matches!(self.child.try_wait(), Ok(None)) {
            terminate_group(pgid as i32, Duration::from_secs(5), &mut self.child);
        } else {
            // The leader is gone; what it left running in its group goes too. (Its pid is not
            // handed out again this soon: Linux allocates pids in sequence.)
            // SAFETY: kill(2) on the process group this value created.
            unsafe { libc::kill(-(pgid as i32), libc::SIGKILL) };
        }
        forget(pgid);
    }
}

/// Spawns `cmd` in its own process group, arranged to die with zflow: the direct child by
/// SIGKILL when zflow dies, the whole group by the reaper.
pub fn spawn_supervised(cmd: &mut Command) -> std::io::Result<Supervised> {
    use std::os::unix::process::CommandExt;
    // SAFETY: only async-signal-safe calls (setpgid, prctl, getppid) between fork and exec.
    unsafe {
        let parent = libc::getpid();
        cmd.pre_exec(move || {
            libc::setpgid(0, 0);
            #[cfg(target_os = "linux")]
            {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                // The parent may have died between fork and prctl.
                if libc::getppid() != parent {
                    libc::_exit(1);
                }
            }
            Ok(())
        });
    }
    let child = cmd.spawn()?;
    watch(child.id());
    Ok(Supervised { child })
}

/// SIGTERM to the process group, then SIGKILL after `grace`, then reaps the child.
pub fn terminate_group(pgid: i32, grace: Duration, child: &mut std::process::Child) {
    // SAFETY: plain kill(2) on a process group we created.
    unsafe {
        libc::kill(-pgid, libc::SIGTERM);
    }
    let deadline = std::time::Instant::now() + grace;
    while std::time::Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    // SAFETY: as above; also reaps stragglers in the group that ignored SIGTERM.
    unsafe {
        libc::kill(-pgid, libc::SIGKILL);
    }
    let _ = child.wait();
}

/// The running zflow binary, for the processes a stage starts (workers, probes).
///
/// When the file was replaced while zflow runs (a rebuild during a long run), Linux reports
/// `<path> (deleted)`; the binary this process runs is still there as `/proc/self/exe`, and
/// starting that keeps the supervisor and its workers on one version.
pub fn zflow_exe() -> Result<PathBuf> {
    let exe = std::env::current_exe().context("locating the zflow binary")?;
    if !exe.exists() && Path::new("/proc/self/exe").exists() {
        return Ok(PathBuf::from("/proc/self/exe"));
    }
    Ok(exe)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn end_of_input_kills_the_groups_still_listed() {
        use std::os::unix::process::CommandExt;
        let spawn = || {
            Command::new("sh")
                .args(["-c", "sleep 30 & sleep 30"])
                .process_group(0)
                .spawn()
                .unwrap()
        };
        let (mut kept, mut finished) = (spawn(), spawn());
        let input = format!("+{}\n+{}\n-{}\n", kept.id(), finished.id(), finished.id());
        assert_eq!(serve(input.as_bytes()), 0);
        // The listed group is gone, background child and all; the forgotten one lives.
        assert!(!group_running(kept.id() as i32));
        kept.wait().unwrap();
        assert!(finished.try_wait().unwrap().is_none());
        kill_groups(&[finished.id() as i32], Duration::from_secs(5));
        finished.wait().unwrap();
    }

    #[test]
    fn reads_state_and_group_past_a_command_name_with_parentheses() {
        let stat = "4242 (a (b) c) S 1 4240 4240 0 -1";
        assert_eq!(stat_state_and_group(stat), (Some('S'), Some(4240)));
        assert_eq!(stat_state_and_group("garbage"), (None, None));
    }
}
