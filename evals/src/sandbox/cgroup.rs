//! One cgroup per sandbox, when zflow runs as root: the sandbox's processes together hold at
//! most [`Cgroup::create`]'s memory (their folders' pages included) and number, which per-process
//! rlimits cannot bound. It is made under zflow's own cgroup in each hierarchy that has the
//! controller: cgroup v2's unified one (when zflow's cgroup may delegate `memory` and `pids`
//! to a child), or v1's `memory` and `pids` ones. Where none can be made (an ordinary user, a
//! container without a writable hierarchy) the sandbox runs under its rlimits alone.
//!
//! Hand-written rather than hakoniwa's `cgroups` feature: that goes through systemd over D-Bus,
//! which containers and GPU nodes often lack, and pulls in youki's `libcgroups` and `oci-spec`
//! for what is a few file writes.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

/// A sandbox's cgroup folders (one per hierarchy that holds a controller of it), removed with
/// it.
#[derive(Debug)]
pub(super) struct Cgroup {
    dirs: Vec<PathBuf>,
}

/// Cgroups made by this process so far, for unique names.
static MADE: AtomicU64 = AtomicU64::new(0);

/// A cgroup hierarchy zflow's process is in.
struct Hierarchy {
    /// zflow's own cgroup folder in it.
    own: PathBuf,
    /// cgroup v2's unified hierarchy, or a v1 one.
    unified: bool,
    /// Its v1 controllers (`memory`, `pids`, ...); empty for v2.
    controllers: Vec<String>,
}

impl Cgroup {
    /// A new cgroup limited to `memory_bytes` of memory and `processes` processes, or `None`
    /// where none can be made with both limits.
    pub(super) fn create(memory_bytes: u64, processes: u64) -> Option<Cgroup> {
        let name = format!(
            "zflow-sandbox-{}-{}",
            std::process::id(),
            MADE.fetch_add(1, Ordering::Relaxed)
        );
        let mut group = Cgroup { dirs: Vec::new() };
        let (mut memory, mut pids) = (false, false);
        for h in hierarchies() {
            if h.unified {
                // Only where v1 has not taken the controllers (a hybrid host keeps them there).
                if memory || pids || !delegate(&h.own) {
                    continue;
                }
                let dir = h.own.join(&name);
                if std::fs::create_dir(&dir).is_err() {
                    continue;
                }
                group.dirs.push(dir.clone());
                let set = std::fs::write(dir.join("memory.max"), memory_bytes.to_string())
                    .and_then(|()| std::fs::write(dir.join("memory.swap.max"), "0").or(Ok(())))
                    .and_then(|()| std::fs::write(dir.join("pids.max"), processes.to_string()));
                (memory, pids) = (set.is_ok(), set.is_ok());
                continue;
            }
            let has = |c: &str| h.controllers.iter().any(|x| x == c);
            let (wants_memory, wants_pids) = (has("memory") && !memory, has("pids") && !pids);
            if !wants_memory && !wants_pids {
                continue;
            }
            let dir = h.own.join(&name);
            if std::fs::create_dir(&dir).is_err() {
                continue;
            }
            group.dirs.push(dir.clone());
            if wants_memory {
                memory =
                    std::fs::write(dir.join("memory.limit_in_bytes"), memory_bytes.to_string())
                        .is_ok();
            }
            if wants_pids {
                pids = std::fs::write(dir.join("pids.max"), processes.to_string()).is_ok();
            }
        }
        // Both or nothing: a sandbox bounded in one of the two would be documented as neither.
        (memory && pids).then_some(group)
    }

    /// Moves process `pid` (with the threads of its group) into the cgroup; its children are
    /// born there.
    pub(super) fn add(&self, pid: u32) -> Result<()> {
        for dir in &self.dirs {
            std::fs::write(dir.join("cgroup.procs"), pid.to_string())
                .with_context(|| format!("moving process {pid} into {}", dir.display()))?;
        }
        Ok(())
    }

    /// Whether the kernel's OOM killer has killed a process of the cgroup (the sandbox held
    /// its whole memory bound): `oom_kill` in v2's `memory.events` or v1's `memory.oom_control`.
    pub(super) fn killed_for_memory(&self) -> bool {
        self.dirs.iter().any(|d| {
            ["memory.events", "memory.oom_control"].iter().any(|f| {
                std::fs::read_to_string(d.join(f)).is_ok_and(|s| {
                    s.lines().any(|l| {
                        l.strip_prefix("oom_kill ")
                            .and_then(|n| n.trim().parse::<u64>().ok())
                            .is_some_and(|n| n > 0)
                    })
                })
            })
        })
    }

    /// Its folders.
    #[cfg(test)]
    pub(super) fn dirs(&self) -> &[PathBuf] {
        &self.dirs
    }

    /// The most memory the sandbox held at once, in bytes, where the kernel says
    /// (`memory.peak`, `memory.max_usage_in_bytes`).
    #[cfg(test)]
    pub(super) fn peak_memory(&self) -> Option<u64> {
        self.dirs.iter().find_map(|d| {
            ["memory.peak", "memory.max_usage_in_bytes"]
                .iter()
                .find_map(|f| std::fs::read_to_string(d.join(f)).ok())
                .and_then(|s| s.trim().parse().ok())
        })
    }
}

impl Drop for Cgroup {
    /// Removes the folders, once the processes left in them (none, normally: the sandbox's
    /// PID namespace ends with its first process) are killed.
    fn drop(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(5);
        for dir in self.dirs.iter().rev() {
            while std::fs::remove_dir(dir).is_err() && dir.exists() && Instant::now() < deadline {
                let procs = std::fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
                for pid in procs.lines().filter_map(|p| p.trim().parse::<i32>().ok()) {
                    // SAFETY: a signal to a process of this sandbox's cgroup.
                    unsafe { libc::kill(pid, libc::SIGKILL) };
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    }
}

/// Enables `memory` and `pids` for the children of v2 cgroup `own`, if it may.
fn delegate(own: &Path) -> bool {
    let enabled = |f: &str| {
        std::fs::read_to_string(own.join(f))
            .is_ok_and(|s| s.split_whitespace().any(|c| c == "memory") && s.contains("pids"))
    };
    if !enabled("cgroup.controllers") {
        return false;
    }
    // Refused (EBUSY) where `own` holds processes and is not the root: v2 lets only leaves
    // hold processes.
    enabled("cgroup.subtree_control")
        || std::fs::write(own.join("cgroup.subtree_control"), "+memory +pids").is_ok()
}

/// The cgroup hierarchies mounted here, each with this process's cgroup folder in it.
fn hierarchies() -> Vec<Hierarchy> {
    let (Ok(mounts), Ok(own)) = (
        std::fs::read_to_string("/proc/self/mountinfo"),
        std::fs::read_to_string("/proc/self/cgroup"),
    ) else {
        return Vec::new();
    };
    // "ID:controllers:path", "0::path" for v2.
    let own: Vec<(&str, &str)> = own
        .lines()
        .filter_map(|l| {
            let mut parts = l.splitn(3, ':');
            let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
            Some((controllers, path))
        })
        .collect();
    let mut out = Vec::new();
    for line in mounts.lines() {
        // "ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTIONS [OPTIONAL...] - FSTYPE SOURCE SUPER".
        let Some((left, right)) = line.split_once(" - ") else {
            continue;
        };
        let left: Vec<&str> = left.split(' ').collect();
        let right: Vec<&str> = right.split(' ').collect();
        let (Some(root), Some(point), Some(fstype), Some(options)) =
            (left.get(3), left.get(4), right.first(), right.get(2))
        else {
            continue;
        };
        let (unified, controllers): (bool, Vec<String>) = match *fstype {
            "cgroup2" => (true, Vec::new()),
            "cgroup" => (
                false,
                options
                    .split(',')
                    .filter(|o| ["memory", "pids"].contains(o))
                    .map(str::to_string)
                    .collect(),
            ),
            _ => continue,
        };
        if !unified && controllers.is_empty() {
            continue;
        }
        let path = own.iter().find_map(|(c, path)| {
            let matches = if unified {
                c.is_empty()
            } else {
                c.split(',').any(|x| controllers.iter().any(|y| y == x))
            };
            matches.then_some(*path)
        });
        let Some(path) = path else { continue };
        // The path is relative to the hierarchy's root; the mount may show only a part of it.
        let inside = path.strip_prefix(*root).unwrap_or(path);
        let own = Path::new(point).join(inside.trim_start_matches('/'));
        out.push(Hierarchy {
            own,
            unified,
            controllers,
        });
    }
    out
}
