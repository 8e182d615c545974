//! Atomic folders: written in a temporary sibling, then renamed into place.

use anyhow::{Context, Result, anyhow, ensure};
use std::fs;
use std::path::{Path, PathBuf};

/// Creates folder `out` holding what `fill` writes into the folder it is given: `fill` writes
/// into a temporary sibling, every file is fsynced, and the folder is renamed into place, so
/// `out` either does not exist or is complete. `out` may exist only as an empty folder.
pub(super) fn publish(out: &Path, fill: impl FnOnce(&Path) -> Result<()>) -> Result<()> {
    if out.exists() {
        let empty = fs::read_dir(out)
            .map(|mut d| d.next().is_none())
            .unwrap_or(false);
        ensure!(
            empty,
            "{} already exists; remove it or choose another folder",
            out.display()
        );
    }
    let name = out
        .file_name()
        .ok_or_else(|| anyhow!("{}: not a folder name", out.display()))?
        .to_string_lossy()
        .into_owned();
    let parent = match out.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    fs::create_dir_all(&parent).with_context(|| format!("creating {}", parent.display()))?;
    let tmp = parent.join(format!(".{name}.tmp-{}", std::process::id()));
    if tmp.exists() {
        fs::remove_dir_all(&tmp)?;
    }
    fs::create_dir(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
    let filled = fill(&tmp).and_then(|()| {
        for entry in fs::read_dir(&tmp)? {
            fs::File::open(entry?.path())?.sync_all()?;
        }
        fs::File::open(&tmp)?.sync_all()?;
        Ok(())
    });
    if let Err(e) = filled {
        let _ = fs::remove_dir_all(&tmp);
        return Err(e);
    }
    if out.exists() {
        fs::remove_dir(out)?;
    }
    fs::rename(&tmp, out)
        .with_context(|| format!("renaming {} to {}", tmp.display(), out.display()))?;
    fs::File::open(&parent)?.sync_all()?;
    Ok(())
}
