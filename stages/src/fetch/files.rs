//! Local files: glob matches, where a local fetch lays them out, and copying a fetched tree (or
//! a part of an archive) into the output.

use anyhow::{Context, Result, bail};
use std::fs;
use std::path::{Path, PathBuf};

/// Local files matching `pattern` (a path or a glob), as (name, absolute path), sorted.
pub(super) fn local_matches(cwd: &Path, pattern: &str) -> Result<Vec<(String, PathBuf)>> {
    let full = if Path::new(pattern).is_absolute() {
        PathBuf::from(pattern)
    } else {
        cwd.join(pattern)
    };
    let full_s = full.to_string_lossy().into_owned();
    let mut out = Vec::new();
    if pattern.contains(['*', '?', '[']) {
        for entry in
            glob::glob(&full_s).with_context(|| format!("`{pattern}` is not a valid glob"))?
        {
            let path = entry?;
            out.push((
                path.file_name()
                    .unwrap_or_default()
                    .to_string_lossy()
                    .into_owned(),
                path,
            ));
        }
        if out.is_empty() {
            bail!("`{pattern}` matches no files (looked in {})", cwd.display());
        }
    } else {
        if !full.exists() {
            bail!("`{pattern}` does not exist (looked for {})", full.display());
        }
        out.push((
            full.file_name()
                .unwrap_or_default()
                .to_string_lossy()
                .into_owned(),
            full,
        ));
    }
    out.sort();
    Ok(out)
}

/// Every regular file under `path` (or `path` itself), sorted. Anything else (a FIFO, a
/// device such as `/dev/zero`, a socket) is refused: reading it would block or never end.
pub(super) fn walk_files(path: &Path) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    let meta = fs::metadata(path).with_context(|| format!("reading {}", path.display()))?;
    if !meta.is_dir() && !meta.is_file() {
        bail!(
            "{} is not a regular file or folder (a FIFO or a device?): fetch reads only files",
            path.display()
        );
    }
    if path.is_dir() {
        let mut entries: Vec<_> = fs::read_dir(path)?.collect::<Result<_, _>>()?;
        entries.sort_by_key(|e| e.file_name());
        for e in entries {
            out.extend(walk_files(&e.path())?);
        }
    } else {
        out.push(path.to_path_buf());
    }
    Ok(out)
}

/// Where a local fetch puts what its `url` matched (`matches`, from [`local_matches`]), as
/// (destination relative to the output, source), in match order: one folder's contents
/// (destination `""`), as for a package path; otherwise (a file, a glob, several matches) each
/// match under its own name. The one statement of that rule: the copy, the in-place pointers
/// and the file list a recipe sizes its shards by must agree on every path.
pub(super) fn local_layout(matches: &[(String, PathBuf)]) -> Vec<(PathBuf, &Path)> {
    match matches {
        [(_, dir)] if dir.is_dir() => vec![(PathBuf::new(), dir.as_path())],
        _ => matches
            .iter()
            .map(|(_, path)| {
                (
                    PathBuf::from(path.file_name().unwrap_or_default()),
                    path.as_path(),
                )
            })
            .collect(),
    }
}

/// Every file a local fetch brings, as (path relative to the output, file), in
/// [`local_layout`]'s order, each match's files sorted.
pub(super) fn local_entries(matches: &[(String, PathBuf)]) -> Result<Vec<(PathBuf, PathBuf)>> {
    let mut out = Vec::new();
    for (dest, src) in local_layout(matches) {
        for file in walk_files(src)? {
            // Chained components, not `join`: a matched file strips to `""`, and
            // `dest.join("")` would end its path in a `/`.
            let rel = dest
                .components()
                .chain(file.strip_prefix(src).unwrap_or(&file).components())
                .collect();
            out.push((rel, file));
        }
    }
    Ok(out)
}

pub(super) fn copy_tree(src: &Path, dest: &Path) -> Result<()> {
    copy_within(src, dest, None, 0)
}

/// Copies `src` to `dest`. With `archive` (an unpacked archive's canonical root), a link is
/// never followed out of it: every path is resolved and must stay inside the archive, so a link
/// to a file of the archive is copied as that file, and a link that is absolute or leads out of
/// the archive (to `/etc/passwd`, to a host folder) is refused. Nothing from outside an archive
/// enters the store. `depth` stops links that form a cycle.
pub(super) fn copy_within(
    src: &Path,
    dest: &Path,
    archive: Option<&Path>,
    depth: usize,
) -> Result<()> {
    let src = match archive {
        Some(root) => inside_archive(root, src)?,
        None => src.to_path_buf(),
    };
    if src.is_dir() {
        if depth > 64 {
            bail!(
                "{}: folders nested over 64 deep (links in the archive that form a cycle?)",
                src.display()
            );
        }
        fs::create_dir_all(dest)?;
        for e in fs::read_dir(&src)? {
            let e = e?;
            copy_within(&e.path(), &dest.join(e.file_name()), archive, depth + 1)?;
        }
    } else {
        if let Some(parent) = dest.parent() {
            fs::create_dir_all(parent)?;
        }
        fs::copy(&src, dest)
            .with_context(|| format!("copying {} -> {}", src.display(), dest.display()))?;
    }
    Ok(())
}

/// `path` (inside the unpacked archive at canonical `root`) with every link resolved, if it
/// stays inside the archive.
pub(super) fn inside_archive(root: &Path, path: &Path) -> Result<PathBuf> {
    let shown = path
        .strip_prefix(root)
        .unwrap_or(path)
        .display()
        .to_string();
    let link = fs::read_link(path).ok().map(|t| t.display().to_string());
    let what = match &link {
        Some(target) => format!("`{shown}` in the archive is a link to `{target}`"),
        None => format!("`{shown}`"),
    };
    let real = path
        .canonicalize()
        .with_context(|| format!("{what}, which does not exist"))?;
    if !real.starts_with(root) {
        bail!(
            "{what}, outside the archive: refused (nothing from outside an archive enters the store)"
        );
    }
    Ok(real)
}

/// Copies `sub` (a file or folder inside `root`; `""` for `root` itself) to `out`: a file
/// under its own name, a folder's contents directly. With `archive`, `root` is an unpacked
/// archive, whose links are never followed out of it (see [`copy_within`]).
pub(super) fn copy_selected(root: &Path, sub: &str, out: &Path, archive: bool) -> Result<()> {
    let src = if sub.is_empty() {
        root.to_path_buf()
    } else {
        root.join(sub)
    };
    if !src.exists() && fs::symlink_metadata(&src).is_err() {
        bail!(
            "`{sub}` is not in the package (it has: {})",
            top_entries(root)
        );
    }
    let canonical = if archive {
        Some(root.canonicalize()?)
    } else {
        None
    };
    // A folder's contents go straight into `out`, a file under its own name; `copy_within`
    // resolves (and, in an archive, checks) `src` itself before reading anything.
    let dest = if src.is_dir() {
        out.to_path_buf()
    } else {
        out.join(src.file_name().unwrap_or_default())
    };
    copy_within(&src, &dest, canonical.as_deref(), 0)
}

pub(super) fn top_entries(root: &Path) -> String {
    let mut names: Vec<String> = walk_files(root)
        .unwrap_or_default()
        .iter()
        .take(12)
        .map(|p| p.strip_prefix(root).unwrap_or(p).display().to_string())
        .collect();
    names.sort();
    names.join(", ")
}
