//! Writes that a crash cannot leave half done: a file or a folder is written under a
//! temporary name, fsynced, renamed into place, and its parent folder fsynced, so a reader
//! sees either nothing or all of it.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::{Context, Result, anyhow, ensure};

/// Writes `bytes` to `path` atomically (temporary sibling, fsync, rename, fsync of the folder).
pub fn write(path: &Path, bytes: &[u8]) -> Result<()> {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let dir = parent(path);
    let tmp = dir.join(format!(
        ".{}.tmp-{}-{}",
        path.file_name().unwrap_or_default().to_string_lossy(),
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed),
    ));
    let written = (|| {
        let mut f = fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()
    })();
    if let Err(e) = written {
        let _ = fs::remove_file(&tmp);
        return Err(e).with_context(|| format!("writing {}", tmp.display()));
    }
    rename(&tmp, path)?;
    sync_dir(&dir)
}

/// Renames `from` to `to` (a file, or a folder over a missing or empty one), naming both in
/// the error.
pub fn rename(from: &Path, to: &Path) -> Result<()> {
    fs::rename(from, to).with_context(|| format!("renaming {} to {}", from.display(), to.display()))
}

/// Fsyncs folder `dir`, so the names created or renamed in it survive a power loss. Best
/// effort: a file system that cannot sync a folder is not an error.
pub fn sync_dir(dir: &Path) -> Result<()> {
    if let Ok(f) = fs::File::open(dir) {
        let _ = f.sync_all();
    }
    Ok(())
}

/// Fsyncs the folder holding `path`, so a rename to `path` survives a power loss.
pub fn sync_parent(path: &Path) -> Result<()> {
    sync_dir(&parent(path))
}

/// Fsyncs every file under `dir` and the folders holding them.
pub fn sync_tree(dir: &Path) -> Result<()> {
    for entry in fs::read_dir(dir).with_context(|| format!("listing {}", dir.display()))? {
        let entry = entry?;
        if entry.file_type()?.is_dir() {
            sync_tree(&entry.path())?;
        } else if let Ok(f) = fs::File::open(entry.path()) {
            f.sync_all()
                .with_context(|| format!("syncing {}", entry.path().display()))?;
        }
    }
    sync_dir(dir)
}

/// Moves the finished folder `tmp` to `dest`, replacing what `dest` held: fsyncs `tmp`'s
/// files, removes an old `dest`, renames, fsyncs the parent. A crash leaves either the old
/// `dest` or the new one (or, between the removal and the rename, none, with `tmp` intact).
pub fn replace_dir(tmp: &Path, dest: &Path) -> Result<()> {
    sync_tree(tmp)?;
    if dest.exists() {
        fs::remove_dir_all(dest).with_context(|| format!("removing {}", dest.display()))?;
    }
    rename(tmp, dest)?;
    sync_dir(&parent(dest))
}

/// Creates folder `out` holding what `fill` writes into the folder it is given: `fill` writes
/// into a temporary sibling, which is fsynced and renamed into place, so `out` either does not
/// exist or is complete. `out` may exist only as an empty folder: anything else there (a
/// folder with files, a file, a link) is the user's and is refused before anything is
/// written. The temporary sibling gets a fresh name (never an existing folder's, which is
/// never removed); a failed `fill` leaves nothing behind.
pub fn publish(out: &Path, fill: impl FnOnce(&Path) -> Result<()>) -> Result<()> {
    ensure_free(out)?;
    let name = out
        .file_name()
        .ok_or_else(|| anyhow!("{}: not a folder name", out.display()))?
        .to_string_lossy()
        .into_owned();
    let dir = parent(out);
    fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let tmp = fresh_dir(&dir, &name)?;
    if let Err(e) = fill(&tmp).and_then(|()| sync_tree(&tmp)) {
        let _ = fs::remove_dir_all(&tmp);
        return Err(e);
    }
    let committed = (|| {
        // `out` was checked above; a folder that appeared since is refused by the rename
        // (ENOTEMPTY) unless it is empty, and an empty one is what `out` may be.
        if fs::symlink_metadata(out).is_ok_and(|m| m.is_dir()) {
            fs::remove_dir(out).with_context(|| {
                format!(
                    "{} appeared while it was written; it was left as it is",
                    out.display()
                )
            })?;
        }
        rename(&tmp, out)
    })();
    if let Err(e) = committed {
        let _ = fs::remove_dir_all(&tmp);
        return Err(e);
    }
    sync_dir(&dir)
}

/// Refuses `out` unless it is missing or an empty folder (not a link to one): what
/// [`publish`] may create.
pub fn ensure_free(out: &Path) -> Result<()> {
    let Ok(meta) = fs::symlink_metadata(out) else {
        return Ok(());
    };
    let empty_dir = meta.is_dir()
        && fs::read_dir(out)
            .map(|mut d| d.next().is_none())
            .unwrap_or(false);
    ensure!(
        empty_dir,
        "{} already exists{}; remove it or choose another folder (nothing was written)",
        out.display(),
        if meta.is_dir() {
            " and is not empty"
        } else {
            ""
        }
    );
    Ok(())
}

/// A new, empty folder in `dir` for the contents of `name`, under a name no other folder
/// there has (`.<name>.tmp-<pid>-<n>`; an existing one is skipped, never reused or removed).
fn fresh_dir(dir: &Path, name: &str) -> Result<PathBuf> {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    loop {
        let tmp = dir.join(format!(
            ".{name}.tmp-{}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        match fs::create_dir(&tmp) {
            Ok(()) => return Ok(tmp),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e).with_context(|| format!("creating {}", tmp.display())),
        }
    }
}

/// The folder holding `path` (`.` for a bare name).
fn parent(path: &Path) -> PathBuf {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn write_replaces_a_file_whole() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.json");
        write(&path, b"one").unwrap();
        write(&path, b"two").unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"two");
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1, "no temp left");
    }

    #[test]
    fn publish_is_all_or_nothing_and_refuses_a_full_folder() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("out");
        let failed = publish(&out, |tmp| {
            fs::write(tmp.join("half"), b"x")?;
            Err(anyhow!("crash"))
        });
        assert!(failed.is_err());
        assert!(!out.exists());
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 0, "no temp left");
        publish(&out, |tmp| {
            fs::create_dir(tmp.join("sub"))?;
            Ok(fs::write(tmp.join("sub/f"), b"x")?)
        })
        .unwrap();
        assert_eq!(fs::read(out.join("sub/f")).unwrap(), b"x");
        let again = publish(&out, |_| Ok(())).unwrap_err().to_string();
        assert!(again.contains("already exists"), "{again}");
        // A folder with a temporary's name is someone's folder: neither reused nor removed.
        let theirs: Vec<PathBuf> = (0..64)
            .map(|n| {
                dir.path()
                    .join(format!(".next.tmp-{}-{n}", std::process::id()))
            })
            .collect();
        for t in &theirs {
            fs::create_dir(t).unwrap();
            fs::write(t.join("keep"), b"k").unwrap();
        }
        publish(&dir.path().join("next"), |tmp| {
            Ok(fs::write(tmp.join("f"), b"x")?)
        })
        .unwrap();
        assert_eq!(fs::read(dir.path().join("next/f")).unwrap(), b"x");
        for t in &theirs {
            assert_eq!(fs::read(t.join("keep")).unwrap(), b"k");
        }
        // A file, or a link to an empty folder, is not an empty folder.
        fs::write(dir.path().join("file"), b"mine").unwrap();
        assert!(publish(&dir.path().join("file"), |_| Ok(())).is_err());
        assert_eq!(fs::read(dir.path().join("file")).unwrap(), b"mine");
        fs::create_dir(dir.path().join("empty")).unwrap();
        std::os::unix::fs::symlink("empty", dir.path().join("link")).unwrap();
        assert!(publish(&dir.path().join("link"), |_| Ok(())).is_err());
    }

    #[test]
    fn replace_dir_swaps_in_the_new_folder() {
        let dir = tempfile::tempdir().unwrap();
        let (tmp, dest) = (dir.path().join("tmp"), dir.path().join("dest"));
        fs::create_dir(&dest).unwrap();
        fs::write(dest.join("old"), b"o").unwrap();
        fs::create_dir(&tmp).unwrap();
        fs::write(tmp.join("new"), b"n").unwrap();
        replace_dir(&tmp, &dest).unwrap();
        assert!(!tmp.exists() && !dest.join("old").exists());
        assert_eq!(fs::read(dest.join("new")).unwrap(), b"n");
    }
}
