//! `zflow gc STORE RECIPE...`: removes store entries that none of the given recipes reference.
//!
//! A recipe references, for every stage whose identity can be computed now, that identity's
//! output folder and (for resumable stages) its partial folder. Everything else at the top of
//! the store that the store made (old identities, abandoned attempts) goes, together with its
//! log; entries the store did not make (another file or folder that lives there) are never
//! touched, and a folder that is not a store is refused before anything is written
//! ([`crate::store::Store::is_store`], checked by the caller before it opens the recipes).
//! Stages being run right now (live lease) are never touched, nor the inputs they read (the
//! lease names them), even when the recipe that started them is not among those given.

use std::collections::BTreeSet;
use std::path::PathBuf;

use anyhow::{Context, Result};

use crate::identity::short;
use crate::lease;
use crate::plan::{Engine, StageState};

/// What gc found (and removed, unless dry-run).
#[derive(Debug, Default)]
pub struct GcReport {
    /// Folders removed (or that would be).
    pub removed: Vec<PathBuf>,
    /// Bytes freed (or that would be).
    pub bytes: u64,
    /// Folders kept.
    pub kept: usize,
}

/// Collects garbage in the store shared by `engines` (each a recipe opened on that store).
pub fn gc(engines: &[Engine], dry_run: bool) -> Result<GcReport> {
    let Some(first) = engines.first() else {
        anyhow::bail!("gc needs at least one recipe")
    };
    let store = &first.store;
    let mut keep: BTreeSet<String> = BTreeSet::new();
    for engine in engines {
        let plan = engine.plan(&BTreeSet::new())?;
        for (node, state) in engine.graph.nodes().iter().zip(&plan) {
            let identity = match state {
                StageState::Cached { manifest } => manifest.identity.clone(),
                StageState::WillRun { identity, .. } => identity.clone(),
                StageState::Waits { .. } | StageState::Broken { .. } => continue,
            };
            let slot = format!("{}-{}", node.name, short(&identity));
            keep.insert(format!("{slot}.partial"));
            keep.insert(slot);
        }
    }
    // Running stages stay, and so does what they read, whichever recipe started them.
    let mut running = BTreeSet::new();
    for (slot, lease) in live_leases(&store.root().join(".zflow/leases")) {
        running.insert(slot);
        keep.extend(lease.inputs);
    }
    let mut report = GcReport::default();
    for (folder, slot) in store.stage_folders()? {
        if keep.contains(&folder) || running.contains(&slot) {
            report.kept += 1;
            continue;
        }
        let path = store.root().join(&folder);
        report.bytes += dir_size(&path);
        if !dry_run {
            std::fs::remove_dir_all(&path)
                .with_context(|| format!("removing {}", path.display()))?;
            if !keep.contains(&slot) {
                let log = store.root().join(".zflow/logs").join(format!("{slot}.log"));
                if let Err(e) = std::fs::remove_file(&log)
                    && e.kind() != std::io::ErrorKind::NotFound
                {
                    return Err(e).with_context(|| format!("removing {}", log.display()));
                }
            }
        }
        report.removed.push(path);
    }
    Ok(report)
}

/// The leases in `dir` whose owners are alive, by the slot (`<stage>-<short>`) they hold.
fn live_leases(dir: &std::path::Path) -> Vec<(String, lease::LeaseInfo)> {
    let timeout = lease::lease_timeout();
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let path = e.path();
            let slot = path
                .file_name()?
                .to_str()?
                .strip_suffix(".lease")?
                .to_string();
            let lease = lease::read(&path).filter(|l| !l.is_stale(timeout))?;
            Some((slot, lease))
        })
        .collect()
}

fn dir_size(path: &std::path::Path) -> u64 {
    let Ok(meta) = std::fs::symlink_metadata(path) else {
        return 0;
    };
    if !meta.is_dir() {
        return meta.len();
    }
    std::fs::read_dir(path)
        .map(|d| d.flatten().map(|e| dir_size(&e.path())).sum())
        .unwrap_or(0)
}
