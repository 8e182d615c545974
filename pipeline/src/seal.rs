//! Seals: a stage's output hashed by the process that ran the stage, right after the stage
//! wrote it and on the same node (the bytes are still in that node's page cache), so that
//! committing it reads none of them again.
//!
//! The seal (`.zflow-seal.json` in the attempt folder) lists every file with its size, blake3
//! and modification time, each stat taken before the file was hashed. The commit
//! ([`crate::store::Store::commit`]) only stats the folder: when every file is there with the
//! size and time its seal records, and no other file is, the seal's hashes become the
//! manifest's; anything else (no seal, a file added, removed or touched since) and the commit
//! hashes the folder itself, as it did before seals. Bytes changed in place without the time
//! changing are what `zflow verify` finds ([`crate::store::verify`]).

use std::fs;
use std::path::Path;
use std::time::UNIX_EPOCH;

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use zflow_files::atomic;

use crate::stage::CancelToken;
use crate::store::{FileEntry, resolve_links, walk};

/// Name of the seal inside an attempt folder; never part of a committed output.
pub const SEAL: &str = ".zflow-seal.json";

/// One sealed file: its manifest entry and when it was last modified.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct SealedFile {
    #[serde(flatten)]
    entry: FileEntry,
    /// Modification time, nanoseconds since the Unix epoch.
    modified_ns: u128,
}

#[derive(Serialize, Deserialize)]
struct Seal {
    files: Vec<SealedFile>,
}

/// Size and modification time of the file at `path`.
fn stat(path: &Path) -> Result<(u64, u128)> {
    let meta = fs::metadata(path).with_context(|| format!("reading {}", path.display()))?;
    let modified = meta
        .modified()
        .with_context(|| format!("reading {}", path.display()))?
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos();
    Ok((meta.len(), modified))
}

/// Seals the stage output in `work`: resolves its links ([`resolve_links`]), then stats and
/// hashes every file, and writes the seal. Ends with a "cancelled" error between files once
/// `cancel` is set.
pub fn seal(work: &Path, cancel: &CancelToken) -> Result<()> {
    resolve_links(work)?;
    let mut files = Vec::new();
    for rel in walk(work)? {
        if cancel.is_cancelled() {
            anyhow::bail!("cancelled");
        }
        let path = work.join(&rel);
        // Stat first: a file written again while it is hashed has a later time than the seal
        // records, so the commit does not trust the seal's hash of it.
        let (_, modified_ns) = stat(&path)?;
        let (size, blake3) = zflow_files::hash::file(&path)?;
        files.push(SealedFile {
            entry: FileEntry {
                path: rel,
                size,
                blake3,
            },
            modified_ns,
        });
    }
    atomic::write(&work.join(SEAL), &serde_json::to_vec(&Seal { files })?)
}

/// The files of `work` as its seal records them, when the seal still describes the folder
/// (same files, sizes and times); `None` when there is no seal or it is stale, with the
/// reason logged. The seal is removed either way, so it never enters an output.
pub(crate) fn sealed_files(work: &Path) -> Result<Option<Vec<FileEntry>>> {
    let path = work.join(SEAL);
    let seal: Seal = match fs::read(&path) {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .with_context(|| format!("parsing the seal {}", path.display()))?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    };
    fs::remove_file(&path).with_context(|| format!("removing {}", path.display()))?;
    let names = walk(work)?;
    if names.len() != seal.files.len() {
        tracing::info!(
            "{}: {} files, its seal lists {}; hashing them again",
            work.display(),
            names.len(),
            seal.files.len()
        );
        return Ok(None);
    }
    for (name, sealed) in names.iter().zip(&seal.files) {
        let current = stat(&work.join(name))?;
        if *name != sealed.entry.path || current != (sealed.entry.size, sealed.modified_ns) {
            tracing::info!(
                "{}: {name} changed since the stage sealed it; hashing the output again",
                work.display()
            );
            return Ok(None);
        }
    }
    Ok(Some(seal.files.into_iter().map(|f| f.entry).collect()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::IdentityDoc;
    use crate::store::{Manifest, Store, content_hash, hash_tree, verify};

    /// The identity of a stage of kind `kind` with no config and no inputs.
    fn doc(kind: &str) -> IdentityDoc {
        IdentityDoc {
            kind: kind.into(),
            version: 1,
            config: serde_json::json!({}),
            inputs: Default::default(),
            external: None,
        }
    }

    fn commit(store: &Store, work: &Path, id: &str, doc: &IdentityDoc) -> Manifest {
        let m = Manifest {
            stage: "s".into(),
            identity: id.into(),
            identity_doc: doc.clone(),
            content_hash: String::new(),
            files: vec![],
            started_ms: 0,
            finished_ms: 0,
            zflow_version: "t".into(),
        };
        store.commit("s", work, m, &CancelToken::default()).unwrap()
    }

    /// Rewrites byte 0 of `path` and gives the file back its modification time: a change the
    /// seal cannot see, so a commit that takes the seal's hash shows it read no bytes.
    fn flip_first_byte_keeping_time(path: &Path) {
        let modified = fs::metadata(path).unwrap().modified().unwrap();
        let mut bytes = fs::read(path).unwrap();
        bytes[0] ^= 1;
        fs::write(path, &bytes).unwrap();
        fs::File::options()
            .write(true)
            .open(path)
            .unwrap()
            .set_modified(modified)
            .unwrap();
    }

    #[test]
    fn a_commit_takes_the_seals_hashes_and_verify_finds_what_changed_unseen() {
        let tmp = tempfile::tempdir().unwrap();
        let store = Store::open(tmp.path()).unwrap();
        let doc = doc("k");
        let id = doc.hash();
        let work = store.attempt_dir("s", &id, "1");
        fs::create_dir_all(work.join("sub")).unwrap();
        fs::write(work.join("a.bin"), vec![7u8; 100_000]).unwrap();
        fs::write(work.join("sub/b.txt"), "world").unwrap();
        seal(&work, &CancelToken::default()).unwrap();
        let sealed = hash_tree(&work).unwrap();
        flip_first_byte_keeping_time(&work.join("a.bin"));

        let m = commit(&store, &work, &id, &doc);
        assert_eq!(m.files, sealed, "the commit hashed the files itself");
        let out = store.output_dir("s", &id);
        assert!(!out.join(SEAL).exists());
        let found = verify(&out).unwrap();
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(
            found[0].starts_with("a.bin: blake3") && found[0].contains("the bytes changed"),
            "{found:?}"
        );
        fs::remove_file(out.join("sub/b.txt")).unwrap();
        fs::write(out.join("c"), "new").unwrap();
        let found = verify(&out).unwrap();
        assert!(
            found.contains(&"c: not in the manifest".to_string())
                && found.contains(&"sub/b.txt: missing".to_string()),
            "{found:?}"
        );
    }

    #[test]
    fn a_stale_seal_is_not_trusted() {
        let tmp = tempfile::tempdir().unwrap();
        let store = Store::open(tmp.path()).unwrap();
        for change in ["rewritten", "added", "removed"] {
            let doc = doc(change);
            let id = doc.hash();
            let work = store.attempt_dir("s", &id, "1");
            fs::create_dir_all(&work).unwrap();
            fs::write(work.join("a"), "one").unwrap();
            fs::write(work.join("b"), "two").unwrap();
            seal(&work, &CancelToken::default()).unwrap();
            match change {
                "rewritten" => {
                    // A later time than the seal's, whatever the clock's resolution.
                    fs::write(work.join("a"), "ONE").unwrap();
                    let later = std::time::SystemTime::now() + std::time::Duration::from_secs(5);
                    fs::File::options()
                        .write(true)
                        .open(work.join("a"))
                        .unwrap()
                        .set_modified(later)
                        .unwrap();
                }
                "added" => fs::write(work.join("c"), "three").unwrap(),
                _ => fs::remove_file(work.join("b")).unwrap(),
            }
            let m = commit(&store, &work, &id, &doc);
            let out = store.output_dir("s", &id);
            assert_eq!(
                m.content_hash,
                content_hash(&hash_tree(&out).unwrap()),
                "{change}"
            );
            assert!(verify(&out).unwrap().is_empty(), "{change}");
        }
    }
}
