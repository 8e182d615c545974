//! The content-addressed store.
//!
//! ```text
//! <store>/<stage>-<short identity>/          a complete output (the manifest is inside)
//! <store>/<stage>-<short identity>/.zflow-manifest.json
//! <store>/<stage>-<short identity>.partial/  a resumable stage's unfinished output
//! <store>/<stage>-<short identity>.tmp-*/    a non-resumable attempt in progress
//! <store>/.zflow/logs/<stage>-<short>.log    the stage's log (all attempts)
//! <store>/.zflow/leases/<stage>-<short>.lease  who runs it now
//! <store>/.zflow/index/<stage>.json          the last completed identity of each stage name
//! <store>/.zflow/records/*.parquet           run records (one file per attempt)
//! <store>/.zflow/cache/                      shared downloads
//! ```
//! An output is complete only when its folder exists under its final name *with* a manifest
//! whose identity matches. The manifest is written into the attempt folder, fsynced, and the
//! folder renamed into place, so a crash at any moment leaves either no output or a whole one.

use std::fs;

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail, ensure};
use serde::{Deserialize, Serialize};
use zflow_files::atomic;

use crate::identity::{IdentityDoc, short};
use crate::stage::CancelToken;

/// Name of the manifest file inside a completed output folder.
pub const MANIFEST: &str = ".zflow-manifest.json";

/// One output file.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FileEntry {
    /// Path relative to the output folder, `/`-separated.
    pub path: String,
    /// Size in bytes.
    pub size: u64,
    /// blake3 of the contents.
    pub blake3: String,
}

/// What a completed output holds and how it was made. Written last.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Manifest {
    /// Stage name.
    pub stage: String,
    /// Full identity.
    pub identity: String,
    /// What the identity hashes.
    pub identity_doc: IdentityDoc,
    /// blake3 over the file list (paths, sizes, file hashes): what downstream identities use.
    pub content_hash: String,
    /// Every output file.
    pub files: Vec<FileEntry>,
    /// Unix milliseconds when the attempt started.
    pub started_ms: i64,
    /// Unix milliseconds when the output was committed.
    pub finished_ms: i64,
    /// The zflow version that made it.
    pub zflow_version: String,
}

/// The last completed identity of a stage name, so `zflow why` can say what changed since.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct IndexEntry {
    /// Full identity.
    pub identity: String,
    /// What it hashes.
    pub identity_doc: IdentityDoc,
    /// Unix milliseconds of completion.
    pub finished_ms: i64,
}

/// A store rooted at a folder.
#[derive(Clone, Debug)]
pub struct Store {
    root: PathBuf,
}

impl Store {
    /// Opens (creating if needed) the store at `root`. A store zflow creates is private to
    /// its owner (mode 0700): it holds logs, configs, run records and data that other users
    /// of the machine have no business reading, whatever the umask. A folder that exists
    /// keeps the permissions its owner gave it (how a team shares a store: SECURITY.md).
    pub fn open(root: &Path) -> Result<Store> {
        if !root.exists() {
            use std::os::unix::fs::DirBuilderExt;
            if let Some(parent) = root.parent().filter(|p| !p.as_os_str().is_empty()) {
                fs::create_dir_all(parent)
                    .with_context(|| format!("creating {}", parent.display()))?;
            }
            match fs::DirBuilder::new().mode(0o700).create(root) {
                Ok(()) => {}
                // Another run created it first: it is a store folder all the same.
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(e) => {
                    return Err(e).with_context(|| format!("creating store {}", root.display()));
                }
            }
        }
        for sub in ["logs", "leases", "index", "records", "cache"] {
            fs::create_dir_all(root.join(".zflow").join(sub))
                .with_context(|| format!("creating store folders in {}", root.display()))?;
        }
        // Absolute, so child processes started elsewhere see the same paths.
        let root = root
            .canonicalize()
            .with_context(|| format!("opening store {}", root.display()))?;
        Ok(Store { root })
    }

    /// The store's root folder.
    pub fn root(&self) -> &Path {
        &self.root
    }

    fn slot(name: &str, identity: &str) -> String {
        format!("{name}-{}", short(identity))
    }

    /// The final output folder of `name` at `identity`.
    pub fn output_dir(&self, name: &str, identity: &str) -> PathBuf {
        self.root.join(Self::slot(name, identity))
    }

    /// The folder a resumable stage accumulates its output in until it completes.
    pub fn partial_dir(&self, name: &str, identity: &str) -> PathBuf {
        self.root
            .join(format!("{}.partial", Self::slot(name, identity)))
    }

    /// A fresh folder for one attempt of a non-resumable stage.
    pub fn attempt_dir(&self, name: &str, identity: &str, attempt: &str) -> PathBuf {
        self.root
            .join(format!("{}.tmp-{attempt}", Self::slot(name, identity)))
    }

    /// The stage's log file.
    pub fn log_path(&self, name: &str, identity: &str) -> PathBuf {
        self.root
            .join(".zflow/logs")
            .join(format!("{}.log", Self::slot(name, identity)))
    }

    /// The stage's lease file.
    pub fn lease_path(&self, name: &str, identity: &str) -> PathBuf {
        self.root
            .join(".zflow/leases")
            .join(format!("{}.lease", Self::slot(name, identity)))
    }

    /// Where run records go.
    pub fn records_dir(&self) -> PathBuf {
        self.root.join(".zflow/records")
    }

    /// The shared download cache.
    pub fn cache_dir(&self) -> PathBuf {
        self.root.join(".zflow/cache")
    }

    /// The manifest of `name` at `identity`, if that output is complete.
    pub fn manifest(&self, name: &str, identity: &str) -> Option<Manifest> {
        let path = self.output_dir(name, identity).join(MANIFEST);
        let text = fs::read(&path).ok()?;
        let m: Manifest = serde_json::from_slice(&text).ok()?;
        (m.identity == identity).then_some(m)
    }

    /// The last completed identity recorded for stage `name`.
    pub fn last_completed(&self, name: &str) -> Option<IndexEntry> {
        let text = fs::read(self.root.join(".zflow/index").join(format!("{name}.json"))).ok()?;
        serde_json::from_slice(&text).ok()
    }

    /// Makes `work` (an attempt or partial folder) the complete output of `name` at the
    /// manifest's identity: replaces its symbolic links by what they point at
    /// ([`resolve_links`]), takes the files' hashes from the stage's seal
    /// ([`crate::seal`]) when it still describes them and otherwise hashes every file (until
    /// `cancel` is set), writes the manifest last, fsyncs, renames.
    pub fn commit(
        &self,
        name: &str,
        work: &Path,
        mut manifest: Manifest,
        cancel: &CancelToken,
    ) -> Result<Manifest> {
        resolve_links(work)?;
        let files = match crate::seal::sealed_files(work)? {
            Some(files) => files,
            None => hash_tree_until(work, cancel)?,
        };
        manifest.content_hash = content_hash(&files);
        manifest.files = files;
        manifest.finished_ms = now_ms();
        atomic::write(&work.join(MANIFEST), &serde_json::to_vec_pretty(&manifest)?)?;
        atomic::sync_tree(work)?;
        let dest = self.output_dir(name, &manifest.identity);
        if dest.exists() {
            // A folder without a valid manifest (should not happen; never trust it).
            let trash = self
                .root
                .join(format!(".trash-{}-{}", std::process::id(), now_ms()));
            fs::rename(&dest, &trash)?;
            let _ = fs::remove_dir_all(&trash);
        }
        fs::rename(work, &dest)
            .with_context(|| format!("committing {} -> {}", work.display(), dest.display()))?;
        atomic::sync_dir(&self.root)?;
        let entry = IndexEntry {
            identity: manifest.identity.clone(),
            identity_doc: manifest.identity_doc.clone(),
            finished_ms: manifest.finished_ms,
        };
        atomic::write(
            &self.root.join(".zflow/index").join(format!("{name}.json")),
            &serde_json::to_vec_pretty(&entry)?,
        )?;
        Ok(manifest)
    }

    /// Whether `root` is a zflow store (a run has made its `.zflow/` folder there). Nothing is
    /// created: commands that must not touch other folders (gc) check this before opening.
    pub fn is_store(root: &Path) -> bool {
        ["logs", "leases", "index", "records"]
            .iter()
            .all(|sub| root.join(".zflow").join(sub).is_dir())
    }

    /// The folders at the top of the store that the store owns (outputs, partials, attempts:
    /// `<stage>-<12 hex digits>`, then nothing, `.partial` or `.tmp-<attempt>`), each with its
    /// slot (`<stage>-<12 hex digits>`). Anything else there (a file, a folder of someone
    /// else's) is not the store's and is never listed.
    pub fn stage_folders(&self) -> Result<Vec<(String, String)>> {
        let mut out = Vec::new();
        let entries = fs::read_dir(&self.root)
            .with_context(|| format!("reading store {}", self.root.display()))?;
        for entry in entries {
            let entry = entry.with_context(|| format!("reading store {}", self.root.display()))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            let is_dir = entry.file_type().is_ok_and(|t| t.is_dir());
            if let Some(slot) = owned_slot(&name).filter(|_| is_dir) {
                out.push((name.clone(), slot.to_string()));
            }
        }
        out.sort();
        Ok(out)
    }
}

/// The slot (`<stage>-<12 hex digits>`) of a store folder name, if the name is one the store
/// makes: the slot alone, or followed by `.partial` or `.tmp-<attempt>`.
fn owned_slot(name: &str) -> Option<&str> {
    let slot = match name.find(".tmp-") {
        Some(i) => &name[..i],
        None => name.strip_suffix(".partial").unwrap_or(name),
    };
    let (stage, hash) = slot.rsplit_once('-')?;
    let hex = hash.len() == 12
        && hash
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    (hex && !stage.is_empty() && !stage.starts_with('.')).then_some(slot)
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// Replaces every symbolic link under `dir` by a copy of what it points at (a file, or a
/// folder copied whole, links inside it resolved the same way), so that a committed output
/// holds only its own files: what the manifest hashed is what is served and read later,
/// never a host file a link reaches outside the store, nor one that changed since. A link
/// that points nowhere, at a folder holding it (a cycle), or at something that is neither a
/// file nor a folder is refused by name.
pub fn resolve_links(dir: &Path) -> Result<()> {
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in fs::read_dir(&d).with_context(|| format!("listing {}", d.display()))? {
            let entry = entry?;
            let path = entry.path();
            let ty = entry.file_type()?;
            if ty.is_dir() {
                stack.push(path);
                continue;
            }
            if !ty.is_symlink() {
                continue;
            }
            let target = fs::canonicalize(&path).with_context(|| {
                format!(
                    "{}: a symbolic link to {}, which cannot be followed",
                    path.display(),
                    fs::read_link(&path)
                        .map(|t| t.display().to_string())
                        .unwrap_or_default()
                )
            })?;
            let meta = fs::metadata(&target)?;
            tracing::info!(
                "{}: a symbolic link; committed as a copy of {}",
                path.display(),
                target.display()
            );
            fs::remove_file(&path).with_context(|| format!("removing {}", path.display()))?;
            let mut chain = vec![fs::canonicalize(&d)?];
            copy_resolved(&target, &meta, &path, &mut chain)?;
        }
    }
    Ok(())
}

/// Copies `src` (described by `meta`, links followed) to `dst`; `chain` holds the folders
/// being copied into, to refuse a link back into one of them.
fn copy_resolved(
    src: &Path,
    meta: &fs::Metadata,
    dst: &Path,
    chain: &mut Vec<PathBuf>,
) -> Result<()> {
    if meta.is_file() {
        fs::copy(src, dst)
            .with_context(|| format!("copying {} to {}", src.display(), dst.display()))?;
        return Ok(());
    }
    ensure!(
        meta.is_dir(),
        "{}: neither a file nor a folder; a stage output holds only files and folders",
        src.display()
    );
    let canonical = fs::canonicalize(src)?;
    ensure!(
        !chain.iter().any(|c| c.starts_with(&canonical)),
        "{}: a symbolic link to a folder holding it ({}): it cannot be committed as a copy",
        dst.display(),
        canonical.display()
    );
    fs::create_dir(dst).with_context(|| format!("creating {}", dst.display()))?;
    chain.push(canonical);
    for entry in fs::read_dir(src).with_context(|| format!("listing {}", src.display()))? {
        let from = entry?.path();
        let meta = fs::metadata(&from).with_context(|| {
            format!(
                "{}: a symbolic link that cannot be followed",
                from.display()
            )
        })?;
        let to = dst.join(from.file_name().expect("a listed entry has a name"));
        copy_resolved(&from, &meta, &to, chain)?;
    }
    chain.pop();
    Ok(())
}

/// Relative paths of all regular files under `dir`, sorted, manifest and seal excluded.
pub(crate) fn walk(dir: &Path) -> Result<Vec<String>> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in fs::read_dir(&d).with_context(|| format!("listing {}", d.display()))? {
            let entry = entry?;
            let ty = entry.file_type()?;
            let path = entry.path();
            if ty.is_dir() {
                stack.push(path);
            } else if let Some(kind) = special_kind(&ty) {
                // Opening a FIFO to hash it would wait for a writer forever.
                bail!(
                    "{}: a {kind}; a stage's output holds only files, folders and links to them",
                    path.display()
                );
            } else {
                let rel = path
                    .strip_prefix(dir)
                    .expect("under dir")
                    .to_string_lossy()
                    .replace('\\', "/");
                if rel != MANIFEST && rel != crate::seal::SEAL {
                    out.push(rel);
                }
            }
        }
    }
    out.sort();
    Ok(out)
}

/// What a file type is when it is none of a file, a folder and a link: those an output may not
/// hold.
fn special_kind(ty: &fs::FileType) -> Option<&'static str> {
    use std::os::unix::fs::FileTypeExt;
    if ty.is_fifo() {
        Some("FIFO (named pipe)")
    } else if ty.is_socket() {
        Some("socket")
    } else if ty.is_block_device() || ty.is_char_device() {
        Some("device file")
    } else {
        None
    }
}

/// Hashes every file under `dir` (a committed output has no links: [`resolve_links`]). A
/// FIFO, socket or device file is refused by name.
pub fn hash_tree(dir: &Path) -> Result<Vec<FileEntry>> {
    hash_tree_until(dir, &CancelToken::default())
}

/// [`hash_tree`], ending with a "cancelled" error between files once `cancel` is set: the
/// first Ctrl-C ends a commit that would hash a large output.
fn hash_tree_until(dir: &Path, cancel: &CancelToken) -> Result<Vec<FileEntry>> {
    walk(dir)?
        .into_iter()
        .map(|rel| {
            if cancel.is_cancelled() {
                bail!("cancelled");
            }
            let (size, hash) = zflow_files::hash::file(&dir.join(&rel))?;
            Ok(FileEntry {
                path: rel,
                size,
                blake3: hash,
            })
        })
        .collect()
}

/// What differs between the committed output in `dir` and its manifest, each difference a
/// line naming the file: its bytes hashed again (every byte is read), files missing from the
/// folder or not in the manifest. Empty when the output is what was committed.
pub fn verify(dir: &Path) -> Result<Vec<String>> {
    let path = dir.join(MANIFEST);
    let manifest: Manifest = serde_json::from_slice(
        &fs::read(&path).with_context(|| format!("reading {}", path.display()))?,
    )
    .with_context(|| format!("parsing {}", path.display()))?;
    let recorded: std::collections::BTreeMap<&str, &FileEntry> = manifest
        .files
        .iter()
        .map(|f| (f.path.as_str(), f))
        .collect();
    let mut differences = Vec::new();
    let present = walk(dir)?;
    for rel in &present {
        let Some(want) = recorded.get(rel.as_str()) else {
            differences.push(format!("{rel}: not in the manifest"));
            continue;
        };
        let (size, hash) = zflow_files::hash::file(&dir.join(rel))?;
        if size != want.size {
            differences.push(format!(
                "{rel}: {size} bytes, the manifest says {}",
                want.size
            ));
        } else if hash != want.blake3 {
            differences.push(format!(
                "{rel}: blake3 {hash}, the manifest says {} (the bytes changed)",
                want.blake3
            ));
        }
    }
    for f in &manifest.files {
        if present.binary_search(&f.path).is_err() {
            differences.push(format!("{}: missing", f.path));
        }
    }
    Ok(differences)
}

/// The hash downstream identities see: over paths, sizes and file hashes, in path order.
pub fn content_hash(files: &[FileEntry]) -> String {
    content_hash_of(files.iter())
}

/// [`content_hash`] of some of an output's files (in path order): what the identity of a stage
/// that reads only those sees ([`crate::Stage::reads_only`]).
pub fn content_hash_of<'a>(files: impl Iterator<Item = &'a FileEntry>) -> String {
    let mut h = blake3::Hasher::new();
    for f in files {
        h.update(f.path.as_bytes());
        h.update(&[0]);
        h.update(&f.size.to_le_bytes());
        h.update(f.blake3.as_bytes());
        h.update(b"\n");
    }
    h.finalize().to_hex().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owned_slots_are_only_the_names_the_store_makes() {
        assert_eq!(
            owned_slot("fetch.web-0123456789ab"),
            Some("fetch.web-0123456789ab")
        );
        assert_eq!(
            owned_slot("train.p1-0123456789ab.partial"),
            Some("train.p1-0123456789ab")
        );
        assert_eq!(
            owned_slot("a-b-0123456789ab.tmp-17-3"),
            Some("a-b-0123456789ab")
        );
        for foreign in [
            "notes",
            "README",
            "docs-2024",
            "x-0123456789AB",
            "x-0123456789a",
            ".zflow",
            "-0123456789ab",
        ] {
            assert_eq!(owned_slot(foreign), None, "{foreign}");
        }
    }
    use std::collections::BTreeMap;

    fn doc() -> IdentityDoc {
        IdentityDoc {
            kind: "k".into(),
            version: 1,
            config: serde_json::json!({}),
            inputs: BTreeMap::new(),
            external: None,
        }
    }

    #[test]
    fn commit_makes_a_complete_output_and_content_hash_ignores_the_manifest() {
        let tmp = tempfile::tempdir().unwrap();
        let store = Store::open(tmp.path()).unwrap();
        let d = doc();
        let id = d.hash();
        let work = store.attempt_dir("s", &id, "1");
        fs::create_dir_all(work.join("sub")).unwrap();
        fs::write(work.join("a.txt"), "hello").unwrap();
        fs::write(work.join("sub/b.txt"), "world").unwrap();
        assert!(store.manifest("s", &id).is_none());
        let m = Manifest {
            stage: "s".into(),
            identity: id.clone(),
            identity_doc: d,
            content_hash: String::new(),
            files: vec![],
            started_ms: 0,
            finished_ms: 0,
            zflow_version: "t".into(),
        };
        let m = store
            .commit("s", &work, m, &CancelToken::default())
            .unwrap();
        assert_eq!(m.files.len(), 2);
        let again = store.manifest("s", &id).unwrap();
        assert_eq!(again.content_hash, m.content_hash);
        assert_eq!(
            content_hash(&hash_tree(&store.output_dir("s", &id)).unwrap()),
            m.content_hash
        );
        assert_eq!(store.last_completed("s").unwrap().identity, id);
    }
}
