//! `dedup.<source>`: exact and near-duplicate removal over the whole of a deduplicated source
//! (every shard of a sharded one), the join of its `dedup_keys` tasks ([`crate::dedup_keys`]),
//! in memory bounded by what it declares, not by the corpus.
//!
//! An ingest stage never holds a set of every document it has seen. It writes its kept
//! documents' records in sorted runs ([`crate::sorted_runs`]): `hashes/` (the first 16 bytes of
//! the blake3 of each normalised text) and, with `near_dedup`, `bands/` (a record per LSH band)
//! and `signatures.bin` ([`crate::minhash`]). It drops a repeat of a text already in the run
//! it is filling, and leaves the rest to the source's dedup, two sharded stages:
//! - `dedup_keys.<source>.k<i>`, a task per range of the key space (`dedup_tasks.count`, by
//!   default one per 64 shards): the exact repeats and the verified near-duplicate pairs among the
//!   records whose keys fall in its range;
//! - this stage, which joins them. The pairs are edges of a graph whose connected components
//!   are the clusters; [`crate::components`] finds, by external sorts within the declared
//!   memory, the members that are not the first document of their cluster. With the exact
//!   repeats (both ascending, merged as they stream) they go into each input's drop list,
//!   `drops/<source>/<index>.bin` (document indices, u64 little-endian, ascending; a file for
//!   every input, empty when it drops nothing), which that input's tokenize stage leaves out.
//!
//! Of equal texts, the first in (input, document) order stays; each near-duplicate cluster
//! keeps its first document. A tokenize stage's identity hashes its own drop list only
//! ([`crate::tokenize::SkipList`]), so a changed shard re-runs the dedup (cheap: it reads 32
//! bytes per document and band) but only the tokenize stages whose drop lists changed.
//!
//! The exact result equals deduplicating the concatenation of the inputs in order: what stays
//! is the same set of texts whatever the shards, the runs and the number of key ranges.
//!
//! `stats.json` and `stats.parquet` (`source`, `shard`, `rule`, `documents`, `bytes`): per
//! input, the documents it holds, those dropped as exact duplicates of an earlier document (of
//! another run or shard) and as near duplicates, and those kept.

use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, Result, ensure};
use arrow::array::{ArrayRef, StringArray, UInt64Array};
use arrow::datatypes::{DataType, Field};
use serde::{Deserialize, Serialize};
use zflow_pipeline::{ConfigError, Resources, Stage, StageContext};

use crate::dedup_keys::{EDGES, EXACT_DROPS};
use crate::external_sort::Merge;
use crate::names;
use crate::shard::Shard;
use crate::sorted_runs::{Run, open_runs, read_buffer};

/// The `dedup` stage kind.
pub struct Dedup;

/// `dedup` settings (what a deduplicated source, or `cross_dedup`, writes); its `dedup_keys`
/// tasks carry the same.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DedupConfig {
    /// The sources, in the order their documents count: of duplicates, the first in this
    /// order (then shard order) stays. One for a sharded source; several with `cross_dedup`.
    pub sources: Vec<DedupSource>,
    /// Exact duplicates (the inputs' `hashes/` runs).
    pub exact: bool,
    /// Near duplicates (the inputs' `bands/` runs and `signatures.bin`).
    pub near: bool,
    /// The least estimated Jaccard similarity of a near-duplicate pair (the source's
    /// `near_dedup.jaccard`).
    #[serde(default = "default_jaccard")]
    pub jaccard: f64,
    /// The `dedup_keys` tasks: ranges the key space is cut into (`dedup_tasks.count`).
    #[serde(default = "default_tasks")]
    pub tasks: usize,
    /// The memory each task and the join declare, in GiB (`dedup_tasks.memory_gb`).
    #[serde(default = "default_memory_gb")]
    pub memory_gb: f64,
}

/// One source of a `dedup` stage.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DedupSource {
    /// The source's name.
    pub name: String,
    /// Its number of shards, whose ingest stages are inputs; none for an unsharded source, whose
    /// one ingest stage is.
    #[serde(default)]
    pub shards: Option<usize>,
}

fn default_jaccard() -> f64 {
    crate::minhash::NearDedup::default().jaccard
}

fn default_tasks() -> usize {
    1
}

/// The memory a dedup task declares unless the source says otherwise (`dedup_tasks.memory_gb`).
pub fn default_memory_gb() -> f64 {
    1.0
}

impl DedupConfig {
    /// Its inputs: each source's ingest shards, in source then shard order, with the source
    /// and the shard's index in it.
    fn inputs(&self) -> Vec<(String, &DedupSource, usize)> {
        self.sources
            .iter()
            .flat_map(|src| {
                names::sharded(&names::ingest(&src.name), src.shards)
                    .into_iter()
                    .enumerate()
                    .map(move |(i, stage)| (stage, src, i))
            })
            .collect()
    }

    /// Its ingest stages, in order.
    pub fn input_stages(&self) -> Vec<String> {
        self.inputs()
            .into_iter()
            .map(|(stage, _, _)| stage)
            .collect()
    }

    /// Its ingest stages' output folders, in order.
    pub fn input_dirs(&self, ctx: &StageContext) -> Result<Vec<PathBuf>> {
        self.input_stages()
            .iter()
            .map(|stage| ctx.input(stage).map(Path::to_path_buf))
            .collect()
    }

    /// What each task (and the join) declares: one core and `memory_gb`.
    pub fn task_resources(&self) -> Resources {
        Resources {
            memory_gb: self.memory_gb,
            ..Resources::default()
        }
    }
}

/// An ingest stage's runs of its documents' text hashes (a folder).
pub const EXACT: &str = "hashes";
/// An ingest stage's runs of its documents' LSH bands (a folder).
pub const NEAR: &str = "bands";
/// An ingest stage's kept documents' MinHash signatures, in document order: `bands * rows`
/// u64 (little-endian) each ([`crate::minhash::MinHasher::signature`]).
pub const SIGNATURES: &str = "signatures.bin";

/// The path, within a dedup stage's output, of the drop list of shard `index` (of `count`) of
/// `source`.
pub fn drops_file(source: &str, index: usize, count: usize) -> String {
    format!("drops/{source}/{}.bin", Shard::label(index, count))
}

/// Reads a drop list: the document indices a shard leaves out, ascending.
pub fn read_drops(path: &Path) -> Result<Vec<u64>> {
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    ensure!(
        bytes.len() % 8 == 0,
        "{}: {} bytes, not a list of u64 document indices",
        path.display(),
        bytes.len()
    );
    Ok(bytes
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
        .collect())
}

/// Each ingest input's kept documents and their bytes (its `stats.json`).
pub fn documents_per_input(dirs: &[PathBuf]) -> Result<Vec<(u64, u64)>> {
    dirs.iter()
        .map(|dir| {
            let path = dir.join("stats.json");
            let stats: crate::ingest_stats::IngestStats =
                serde_json::from_slice(&std::fs::read(&path)?)
                    .with_context(|| format!("reading {}", path.display()))?;
            Ok((stats.docs_out, stats.bytes_out))
        })
        .collect()
}

/// Where each input's documents start in the numbering across the inputs.
pub fn offsets(docs: &[(u64, u64)]) -> Vec<u64> {
    docs.iter()
        .scan(0u64, |acc, &(d, _)| {
            let start = *acc;
            *acc += d;
            Some(start)
        })
        .collect()
}

/// The number of runs in `dir`.
pub fn count_runs(dir: &Path) -> Result<usize> {
    Ok(std::fs::read_dir(dir)
        .with_context(|| format!("listing {}", dir.display()))?
        .count())
}

impl Stage for Dedup {
    type Config = DedupConfig;
    const KIND: &'static str = "dedup";
    // 2: near duplicates are verified pairs joined into clusters, each keeping one document.
    // 3: the pairs come from `dedup_keys` tasks; clusters are found by external sorts.
    const VERSION: u32 = 3;

    fn validate(&self, c: &DedupConfig, needs: &[String]) -> Result<(), ConfigError> {
        let want = c.input_stages();
        let keys = &needs[want.len().min(needs.len())..];
        if !needs.starts_with(&want)
            || keys.len() != c.tasks
            || !keys.iter().all(|k| k.starts_with(names::DEDUP_KEYS))
        {
            return Err(ConfigError::new(
                "needs",
                format!(
                    "a dedup stage reads the ingest shards of its sources in order ({} ...), then its {} dedup_keys tasks",
                    want.first().map(String::as_str).unwrap_or(""),
                    c.tasks
                ),
            ));
        }
        if c.tasks == 0 || c.memory_gb <= 0.0 {
            return Err(ConfigError::new(
                "tasks",
                "a dedup needs at least one task and some memory",
            ));
        }
        Ok(())
    }

    fn resources(&self, c: &DedupConfig) -> Resources {
        c.task_resources()
    }

    fn run(&self, c: &DedupConfig, ctx: &StageContext) -> Result<()> {
        raise_open_files_limit();
        let input_stages = c.input_stages();
        let dirs = c.input_dirs(ctx)?;
        let tasks: Vec<PathBuf> = ctx
            .inputs()
            .iter()
            .filter(|(name, _)| !input_stages.contains(name))
            .map(|(_, dir)| dir.clone())
            .collect();
        ctx.progress().set_message(format!(
            "joining the duplicates of {} key ranges",
            tasks.len()
        ));
        let memory = crate::dedup_keys::working_memory(ctx, c);
        join(c, &dirs, &tasks, memory, ctx.out_dir(), &|| {
            ctx.check_cancelled()
        })
    }
}

/// Dedup `c`'s join of its tasks' outputs `tasks` over the ingest outputs `dirs`, within
/// `memory` bytes of buffers: writes the drop lists and stats into `out`.
pub fn join(
    c: &DedupConfig,
    dirs: &[PathBuf],
    tasks: &[PathBuf],
    memory: usize,
    out: &Path,
    check: &dyn Fn() -> Result<()>,
) -> Result<()> {
    let inputs = c.inputs();
    ensure!(
        tasks.len() == c.tasks,
        "{} dedup_keys tasks among the inputs, not {}",
        tasks.len(),
        c.tasks
    );
    let docs = documents_per_input(dirs)?;
    let mut tally: Vec<ShardTally> = docs
        .iter()
        .map(|&documents| ShardTally {
            documents,
            ..Default::default()
        })
        .collect();
    let mut files = Vec::with_capacity(inputs.len());
    for (_, src, i) in &inputs {
        let path = out.join(drops_file(&src.name, *i, src.shards.unwrap_or(1)));
        std::fs::create_dir_all(path.parent().expect("drops/<source>"))?;
        std::fs::File::create(&path)?;
        files.push(path);
    }
    let mut drops = DropWriter::new(files, offsets(&docs), &mut tally);
    // The exact repeats, ascending (a document repeats at most once: its text has one hash).
    let mut exact = match c.exact {
        true => Some(Merge::new(runs_of::<[u64; 2]>(
            tasks,
            EXACT_DROPS,
            memory / 4,
        )?)?),
        false => None,
    };
    let mut next_exact = match &mut exact {
        Some(m) => m.next_record()?,
        None => None,
    };
    // Each near duplicate, ascending, after the exact repeats before it; one that is also an
    // exact repeat counts as exact. `END` flushes the exact repeats after the last.
    const END: u64 = u64::MAX;
    let mut near = |[doc, bytes]: [u64; 2]| -> Result<()> {
        while let Some([e, eb]) = next_exact
            && e <= doc
        {
            drops.push(e, eb, Rule::Exact)?;
            next_exact = exact.as_mut().expect("exact repeats").next_record()?;
            if e == doc {
                return Ok(());
            }
        }
        match doc {
            END => Ok(()),
            _ => drops.push(doc, bytes, Rule::Near),
        }
    };
    if c.near {
        let mut edges = runs_of::<[u64; 4]>(tasks, EDGES, memory / 4)?.into_iter();
        let mut current = edges.next();
        let stream = std::iter::from_fn(|| {
            loop {
                let run = current.as_mut()?;
                match run.next_record() {
                    Ok(Some(e)) => return Some(Ok(e)),
                    Ok(None) => current = edges.next(),
                    Err(e) => return Some(Err(e)),
                }
            }
        });
        crate::components::for_each_non_least_vertex(
            stream,
            &out.join(".clusters"),
            memory / 2,
            check,
            &mut near,
        )?;
    }
    near([END, 0])?;
    drops.finish()?;
    let (exact, near): (u64, u64) = tally
        .iter()
        .fold((0, 0), |(e, n), t| (e + t.exact.0, n + t.near.0));
    let names: Vec<&str> = c.sources.iter().map(|s| s.name.as_str()).collect();
    tracing::info!(
        "{}: {} inputs, {} key ranges; dropped {exact} exact duplicates of an earlier document and {near} near duplicates",
        names.join(", "),
        inputs.len(),
        c.tasks
    );
    let labels: Vec<(&str, u64)> = inputs
        .iter()
        .map(|(_, src, i)| (src.name.as_str(), *i as u64))
        .collect();
    write_stats(out, &labels, &tally)
}

/// The runs in `<task>/<kind>` of every task, each read through its share of `memory`.
fn runs_of<R: crate::sorted_runs::Record>(
    tasks: &[PathBuf],
    kind: &str,
    memory: usize,
) -> Result<Vec<Run<R>>> {
    let mut count = 0;
    for t in tasks {
        count += count_runs(&t.join(kind))?;
    }
    let buffer = read_buffer(memory, count);
    let mut runs = Vec::new();
    for t in tasks {
        runs.extend(open_runs::<R>(&t.join(kind), false, buffer)?);
    }
    Ok(runs)
}

/// Which rule dropped a document.
#[derive(Clone, Copy)]
enum Rule {
    Exact,
    Near,
}

/// Writes drops, ascending across the inputs, into each input's drop list.
struct DropWriter<'a> {
    files: Vec<PathBuf>,
    offsets: Vec<u64>,
    tally: &'a mut [ShardTally],
    /// The input being written, and its open list.
    current: Option<(usize, BufWriter<std::fs::File>)>,
    last: Option<u64>,
}

impl<'a> DropWriter<'a> {
    fn new(files: Vec<PathBuf>, offsets: Vec<u64>, tally: &'a mut [ShardTally]) -> Self {
        DropWriter {
            files,
            offsets,
            tally,
            current: None,
            last: None,
        }
    }

    /// Drops document `doc` (numbered across the inputs) of `bytes` bytes.
    fn push(&mut self, doc: u64, bytes: u64, rule: Rule) -> Result<()> {
        ensure!(
            self.last.is_none_or(|l| l < doc),
            "drops out of order ({doc} after {:?}): damaged dedup_keys output?",
            self.last
        );
        self.last = Some(doc);
        let input = self.offsets.partition_point(|&o| o <= doc) - 1;
        let t = &mut self.tally[input];
        ensure!(
            doc - self.offsets[input] < t.documents.0,
            "document {doc} is past the inputs' documents"
        );
        match rule {
            Rule::Exact => {
                t.exact.0 += 1;
                t.exact.1 += bytes;
            }
            Rule::Near => {
                t.near.0 += 1;
                t.near.1 += bytes;
            }
        }
        if self.current.as_ref().is_none_or(|(i, _)| *i != input) {
            self.finish_current()?;
            let file = std::fs::OpenOptions::new()
                .append(true)
                .open(&self.files[input])?;
            self.current = Some((input, BufWriter::new(file)));
        }
        let (_, w) = self.current.as_mut().expect("open");
        w.write_all(&(doc - self.offsets[input]).to_le_bytes())?;
        Ok(())
    }

    fn finish_current(&mut self) -> Result<()> {
        if let Some((_, w)) = self.current.take() {
            w.into_inner()?.sync_all()?;
        }
        Ok(())
    }

    fn finish(mut self) -> Result<()> {
        self.finish_current()
    }
}

/// Per shard: its documents, and those dropped by each rule (documents, bytes).
#[derive(Clone, Copy, Default)]
struct ShardTally {
    documents: (u64, u64),
    exact: (u64, u64),
    near: (u64, u64),
}

/// `stats.json` and `stats.parquet`; `labels` are each input's (source, shard).
fn write_stats(out: &Path, labels: &[(&str, u64)], shards: &[ShardTally]) -> Result<()> {
    let mut rows: Vec<(&str, u64, &str, u64, u64)> = Vec::new();
    for (&(source, i), t) in labels.iter().zip(shards) {
        let mut push = |rule, (d, b): (u64, u64)| rows.push((source, i, rule, d, b));
        push("documents", t.documents);
        push("dropped:duplicate", t.exact);
        push("dropped:near_duplicate", t.near);
        push(
            "kept",
            (
                t.documents.0 - t.exact.0 - t.near.0,
                t.documents.1 - t.exact.1 - t.near.1,
            ),
        );
    }
    let json: Vec<serde_json::Value> = rows
        .iter()
        .map(|(src, s, rule, d, b)| serde_json::json!({"source": src, "shard": s, "rule": rule, "documents": d, "bytes": b}))
        .collect();
    std::fs::write(out.join("stats.json"), serde_json::to_vec_pretty(&json)?)?;
    let fields = vec![
        Field::new("source", DataType::Utf8, false),
        Field::new("shard", DataType::UInt64, false),
        Field::new("rule", DataType::Utf8, false),
        Field::new("documents", DataType::UInt64, false),
        Field::new("bytes", DataType::UInt64, false),
    ];
    let cols: Vec<ArrayRef> = vec![
        Arc::new(StringArray::from_iter_values(rows.iter().map(|r| r.0))),
        Arc::new(UInt64Array::from_iter_values(rows.iter().map(|r| r.1))),
        Arc::new(StringArray::from_iter_values(rows.iter().map(|r| r.2))),
        Arc::new(UInt64Array::from_iter_values(rows.iter().map(|r| r.3))),
        Arc::new(UInt64Array::from_iter_values(rows.iter().map(|r| r.4))),
    ];
    crate::util::write_parquet(&out.join("stats.parquet"), fields, cols)
}

/// Raises this process's soft limit on open files to the hard limit: a merge holds every run
/// of every input open at once.
pub fn raise_open_files_limit() {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit with a valid pointer to a local struct.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 && lim.rlim_cur < lim.rlim_max {
            lim.rlim_cur = lim.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sorted_runs::{DocHash, RunWriter};

    /// A test document: its text, its signature and its band keys.
    type Doc = (String, Vec<u64>, Vec<[u8; 16]>);

    /// Writes an ingest shard's `stats.json`, `hashes/` and `bands/` (in runs of 7 records)
    /// and `signatures.bin` for `docs` (each: its text, its signature and its band keys, which
    /// a test may forge).
    fn write_shard(dir: &Path, docs: &[Doc]) {
        std::fs::create_dir_all(dir).unwrap();
        let mut bands = RunWriter::<DocHash>::create(dir.join(NEAR), 7).unwrap();
        let mut hashes = RunWriter::<DocHash>::create(dir.join(EXACT), 7).unwrap();
        let mut sigs = Vec::new();
        let mut seen = std::collections::HashSet::new();
        for (doc, (text, sig, keys)) in docs.iter().enumerate() {
            let bytes = 100 + doc as u64;
            for &hash in keys {
                bands
                    .push(DocHash {
                        hash,
                        doc: doc as u64,
                        bytes,
                    })
                    .unwrap();
            }
            // An ingest drops a repeat within its run; these runs are short, so within the shard.
            if seen.insert(text.clone()) {
                hashes
                    .push(DocHash::of(
                        &blake3::hash(text.as_bytes()),
                        doc as u64,
                        bytes,
                    ))
                    .unwrap();
            }
            sigs.extend(sig.iter().flat_map(|v| v.to_le_bytes()));
        }
        bands.finish().unwrap();
        hashes.finish().unwrap();
        std::fs::write(dir.join(SIGNATURES), sigs).unwrap();
        let stats = crate::ingest_stats::IngestStats {
            docs_out: docs.len() as u64,
            bytes_out: (0..docs.len() as u64).map(|d| 100 + d).sum(),
            ..Default::default()
        };
        std::fs::write(dir.join("stats.json"), serde_json::to_vec(&stats).unwrap()).unwrap();
    }

    /// Runs `tasks` key-range tasks and the join over `dirs`; returns each input's drops.
    fn dedup(dirs: &[PathBuf], tasks: usize, jaccard: f64, memory: usize) -> Vec<Vec<u64>> {
        let c = DedupConfig {
            sources: vec![DedupSource {
                name: "web".into(),
                shards: Some(dirs.len()),
            }],
            exact: true,
            near: true,
            jaccard,
            tasks,
            // The tasks' output runs hold an eighth of it.
            memory_gb: memory as f64 / (1u64 << 30) as f64,
        };
        let tmp = tempfile::tempdir().unwrap();
        let outs: Vec<PathBuf> = (0..tasks)
            .map(|t| {
                let out = tmp.path().join(format!("k{t}"));
                std::fs::create_dir_all(&out).unwrap();
                crate::dedup_keys::run_task(&c, t, dirs, memory, &out, &|| Ok(())).unwrap();
                out
            })
            .collect();
        let out = tmp.path().join("join");
        join(&c, dirs, &outs, memory, &out, &|| Ok(())).unwrap();
        assert!(!out.join(".clusters").exists(), "the scratch sorts go");
        (0..dirs.len())
            .map(|i| read_drops(&out.join(drops_file("web", i, dirs.len()))).unwrap())
            .collect()
    }

    #[test]
    fn near_duplicates_are_verified_pairs_joined_into_clusters_that_keep_one_document() {
        use crate::minhash::{MinHasher, NearDedup};
        let h = MinHasher::new(NearDedup::default());
        let text = |seed: u64, edits: &[usize]| {
            let mut rng = zflow_runtime::rng::SplitMix64(seed);
            let mut words: Vec<String> = (0..300)
                .map(|_| format!("w{}", rng.below(100_000)))
                .collect();
            for &e in edits {
                words[e] = format!("edit{e}");
            }
            words.join(" ")
        };
        let doc = |t: String| {
            let sig = h.signature(&t);
            let keys = h.bands_of(&sig);
            (t, sig, keys)
        };
        // A chain: a ~ b ~ c (each a few words off the one before), one per shard, and two
        // unrelated texts d, e made to share a band (a forged key): a candidate pair that the
        // signatures refuse. Shard 2 also repeats d's text exactly (an exact repeat of shard
        // 0's document 1, and a near one).
        let (d, mut e) = (doc(text(7, &[])), doc(text(8, &[])));
        e.2[3] = d.2[3];
        let tmp = tempfile::tempdir().unwrap();
        let dirs: Vec<PathBuf> = (0..3).map(|i| tmp.path().join(format!("s{i}"))).collect();
        write_shard(&dirs[0], &[doc(text(1, &[])), d.clone()]);
        write_shard(&dirs[1], &[e, doc(text(1, &[10, 200]))]);
        write_shard(&dirs[2], &[doc(text(1, &[10, 200, 40, 250])), d]);
        let want = vec![vec![], vec![1], vec![0, 1]];
        // One task or many, a memory that holds everything or one that spills every sort.
        for (tasks, memory) in [(1, 1 << 24), (3, 1 << 24), (5, 2048)] {
            assert_eq!(dedup(&dirs, tasks, 0.7, memory), want, "{tasks} tasks");
        }
        // Without the check every candidate counts, as datatrove does: e goes too.
        assert_eq!(
            dedup(&dirs, 2, 0.0, 1 << 20),
            vec![vec![], vec![0, 1], vec![0, 1]]
        );
    }

    #[test]
    fn exact_repeats_in_other_runs_and_other_inputs_go_and_the_first_stays() {
        let tmp = tempfile::tempdir().unwrap();
        let dirs: Vec<PathBuf> = (0..2).map(|i| tmp.path().join(format!("s{i}"))).collect();
        // Input 0: a, b | c, a (runs of 2: the second a is in another run); input 1: b, d.
        for (dir, texts) in dirs.iter().zip([&["a", "b", "c", "a"][..], &["b", "d"]]) {
            let mut w = RunWriter::<DocHash>::create(dir.join(EXACT), 2).unwrap();
            for (doc, t) in texts.iter().enumerate() {
                w.push(DocHash::of(&blake3::hash(t.as_bytes()), doc as u64, 1))
                    .unwrap();
            }
            w.finish().unwrap();
            let stats = crate::ingest_stats::IngestStats {
                docs_out: texts.len() as u64,
                bytes_out: texts.len() as u64,
                ..Default::default()
            };
            std::fs::write(dir.join("stats.json"), serde_json::to_vec(&stats).unwrap()).unwrap();
        }
        let c = DedupConfig {
            sources: vec![DedupSource {
                name: "web".into(),
                shards: Some(2),
            }],
            exact: true,
            near: false,
            jaccard: 0.7,
            tasks: 3,
            memory_gb: 1.0,
        };
        let outs: Vec<PathBuf> = (0..3)
            .map(|t| {
                let out = tmp.path().join(format!("k{t}"));
                std::fs::create_dir_all(&out).unwrap();
                crate::dedup_keys::run_task(&c, t, &dirs, 4096, &out, &|| Ok(())).unwrap();
                out
            })
            .collect();
        join(&c, &dirs, &outs, 4096, &tmp.path().join("join"), &|| Ok(())).unwrap();
        let drops = |i| read_drops(&tmp.path().join("join").join(drops_file("web", i, 2)));
        assert_eq!((drops(0).unwrap(), drops(1).unwrap()), (vec![3], vec![0]));
        assert_eq!(drops_file("web", 3, 12), "drops/web/03.bin");
        assert_eq!(drops_file("web", 0, 1), "drops/web/0.bin");
    }
}
