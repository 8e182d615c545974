//! Training checkpoints: one directory per step, committed atomically.
//!
//! ```text
//! checkpoints/step-00000120/
//!   model.safetensors       weights, f32, named by module path (`blocks.0.self_attn.qkv.linear_q.weight`)
//!   optim-muon.rank-R.bin   rank R's shard of the Muon momentum (ZeRO-1, see [`layout`])
//!   optim-adamw.rank-R.bin  rank R's shard of the AdamW moments
//!   trainer.json            step, data cursor, balancing-controller state, seed, spike-guard state
//!   layout.json             which rank owns which parameter's optimizer state; expert placement
//!   model.json              the model's sizes (the recipe's `model:`)
//!   manifest.json           blake3 + size of every file above; written last
//! ```
//!
//! A checkpoint is written into `.tmp-step-N/`, every file fsynced, the manifest written last,
//! then the directory renamed into place: a crash at any moment leaves either no checkpoint or a
//! complete one. With several ranks each writes its files into the same temporary directory
//! and rank 0 commits once all have ([`write_part`], [`finish_parts`]). Loading verifies the
//! manifest; a checkpoint that fails is quarantined (moved to `quarantine/`) with a warning and
//! the next older one is used.

pub mod layout;
pub mod optimizer;

use std::collections::BTreeMap;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail, ensure};
use serde::{Deserialize, Serialize};

use crate::contract::balance::BalanceState;
use crate::data::mixture::DataCursor;
use crate::model::config::ModelConfig;

/// Everything besides tensors that a resumed run needs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TrainerState {
    /// The phase this checkpoint belongs to.
    pub phase: String,
    /// Optimizer steps taken in the phase.
    pub step: u64,
    /// Steps in the phase.
    pub total_steps: u64,
    /// Where the next batch starts.
    pub cursor: DataCursor,
    /// The balancing controller of every MoE layer.
    pub balance: Vec<BalanceState>,
    /// Tokens trained on in this phase.
    pub tokens: u64,
    /// The run's seed (data order is a function of the mixture; the trainer draws no other
    /// random numbers, so the seed is the whole RNG state).
    pub seed: u64,
    /// The last losses, which the loss-spike guard judges the next one against.
    #[serde(default)]
    pub loss_history: Vec<f64>,
    /// First samples of the global batches skipped after loss spikes, ascending.
    #[serde(default)]
    pub skipped_batches: Vec<u64>,
    /// Rollbacks after loss spikes so far in the phase.
    #[serde(default)]
    pub rollbacks: u32,
}

impl TrainerState {
    /// The state at step 0 of `phase`: nothing trained yet, no loss history, no skipped batches.
    pub fn new(
        phase: &str,
        total_steps: u64,
        cursor: DataCursor,
        balance: Vec<BalanceState>,
        seed: u64,
    ) -> TrainerState {
        TrainerState {
            phase: phase.to_string(),
            step: 0,
            total_steps,
            cursor,
            balance,
            tokens: 0,
            seed,
            loss_history: Vec::new(),
            skipped_batches: Vec::new(),
            rollbacks: 0,
        }
    }
}

/// The model checkpoint `dir` was trained with: its `model.json` (the recipe's `model:` with
/// the phase's settings, such as its RoPE base, applied), else the `model` of the train job
/// that wrote it (`../job.json`, as a train stage leaves `final/` next to its `job.json`).
/// This is the one reader of a checkpoint's model config: evaluation, export, import and
/// `ckpt inspect` all build the model from it.
pub fn model_config(dir: &Path) -> Result<ModelConfig> {
    let own = dir.join("model.json");
    let job = dir.join("..").join("job.json");
    let config: ModelConfig = if own.exists() {
        serde_json::from_slice(&fs::read(&own)?)
            .with_context(|| format!("parsing {}", own.display()))?
    } else if job.exists() {
        let v: serde_json::Value = serde_json::from_slice(&fs::read(&job)?)
            .with_context(|| format!("parsing {}", job.display()))?;
        let model = v
            .get("model")
            .cloned()
            .with_context(|| format!("{}: no `model` field", job.display()))?;
        serde_json::from_value(model).with_context(|| format!("{}: `model`", job.display()))?
    } else {
        bail!(
            "{}: no model.json in the checkpoint and no job.json next to it, so the model's sizes are unknown; \
             pass --recipe RECIPE to take them from the recipe's `model:` section",
            dir.display()
        )
    };
    Ok(config)
}

/// The `format` metadata entry of the weights zflow writes (the trainer and `hf` import both
/// use it, so equal weights give equal `model.safetensors` bytes).
pub const WEIGHTS_FORMAT: &str = "zflow-zaya1";

/// The manifest: what a complete checkpoint holds.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Manifest {
    /// Step of the checkpoint.
    pub step: u64,
    /// file name -> (bytes, blake3 hex).
    pub files: BTreeMap<String, (u64, String)>,
}

/// Name of the directory of step `step`.
pub fn dir_name(step: u64) -> String {
    format!("step-{step:08}")
}

/// Serialises weights given as (name, shape, f32 values) as safetensors bytes (f32, little
/// endian). Give at most one metadata entry: safetensors orders metadata by a randomly seeded
/// hash map.
pub fn weights_to_safetensors(
    weights: &[(String, Vec<usize>, Vec<f32>)],
    metadata: BTreeMap<String, String>,
) -> Result<Vec<u8>> {
    let bytes: Vec<Vec<u8>> = weights
        .iter()
        .map(|(_, _, values)| values.iter().flat_map(|v| v.to_le_bytes()).collect())
        .collect();
    let views = weights
        .iter()
        .zip(&bytes)
        .map(|((name, shape, _), data)| {
            let view =
                safetensors::tensor::TensorView::new(safetensors::Dtype::F32, shape.clone(), data)
                    .with_context(|| {
                        format!("tensor `{name}`: {shape:?} does not fit its values")
                    })?;
            Ok((name.clone(), view))
        })
        .collect::<Result<Vec<_>>>()?;
    let metadata: std::collections::HashMap<String, String> = metadata.into_iter().collect();
    Ok(safetensors::serialize(views, Some(metadata))?)
}

/// Writes `files` (name -> bytes) as checkpoint `step` under `root`, atomically; returns the
/// committed directory.
pub fn commit(root: &Path, step: u64, files: Vec<(String, Vec<u8>)>) -> Result<PathBuf> {
    let dir = root.join(dir_name(step));
    commit_dir(&dir, files)?;
    Ok(dir)
}

/// Writes `files` as checkpoint directory `dir`, atomically: into `.tmp-<name>` beside it, each
/// file fsynced, the manifest last, then renamed into place.
pub fn commit_dir(dir: &Path, files: Vec<(String, Vec<u8>)>) -> Result<()> {
    let tmp = tmp_dir(dir);
    if tmp.exists() {
        fs::remove_dir_all(&tmp)?;
    }
    fs::create_dir_all(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
    let part = write_files(&tmp, &files)?;
    finish_with(dir, part)
}

/// Writes `files` as a new checkpoint folder `out` of step `step` at a path the user named
/// (`zflow ckpt reshape`): as [`commit_dir`], but `out` must not exist (or be an empty
/// folder), and nothing that exists is ever removed ([`zflow_files::atomic::publish`]).
pub fn publish(out: &Path, step: u64, files: Vec<(String, Vec<u8>)>) -> Result<()> {
    zflow_files::atomic::publish(out, |tmp| {
        let manifest = Manifest {
            step,
            files: write_files(tmp, &files)?,
        };
        write_synced(
            &tmp.join("manifest.json"),
            &serde_json::to_vec_pretty(&manifest)?,
        )
    })
}

/// The temporary directory a checkpoint `dir` is written in before its commit.
pub fn tmp_dir(dir: &Path) -> PathBuf {
    let name = dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    dir.with_file_name(format!(".tmp-{name}"))
}

/// Writes `files` into `tmp` (fsynced) and returns their manifest entries.
///
/// The bytes go to the page cache first; then the disk flushes (fsync, in a second thread)
/// while the hashes are computed (blake3 over all cores), so hashing costs almost no time on
/// top of the disk's own. Each file is closed once written and opened again for its fsync,
/// which flushes the file whichever descriptor wrote it: a checkpoint of 2 x 131,072 optimizer
/// shards held every one open and ran out of descriptors.
pub fn write_files(
    tmp: &Path,
    files: &[(String, Vec<u8>)],
) -> Result<BTreeMap<String, (u64, String)>> {
    let mut written = Vec::with_capacity(files.len());
    for (name, bytes) in files {
        let path = tmp.join(name);
        fs::write(&path, bytes).with_context(|| format!("writing {}", path.display()))?;
        written.push(path);
    }
    std::thread::scope(|scope| {
        let syncer = scope.spawn(|| -> Result<()> {
            for path in &written {
                fs::File::open(path)
                    .and_then(|f| f.sync_all())
                    .with_context(|| format!("flushing {}", path.display()))?;
            }
            Ok(())
        });
        let part = files
            .iter()
            .map(|(name, bytes)| {
                (
                    name.clone(),
                    (
                        bytes.len() as u64,
                        blake3::Hasher::new()
                            .update_rayon(bytes)
                            .finalize()
                            .to_hex()
                            .to_string(),
                    ),
                )
            })
            .collect();
        syncer.join().expect("the fsync thread")?;
        Ok(part)
    })
}

/// One rank's part of a multi-rank checkpoint: writes its files into the shared temporary
/// directory of `dir`, then `part-R.json` (their sizes and hashes) as its vote that they are
/// complete. Rank 0 commits once every rank has voted ([`finish_parts`]).
pub fn write_part(dir: &Path, rank: usize, files: &[(String, Vec<u8>)]) -> Result<()> {
    let tmp = tmp_dir(dir);
    fs::create_dir_all(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
    let part = write_files(&tmp, files)?;
    // Atomically: rank 0 reads the vote as soon as the name exists.
    zflow_files::atomic::write(
        &tmp.join(format!("part-{rank}.json")),
        &serde_json::to_vec(&part)?,
    )
}

/// Rank 0's half of a multi-rank commit: waits (up to `timeout`) until all `world` ranks have
/// written their part of checkpoint `dir`, then writes the manifest of every file and renames
/// the directory into place.
pub fn finish_parts(dir: &Path, world: usize, timeout: std::time::Duration) -> Result<()> {
    let tmp = tmp_dir(dir);
    let started = std::time::Instant::now();
    let mut all = BTreeMap::new();
    for rank in 0..world {
        let path = tmp.join(format!("part-{rank}.json"));
        let part: BTreeMap<String, (u64, String)> = loop {
            if let Ok(bytes) = fs::read(&path) {
                break serde_json::from_slice(&bytes)
                    .with_context(|| format!("parsing {}", path.display()))?;
            }
            ensure!(
                started.elapsed() < timeout,
                "{}: rank {rank} did not write its part within {:?}",
                dir.display(),
                timeout
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        };
        fs::remove_file(&path)?;
        all.extend(part);
    }
    finish_with(dir, all)
}

/// Writes the manifest of `files` into `dir`'s temporary directory and renames it to `dir`:
/// the commit.
pub fn finish_with(dir: &Path, files: BTreeMap<String, (u64, String)>) -> Result<()> {
    let tmp = tmp_dir(dir);
    let step = trailing_number(dir).unwrap_or(0);
    let manifest = Manifest { step, files };
    write_synced(
        &tmp.join("manifest.json"),
        &serde_json::to_vec_pretty(&manifest)?,
    )?;
    // A checkpoint of this step may exist already (a rerun after a crash right after the
    // commit): the new one replaces it.
    zflow_files::atomic::replace_dir(&tmp, dir)
}

fn trailing_number(dir: &Path) -> Option<u64> {
    dir.file_name()?
        .to_str()?
        .strip_prefix("step-")?
        .parse()
        .ok()
}

fn write_synced(path: &Path, bytes: &[u8]) -> Result<()> {
    let mut f = fs::File::create(path).with_context(|| format!("creating {}", path.display()))?;
    f.write_all(bytes)?;
    f.sync_all()?;
    Ok(())
}

/// Checks checkpoint `dir` against its manifest as [`read_verified`] does
/// (every file present with its size and blake3), streaming the files instead of holding them:
/// the optimizer state alone is twice the weights, and export needs none of it. Returns the
/// manifest's file names.
pub fn verify(dir: &Path) -> Result<std::collections::BTreeSet<String>> {
    let mpath = dir.join("manifest.json");
    let manifest: Manifest = serde_json::from_slice(
        &fs::read(&mpath).with_context(|| format!("reading {}", mpath.display()))?,
    )
    .with_context(|| format!("parsing {}", mpath.display()))?;
    for (name, (size, hash)) in &manifest.files {
        let path = dir.join(name);
        let (len, digest) = zflow_files::hash::file(&path)
            .with_context(|| format!("reading {}", path.display()))?;
        ensure!(
            len == *size,
            "{}: {len} bytes, the manifest says {size}",
            path.display()
        );
        ensure!(digest == *hash, "{}: checksum mismatch", path.display());
    }
    Ok(manifest.files.into_keys().collect())
}

/// Checkpoint `dir`'s manifest, unverified.
pub fn manifest(dir: &Path) -> Result<Manifest> {
    let mpath = dir.join("manifest.json");
    serde_json::from_slice(
        &fs::read(&mpath).with_context(|| format!("reading {}", mpath.display()))?,
    )
    .with_context(|| format!("parsing {}", mpath.display()))
}

/// Reads and verifies checkpoint directory `dir`: every file in its manifest present with its
/// size and hash. Returns the files' contents.
pub fn read_verified(dir: &Path) -> Result<BTreeMap<String, Vec<u8>>> {
    let mpath = dir.join("manifest.json");
    let manifest: Manifest = serde_json::from_slice(
        &fs::read(&mpath).with_context(|| format!("reading {}", mpath.display()))?,
    )
    .with_context(|| format!("parsing {}", mpath.display()))?;
    let mut out = BTreeMap::new();
    for (name, (size, hash)) in &manifest.files {
        let path = dir.join(name);
        let bytes = fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
        ensure!(
            bytes.len() as u64 == *size,
            "{}: {} bytes, the manifest says {size}",
            path.display(),
            bytes.len()
        );
        ensure!(
            blake3::hash(&bytes).to_hex().as_str() == hash,
            "{}: checksum mismatch",
            path.display()
        );
        out.insert(name.clone(), bytes);
    }
    Ok(out)
}

/// Committed checkpoint directories under `root`, newest first.
pub fn list(root: &Path) -> Vec<(u64, PathBuf)> {
    let mut found: Vec<(u64, PathBuf)> = fs::read_dir(root)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let step = name.strip_prefix("step-")?.parse().ok()?;
            Some((step, e.path()))
        })
        .collect();
    found.sort_by_key(|f| std::cmp::Reverse(f.0));
    found
}

/// The newest checkpoint under `root` that verifies, with its files; damaged ones are skipped
/// with a warning (never loaded).
pub fn latest(root: &Path) -> Option<(PathBuf, BTreeMap<String, Vec<u8>>)> {
    for (_, dir) in list(root) {
        match read_verified(&dir) {
            Ok(files) => return Some((dir, files)),
            Err(e) => tracing::warn!("skipping checkpoint {}: {e:#}", dir.display()),
        }
    }
    None
}

/// Prepares `root` for a new attempt (rank 0, before any rank reads it): checkpoints that do not
/// verify are moved to `root/quarantine/` with a warning, so they are never loaded and can be
/// looked at; temporary directories of commits that never finished are removed. Returns what
/// it quarantined.
pub fn quarantine_damaged(root: &Path) -> Result<Vec<PathBuf>> {
    let mut moved = Vec::new();
    for entry in fs::read_dir(root).into_iter().flatten().flatten() {
        if entry.file_name().to_string_lossy().starts_with(".tmp-") {
            fs::remove_dir_all(entry.path()).with_context(|| {
                format!(
                    "removing the unfinished checkpoint {}",
                    entry.path().display()
                )
            })?;
        }
    }
    for (_, dir) in list(root) {
        if let Err(e) = read_verified(&dir) {
            let to = root
                .join("quarantine")
                .join(dir.file_name().expect("step-N"));
            fs::create_dir_all(to.parent().expect("parent"))?;
            if to.exists() {
                fs::remove_dir_all(&to)?;
            }
            fs::rename(&dir, &to)?;
            tracing::warn!(
                "quarantined checkpoint {} (it does not verify: {e:#}); it will not be loaded",
                to.display()
            );
            moved.push(to);
        }
    }
    Ok(moved)
}

/// Deletes all but the newest `keep` checkpoints (0 keeps all).
pub fn retain(root: &Path, keep: usize) -> Result<()> {
    if keep == 0 {
        return Ok(());
    }
    for (_, dir) in list(root).into_iter().skip(keep) {
        fs::remove_dir_all(&dir)
            .with_context(|| format!("removing old checkpoint {}", dir.display()))?;
    }
    Ok(())
}

/// What `zflow ckpt inspect` found: the description, and whether the checkpoint verified.
pub struct Inspection {
    /// A human-readable description ([`inspect`]).
    pub text: String,
    /// Every file the manifest lists is there with its size and checksum.
    pub verified: bool,
}

/// A human-readable description of checkpoint `dir`: the verdict (`manifest verified`, or
/// `DOES NOT VERIFY` and why), then whatever can still be read (step and data cursor, model,
/// layout, every tensor), each part that cannot be read named with its error. A damaged
/// checkpoint is described as far as it goes, never cut short by its first unreadable file.
pub fn inspect(dir: &Path) -> Inspection {
    use std::fmt::Write as _;
    let mut out = String::new();
    let (files, verified) = match read_verified(dir) {
        Ok(files) => {
            let _ = writeln!(
                out,
                "{}: manifest verified ({} files)",
                dir.display(),
                files.len()
            );
            (files, true)
        }
        Err(e) => {
            let why = if !dir.exists() {
                "no such file or folder".to_string()
            } else if !dir.is_dir() {
                "not a folder (a checkpoint is a folder with a manifest.json)".to_string()
            } else {
                format!("{e:#}")
            };
            let _ = writeln!(out, "{}: DOES NOT VERIFY: {why}", dir.display());
            // Still show what can be read, so a damaged checkpoint can be looked at.
            let mut files = BTreeMap::new();
            for name in ["trainer.json", "layout.json", "model.safetensors"] {
                if let Ok(b) = fs::read(dir.join(name)) {
                    files.insert(name.to_string(), b);
                }
            }
            (files, false)
        }
    };
    let part = |out: &mut String, name: &str, result: Result<()>| {
        if let Err(e) = result {
            let _ = writeln!(out, "{name}: cannot be read: {e:#}");
        }
    };
    if let Some(b) = files.get("trainer.json") {
        let result = describe_trainer(b, &mut out);
        part(&mut out, "trainer.json", result);
    }
    if dir.is_dir() {
        match model_config(dir) {
            Ok(m) => {
                let _ = writeln!(
                    out,
                    "model: hidden {} x {} blocks, vocab {}, {} experts{}, RoPE base {}",
                    m.hidden_size,
                    m.num_blocks,
                    m.vocab_size,
                    m.num_experts,
                    if m.mod_skip { " + MoD skip" } else { "" },
                    m.rope_base
                );
            }
            Err(e) => {
                let _ = writeln!(out, "model: unknown ({e:#})");
            }
        }
    }
    if let Some(b) = files.get("layout.json") {
        let result = describe_layout(b, &mut out);
        part(&mut out, "layout.json", result);
    }
    for (name, bytes) in &files {
        if name.ends_with(".bin") {
            let _ = writeln!(out, "{name}: {} bytes of optimizer state", bytes.len());
        }
    }
    if let Some(b) = files.get("model.safetensors") {
        let result = describe_tensors(b, &mut out);
        part(&mut out, "model.safetensors", result);
    }
    Inspection {
        text: out,
        verified,
    }
}

fn describe_trainer(bytes: &[u8], out: &mut String) -> Result<()> {
    use std::fmt::Write as _;
    let s: TrainerState = serde_json::from_slice(bytes)?;
    writeln!(
        out,
        "phase {} step {}/{}  tokens {}  seed {}",
        s.phase, s.step, s.total_steps, s.tokens, s.seed
    )?;
    writeln!(
        out,
        "data cursor: sample {} of mixture {}",
        s.cursor.sample, s.cursor.fingerprint
    )?;
    for (layer, b) in s.balance.iter().enumerate() {
        let biases: Vec<String> = b.biases.iter().map(|v| format!("{v:+.3}")).collect();
        writeln!(
            out,
            "routing biases, MoE layer {layer}: [{}]",
            biases.join(" ")
        )?;
    }
    Ok(())
}

fn describe_layout(bytes: &[u8], out: &mut String) -> Result<()> {
    use std::fmt::Write as _;
    let layout: layout::Layout = serde_json::from_slice(bytes)?;
    let load: Vec<String> = layout.load().iter().map(|n| n.to_string()).collect();
    writeln!(
        out,
        "layout: optimizer state sharded over {} data-parallel rank(s) (ZeRO-1; parameters per shard: {})",
        layout.dp,
        load.join(" / ")
    )?;
    Ok(())
}

fn describe_tensors(bytes: &[u8], out: &mut String) -> Result<()> {
    use std::fmt::Write as _;
    let st = safetensors::SafeTensors::deserialize(bytes)?;
    let mut tensors: Vec<(String, safetensors::tensor::TensorView<'_>)> = st.tensors();
    tensors.sort_by(|a, b| a.0.cmp(&b.0));
    let mut total = 0usize;
    writeln!(out, "model.safetensors: {} tensors", tensors.len())?;
    for (name, view) in &tensors {
        let n: usize = view.shape().iter().product();
        total += n;
        writeln!(out, "  {name:<60} {:?} {:?}", view.dtype(), view.shape())?;
    }
    writeln!(out, "parameters: {total}")?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latest_skips_damaged_and_unfinished_checkpoints() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        commit(root, 5, vec![("a.bin".into(), vec![1, 2, 3])]).unwrap();
        commit(root, 10, vec![("a.bin".into(), vec![4, 5, 6])]).unwrap();
        // An attempt that died mid-write never has a `step-N` name.
        fs::create_dir_all(root.join(".tmp-step-00000015")).unwrap();
        let (newest, files) = latest(root).unwrap();
        assert!(newest.ends_with("step-00000010"));
        assert_eq!(files["a.bin"], vec![4, 5, 6]);
        // Flip a byte in the newest: it is skipped, the older one is used.
        fs::write(root.join("step-00000010/a.bin"), [4, 5, 7]).unwrap();
        let (dir5, files) = latest(root).unwrap();
        assert!(dir5.ends_with("step-00000005"));
        assert_eq!(files["a.bin"], vec![1, 2, 3]);
        // A missing manifest (never committed) is skipped too.
        fs::remove_file(root.join("step-00000005/manifest.json")).unwrap();
        assert!(latest(root).is_none());
        // Retention keeps the newest.
        commit(root, 20, vec![("a.bin".into(), vec![9])]).unwrap();
        retain(root, 1).unwrap();
        assert_eq!(list(root).len(), 1);
    }
}
