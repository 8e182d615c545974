//! Leases: at most one `zflow run` works on a stage at a time, across processes and hosts
//! sharing a store.
//!
//! A lease is a small JSON file created with `O_EXCL` and refreshed by a heartbeat thread.
//! A lease is stale when its heartbeat is older than the timeout, or, on the same host, when
//! its process is gone (so a SIGKILLed run is taken over at once). Taking over renames the
//! stale file away first: rename is atomic, so of two runs racing for a stale lease exactly
//! one wins.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

use crate::store::now_ms;
use zflow_files::atomic;

/// What a lease file says.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct LeaseInfo {
    /// Owner's host name.
    pub host: String,
    /// Owner's process id.
    pub pid: u32,
    /// Owner's run id (unique per `zflow run`).
    pub run_id: String,
    /// Unix ms of the last heartbeat.
    pub heartbeat_ms: i64,
    /// The store folders (`<stage>-<short>`) the leased stage reads: gc keeps them while the
    /// lease lives, whichever recipe it was told about.
    #[serde(default)]
    pub inputs: Vec<String>,
    /// The owner's process reaper ([`crate::supervise`]), which outlives the owner until the
    /// owner's stage processes are gone.
    #[serde(default)]
    pub reaper_pid: Option<u32>,
}

/// How long a lease may go without a heartbeat before others take it over.
/// `ZFLOW_LEASE_TIMEOUT_S` overrides the default of 30 s.
pub fn lease_timeout() -> Duration {
    std::env::var("ZFLOW_LEASE_TIMEOUT_S")
        .ok()
        .and_then(|s| s.parse::<f64>().ok())
        .map(Duration::from_secs_f64)
        .unwrap_or(Duration::from_secs(30))
}

/// This machine's host name.
pub fn hostname() -> String {
    gethostname::gethostname().to_string_lossy().into_owned()
}

/// Whether process `pid` exists on this host and is not a zombie (a dead process whose
/// parent has not reaped it yet, which kill(2) still finds).
pub fn pid_alive(pid: u32) -> bool {
    if let Ok(stat) = fs::read_to_string(format!("/proc/{pid}/stat")) {
        return crate::supervise::stat_state_and_group(&stat).0 != Some('Z');
    }
    // SAFETY: signal 0 only checks for existence and permission.
    let rc = unsafe { libc::kill(pid as i32, 0) };
    rc == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

impl LeaseInfo {
    /// Whether the owner is gone: on this host, its process has ended and its reaper has
    /// stopped every process its stages started; anywhere, its heartbeat is older than
    /// `timeout`.
    pub fn is_stale(&self, timeout: Duration) -> bool {
        if self.host == hostname()
            && !pid_alive(self.pid)
            && !self.reaper_pid.is_some_and(pid_alive)
        {
            return true;
        }
        now_ms() - self.heartbeat_ms > timeout.as_millis() as i64
    }
}

/// The result of trying to take a lease.
pub enum Acquire {
    /// We hold it now (until the guard drops).
    Held(LeaseGuard),
    /// Someone alive holds it.
    Busy(LeaseInfo),
}

/// A held lease; the heartbeat runs until it is dropped, which removes the file.
pub struct LeaseGuard {
    path: PathBuf,
    run_id: String,
    stop: Arc<AtomicBool>,
    lost: Arc<AtomicBool>,
    heartbeat: Option<std::thread::JoinHandle<()>>,
}

impl LeaseGuard {
    /// Whether another run took the lease over (our heartbeat stalled past the timeout).
    pub fn lost(&self) -> bool {
        self.lost.load(Ordering::SeqCst)
    }
}

/// Reads a lease file.
pub fn read(path: &Path) -> Option<LeaseInfo> {
    serde_json::from_slice(&fs::read(path).ok()?).ok()
}

/// Tries to take the lease at `path` for `run_id`, recording the store folders the stage
/// will read (`inputs`).
pub fn try_acquire(path: &Path, run_id: &str, inputs: &[String]) -> Result<Acquire> {
    let timeout = lease_timeout();
    let me = LeaseInfo {
        host: hostname(),
        pid: std::process::id(),
        run_id: run_id.to_string(),
        heartbeat_ms: now_ms(),
        inputs: inputs.to_vec(),
        reaper_pid: crate::supervise::pid(),
    };
    for _ in 0..3 {
        match fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(path)
        {
            Ok(mut f) => {
                f.write_all(&serde_json::to_vec(&me)?)?;
                f.sync_all()?;
                return Ok(Acquire::Held(start_heartbeat(path, me, timeout)));
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                let Some(info) = read(path) else {
                    // Being written right now, or garbage from a crash mid-create.
                    let age = fs::metadata(path)
                        .and_then(|m| m.modified())
                        .ok()
                        .and_then(|t| t.elapsed().ok())
                        .unwrap_or_default();
                    if age > Duration::from_secs(2) {
                        take_away(path)?;
                        continue;
                    }
                    std::thread::sleep(Duration::from_millis(50));
                    continue;
                };
                if info.run_id == run_id {
                    anyhow::bail!("lease {} is already held by this run", path.display());
                }
                if !info.is_stale(timeout) {
                    return Ok(Acquire::Busy(info));
                }
                tracing::warn!(
                    "taking over stale lease {} (owner pid {} on {}, last heartbeat {:.1}s ago)",
                    path.display(),
                    info.pid,
                    info.host,
                    (now_ms() - info.heartbeat_ms) as f64 / 1000.0
                );
                take_away(path)?;
            }
            Err(e) => return Err(e).with_context(|| format!("creating lease {}", path.display())),
        }
    }
    match read(path) {
        Some(info) => Ok(Acquire::Busy(info)),
        None => anyhow::bail!("could not take lease {}", path.display()),
    }
}

/// Moves a stale lease out of the way atomically; losing the race is fine.
fn take_away(path: &Path) -> Result<()> {
    let aside = path.with_extension(format!("stale-{}-{}", std::process::id(), now_ms()));
    match fs::rename(path, &aside) {
        Ok(()) => {
            let _ = fs::remove_file(&aside);
            Ok(())
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e.into()),
    }
}

fn start_heartbeat(path: &Path, me: LeaseInfo, timeout: Duration) -> LeaseGuard {
    let stop = Arc::new(AtomicBool::new(false));
    let lost = Arc::new(AtomicBool::new(false));
    let (p, s, l) = (path.to_path_buf(), stop.clone(), lost.clone());
    let run_id = me.run_id.clone();
    let interval = (timeout / 4).max(Duration::from_millis(100));
    let heartbeat = std::thread::Builder::new()
        .name("lease-heartbeat".into())
        .spawn(move || {
            let mut me = me;
            let tick = Duration::from_millis(50);
            let mut waited = Duration::ZERO;
            while !s.load(Ordering::SeqCst) {
                std::thread::sleep(tick);
                waited += tick;
                if waited < interval {
                    continue;
                }
                waited = Duration::ZERO;
                match read(&p) {
                    Some(info) if info.run_id == me.run_id => {
                        me.heartbeat_ms = now_ms();
                        let _ = atomic::write(&p, &serde_json::to_vec(&me).unwrap_or_default());
                    }
                    _ => {
                        l.store(true, Ordering::SeqCst);
                        return;
                    }
                }
            }
        })
        .expect("spawning the heartbeat thread");
    LeaseGuard {
        path: path.to_path_buf(),
        run_id,
        stop,
        lost,
        heartbeat: Some(heartbeat),
    }
}

impl Drop for LeaseGuard {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(h) = self.heartbeat.take() {
            let _ = h.join();
        }
        if read(&self.path)
            .map(|i| i.run_id == self.run_id)
            .unwrap_or(false)
        {
            let _ = fs::remove_file(&self.path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn second_owner_is_busy_and_dead_owner_is_taken_over() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.lease");
        let Acquire::Held(guard) = try_acquire(&path, "run-a", &[]).unwrap() else {
            panic!("should hold")
        };
        match try_acquire(&path, "run-b", &[]).unwrap() {
            Acquire::Busy(info) => assert_eq!(info.run_id, "run-a"),
            Acquire::Held(_) => panic!("two owners"),
        }
        drop(guard);
        assert!(!path.exists());

        // A lease left by a process that no longer exists.
        let dead = LeaseInfo {
            host: hostname(),
            pid: 999_999_999,
            run_id: "ghost".into(),
            heartbeat_ms: now_ms(),
            inputs: vec![],
            reaper_pid: None,
        };
        fs::write(&path, serde_json::to_vec(&dead).unwrap()).unwrap();
        assert!(matches!(
            try_acquire(&path, "run-c", &[]).unwrap(),
            Acquire::Held(_)
        ));
    }

    #[test]
    fn old_heartbeat_from_another_host_is_stale() {
        let info = LeaseInfo {
            host: "elsewhere".into(),
            pid: 1,
            run_id: "x".into(),
            heartbeat_ms: now_ms() - 60_000,
            inputs: vec![],
            reaper_pid: None,
        };
        assert!(info.is_stale(Duration::from_secs(30)));
        let fresh = LeaseInfo {
            heartbeat_ms: now_ms(),
            ..info
        };
        assert!(!fresh.is_stale(Duration::from_secs(30)));
    }
}
