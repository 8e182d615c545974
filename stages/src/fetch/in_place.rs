//! Local files read where they are, not copied into the store.
//!
//! A fetch of a local path with `in_place: true` (what `sources:` sets for a local source it
//! ingests) writes, for each file, a small JSON [`Pointer`] under the file's own relative path,
//! plus [`MARKER`] at the top of its output. The pointer holds the file's absolute path, size
//! and BLAKE3, so the output's content hash, and with it every downstream identity, changes
//! exactly when a file's content does: a changed file re-runs only its shard.
//!
//! Neither the plan nor the fetch reads an unchanged file. A file's [`stat_fingerprint`] (path,
//! size, modification and change time in ns, inode) is what the fetch's identity hashes, and
//! its content hash is computed once and kept in the store's cache under that fingerprint
//! ([`content_hash`]). Any write to a file changes its change time, which nothing but the
//! kernel sets, so a stale cache entry is never found.
//!
//! The reader ([`resolve`]) checks the file against the cache before reading it: a file edited
//! after its fetch ran is refused with a message, not read as if it were the fetched one.

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};

/// The file at the top of an in-place fetch's output that says its other files are pointers.
/// Hidden, so no ingest selection reads it as data.
pub const MARKER: &str = ".in-place.json";

/// What an in-place fetch writes in place of one file.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Pointer {
    /// The file's path as the fetch's `url` names it: relative to where zflow runs when the
    /// `url` is, so the same files fetched from another checkout give the same output.
    pub path: PathBuf,
    /// Its size in bytes when fetched.
    pub size: u64,
    /// The BLAKE3 (hex) of its content when fetched.
    pub blake3: String,
}

/// Path, size, modification and change time (ns) and inode of `path`, as one line: what a
/// local fetch's identity hashes instead of the file's bytes.
pub fn stat_fingerprint(path: &Path) -> Result<String> {
    let m = fs::metadata(path).with_context(|| format!("reading {}", path.display()))?;
    Ok(format!(
        "{}\0{}\0{}.{:09}\0{}.{:09}\0{}:{}",
        path.display(),
        m.len(),
        m.mtime(),
        m.mtime_nsec(),
        m.ctime(),
        m.ctime_nsec(),
        m.dev(),
        m.ino()
    ))
}

/// Where the cache keeps the content hash of a file with fingerprint `fingerprint`.
fn cache_entry(cache_dir: &Path, fingerprint: &str) -> PathBuf {
    let key = blake3::hash(fingerprint.as_bytes()).to_hex();
    cache_dir
        .join("file-hashes")
        .join(&key[..2])
        .join(&key[2..])
}

/// The cached content hash of the file with `fingerprint`, if one was computed.
fn cached(cache_dir: &Path, fingerprint: &str) -> Option<String> {
    fs::read_to_string(cache_entry(cache_dir, fingerprint))
        .ok()
        .filter(|h| h.len() == 64 && h.chars().all(|c| c.is_ascii_hexdigit()))
}

/// Size and BLAKE3 of the file at `path`: from the cache when its fingerprint has not changed
/// since it was last hashed, else by reading it (and then cached). Returns whether it was read.
pub fn content_hash(cache_dir: &Path, path: &Path) -> Result<(u64, String, bool)> {
    let fingerprint = stat_fingerprint(path)?;
    let size = fs::metadata(path)?.len();
    if let Some(hash) = cached(cache_dir, &fingerprint) {
        return Ok((size, hash, false));
    }
    let (read_size, hash) = zflow_files::hash::file(path)?;
    // Cache only what was read from the file as fingerprinted: a file written to while it was
    // hashed has another fingerprint now, and its hash is not cached under either.
    if read_size == size && stat_fingerprint(path)? == fingerprint {
        let entry = cache_entry(cache_dir, &fingerprint);
        fs::create_dir_all(entry.parent().unwrap_or(cache_dir))?;
        zflow_files::atomic::write(&entry, hash.as_bytes())?;
    }
    Ok((read_size, hash, true))
}

/// Writes the pointer to `file` (named `named` in the pointer) at `dest`, hashing `file` only
/// if its cached hash is stale. Returns whether it read the file.
pub fn write_pointer(cache_dir: &Path, file: &Path, named: &Path, dest: &Path) -> Result<bool> {
    let (size, blake3, read) = content_hash(cache_dir, file)?;
    if let Some(parent) = dest.parent() {
        fs::create_dir_all(parent)?;
    }
    let pointer = Pointer {
        path: named.to_path_buf(),
        size,
        blake3,
    };
    fs::write(dest, serde_json::to_vec(&pointer)?)?;
    Ok(read)
}

/// Whether `fetched` (a fetch stage's output folder) holds pointers rather than files.
pub fn is_in_place(fetched: &Path) -> bool {
    fetched.join(MARKER).is_file()
}

/// The file to read for `file` of the fetched folder: itself, or, in an in-place fetch, the
/// file its pointer names (relative to `cwd`), once checked to be the file the fetch hashed.
pub fn resolve(fetched: &Path, file: &Path, cache_dir: &Path, cwd: &Path) -> Result<PathBuf> {
    if !is_in_place(fetched) {
        return Ok(file.to_path_buf());
    }
    let pointer: Pointer = serde_json::from_slice(
        &fs::read(file).with_context(|| format!("reading {}", file.display()))?,
    )
    .with_context(|| format!("{}: not an in-place fetch's pointer", file.display()))?;
    let path = cwd.join(&pointer.path);
    let changed = || {
        format!(
            "{} changed after its fetch stage recorded it (size {}, blake3 {}): run again, and \
             the fetch records it anew",
            path.display(),
            pointer.size,
            &pointer.blake3[..pointer.blake3.len().min(16)]
        )
    };
    let fingerprint = stat_fingerprint(&path).with_context(changed)?;
    match cached(cache_dir, &fingerprint) {
        Some(hash) if hash == pointer.blake3 => Ok(path),
        // No entry: the cache was cleared, or the file was touched. Hash it once more.
        None if content_hash(cache_dir, &path)?.1 == pointer.blake3 => Ok(path),
        _ => bail!(changed()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_is_hashed_once_until_it_changes_and_a_stale_pointer_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let cache = dir.path().join("cache");
        let data = dir.path().join("a.txt");
        fs::write(&data, "first").unwrap();
        let fetched = dir.path().join("fetched");
        fs::create_dir_all(&fetched).unwrap();
        fs::write(fetched.join(MARKER), "{}").unwrap();
        let pointer = fetched.join("a.txt");

        assert!(
            write_pointer(&cache, &data, &data, &pointer).unwrap(),
            "hashed"
        );
        assert!(
            !write_pointer(&cache, &data, &data, &pointer).unwrap(),
            "cached"
        );
        let p: Pointer = serde_json::from_slice(&fs::read(&pointer).unwrap()).unwrap();
        assert_eq!(p.size, 5);
        assert_eq!(p.blake3, blake3::hash(b"first").to_hex().to_string());
        assert_eq!(
            resolve(&fetched, &pointer, &cache, dir.path()).unwrap(),
            data
        );

        // Same size, new content: the change time moves, so the cache misses and the reader
        // refuses the pointer the fetch wrote before.
        fs::write(&data, "other").unwrap();
        let err = resolve(&fetched, &pointer, &cache, dir.path()).unwrap_err();
        assert!(
            format!("{err:#}").contains("changed after its fetch"),
            "{err:#}"
        );
        // (The refusal hashed the new content, so the next fetch finds it cached.)
        write_pointer(&cache, &data, &data, &pointer).unwrap();
        let p: Pointer = serde_json::from_slice(&fs::read(&pointer).unwrap()).unwrap();
        assert_eq!(p.blake3, blake3::hash(b"other").to_hex().to_string());
        resolve(&fetched, &pointer, &cache, dir.path()).unwrap();

        // Copy mode: the file itself.
        fs::remove_file(fetched.join(MARKER)).unwrap();
        assert_eq!(
            resolve(&fetched, &pointer, &cache, dir.path()).unwrap(),
            pointer
        );
    }
}
