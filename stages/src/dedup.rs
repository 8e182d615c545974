//! `dedup.<source>`: exact and near-duplicate removal over the whole of a deduplicated source
//! (every shard of a sharded one), in memory bounded by the number of runs, not the corpus.
//!
//! An ingest stage never holds a set of every document it has seen. It writes its kept
//! documents' records in sorted runs ([`crate::sorted_runs`]): `hashes/` (the first 16 bytes of
//! the blake3 of each normalised text) and, with `near_dedup`, `bands/` (a record per LSH band)
//! and `signatures.bin` ([`crate::minhash`]). It drops a repeat of a text already in the run
//! it is filling, and leaves the rest to this stage. This stage merges every input's runs of a
//! kind, a k-way merge that holds one record per run in memory: of equal texts, the first in
//! (input, document) order stays. Documents sharing a band are candidate pairs; a pair whose
//! signatures (`signatures.bin`, read per pair) agree on at least `jaccard` of their values
//! joins a cluster (union-find over the documents in some verified pair), and each cluster
//! keeps its first document ([`crate::minhash`]). Every other document goes into its input's
//! drop list, `drops/<source>/<index>.bin` (document indices, u64 little-endian, ascending; a
//! file for every input, empty when it drops nothing), which that input's tokenize stage leaves
//! out. A tokenize stage's identity hashes its own drop list only
//! ([`crate::tokenize::SkipList`]), so a changed shard re-runs this stage (cheap: it reads 32
//! bytes per document) but only the tokenize stages whose drop lists changed.
//!
//! The exact result equals deduplicating the concatenation of the inputs in order: what stays
//! is the same set of texts whatever the shards and the runs.
//!
//! `stats.json` and `stats.parquet` (`source`, `shard`, `rule`, `documents`, `bytes`): per
//! input, the documents it holds, those dropped as exact duplicates of an earlier document (of
//! another run or shard) and as near duplicates, and those kept.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, Result, ensure};
use arrow::array::{ArrayRef, StringArray, UInt64Array};
use arrow::datatypes::{DataType, Field};
use serde::{Deserialize, Serialize};
use zflow_pipeline::{ConfigError, Stage, StageContext};

use crate::names;
use crate::shard::Shard;
use crate::sorted_runs::{DocHash, Run, open_runs};

/// The `dedup` stage kind.
pub struct Dedup;

/// `dedup` settings (what a deduplicated source, or `cross_dedup`, writes).
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

impl Stage for Dedup {
    type Config = DedupConfig;
    const KIND: &'static str = "dedup";
    // 2: near duplicates are verified pairs joined into clusters, each keeping one document.
    const VERSION: u32 = 2;

    fn validate(&self, c: &DedupConfig, needs: &[String]) -> Result<(), ConfigError> {
        let want: Vec<String> = c.inputs().into_iter().map(|(stage, _, _)| stage).collect();
        if needs != want.as_slice() {
            return Err(ConfigError::new(
                "needs",
                format!(
                    "a dedup stage reads the ingest shards of its sources in order ({} ...)",
                    want.first().map(String::as_str).unwrap_or("")
                ),
            ));
        }
        Ok(())
    }

    fn run(&self, c: &DedupConfig, ctx: &StageContext) -> Result<()> {
        let inputs = c.inputs();
        // The merges hold every run of every input open at once.
        raise_open_files_limit();
        let dirs: Vec<std::path::PathBuf> = inputs
            .iter()
            .map(|(stage, _, _)| ctx.input(stage).map(Path::to_path_buf))
            .collect::<Result<_>>()?;
        let mut shards = Vec::with_capacity(inputs.len());
        for dir in &dirs {
            let stats: crate::ingest_stats::IngestStats =
                serde_json::from_slice(&std::fs::read(dir.join("stats.json"))?)
                    .with_context(|| format!("reading {}", dir.join("stats.json").display()))?;
            shards.push(ShardTally {
                documents: (stats.docs_out, stats.bytes_out),
                ..Default::default()
            });
        }
        let mut dropped: Vec<std::collections::BTreeSet<u64>> =
            vec![Default::default(); inputs.len()];
        if c.exact {
            ctx.progress()
                .set_message(format!("merging the inputs' {EXACT} runs"));
            let records = Merged::open(&dirs, EXACT, true)?;
            merge(records, &|| ctx.check_cancelled(), |shard, h| {
                if dropped[shard].insert(h.doc) {
                    let t = &mut shards[shard];
                    t.exact.0 += 1;
                    t.exact.1 += h.bytes;
                }
            })?;
        }
        if c.near {
            // After the exact rule: a document both rules drop counts as an exact duplicate.
            ctx.progress()
                .set_message(format!("clustering the inputs' {NEAR} runs"));
            let docs: Vec<u64> = shards.iter().map(|t| t.documents.0).collect();
            for (shard, doc, bytes) in
                near_clusters(&dirs, &docs, c.jaccard, &|| ctx.check_cancelled())?
            {
                if dropped[shard].insert(doc) {
                    let t = &mut shards[shard];
                    t.near.0 += 1;
                    t.near.1 += bytes;
                }
            }
        }
        for (src, _) in inputs.iter().map(|(_, src, i)| (src, i)) {
            std::fs::create_dir_all(ctx.out_dir().join("drops").join(&src.name))?;
        }
        for ((_, src, i), list) in inputs.iter().zip(&dropped) {
            let bytes: Vec<u8> = list.iter().flat_map(|d| d.to_le_bytes()).collect();
            std::fs::write(
                ctx.out_dir()
                    .join(drops_file(&src.name, *i, src.shards.unwrap_or(1))),
                bytes,
            )?;
        }
        let (exact, near): (u64, u64) = shards
            .iter()
            .fold((0, 0), |(e, n), t| (e + t.exact.0, n + t.near.0));
        let names: Vec<&str> = c.sources.iter().map(|s| s.name.as_str()).collect();
        tracing::info!(
            "{}: {} inputs; dropped {exact} exact duplicates of an earlier document and {near} near duplicates",
            names.join(", "),
            inputs.len()
        );
        let labels: Vec<(&str, u64)> = inputs
            .iter()
            .map(|(_, src, i)| (src.name.as_str(), *i as u64))
            .collect();
        write_stats(ctx.out_dir(), &labels, &shards)
    }
}

/// Per shard: its documents, and those dropped by each rule (documents, bytes).
#[derive(Clone, Copy, Default)]
struct ShardTally {
    documents: (u64, u64),
    exact: (u64, u64),
    near: (u64, u64),
}

/// Every input's runs of one kind, merged: their records in (hash, input, document) order, a
/// k-way merge that holds one record per run.
struct Merged {
    /// Each run, with the input it belongs to.
    runs: Vec<(usize, Run)>,
    /// The next record of each run that has one, least first.
    heap: BinaryHeap<Reverse<Pending>>,
}

/// A run's next record in the merge: (hash, input, document, bytes, run), ordered as merged.
type Pending = ([u8; 16], usize, u64, u64, usize);

impl Merged {
    /// The runs in `<dir>/<kind>` of every input dir; `unique` when no run repeats a hash.
    fn open(dirs: &[std::path::PathBuf], kind: &str, unique: bool) -> Result<Merged> {
        let mut runs = Vec::new();
        for (input, dir) in dirs.iter().enumerate() {
            runs.extend(
                open_runs(&dir.join(kind), unique)?
                    .into_iter()
                    .map(|r| (input, r)),
            );
        }
        let mut merged = Merged {
            runs,
            heap: BinaryHeap::new(),
        };
        for run in 0..merged.runs.len() {
            merged.refill(run)?;
        }
        Ok(merged)
    }

    /// Puts run `run`'s next record, if any, in the heap.
    fn refill(&mut self, run: usize) -> Result<()> {
        let (input, r) = &mut self.runs[run];
        if let Some(h) = r.next_record()? {
            self.heap
                .push(Reverse((h.hash, *input, h.doc, h.bytes, run)));
        }
        Ok(())
    }

    /// The next record in order, with its input.
    fn next(&mut self) -> Result<Option<(usize, DocHash)>> {
        let Some(Reverse((hash, input, doc, bytes, run))) = self.heap.pop() else {
            return Ok(None);
        };
        self.refill(run)?;
        Ok(Some((input, DocHash { hash, doc, bytes })))
    }
}

/// Calls `later` with every record, in [`Merged`]'s order, whose hash an earlier one had.
fn merge(
    mut records: Merged,
    check: &dyn Fn() -> Result<()>,
    mut later: impl FnMut(usize, DocHash),
) -> Result<()> {
    let (mut last, mut merged) = (None, 0u64);
    while let Some((input, h)) = records.next()? {
        if last == Some(h.hash) {
            later(input, h);
        }
        last = Some(h.hash);
        merged += 1;
        if merged.is_multiple_of(1 << 20) {
            check()?;
        }
    }
    Ok(())
}

/// A shard's signatures, read by document.
struct Signatures {
    file: std::fs::File,
    path: std::path::PathBuf,
    /// Values per signature.
    len: usize,
}

impl Signatures {
    fn open(dir: &Path, docs: u64) -> Result<Signatures> {
        let path = dir.join(SIGNATURES);
        let file = std::fs::File::open(&path).with_context(|| {
            format!(
                "opening {} (an ingest shard of a source with `near_dedup` writes it)",
                path.display()
            )
        })?;
        let size = file.metadata()?.len();
        ensure!(
            docs == 0 || size % (docs * 8) == 0,
            "{}: {size} bytes is not {docs} signatures",
            path.display()
        );
        let len = size.checked_div(docs * 8).unwrap_or(0) as usize;
        Ok(Signatures { file, path, len })
    }

    fn get(&self, doc: u64) -> Result<Vec<u64>> {
        use std::os::unix::fs::FileExt;
        let mut bytes = vec![0u8; self.len * 8];
        self.file
            .read_exact_at(&mut bytes, doc * self.len as u64 * 8)
            .with_context(|| format!("reading signature {doc} of {}", self.path.display()))?;
        Ok(bytes
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
            .collect())
    }
}

/// Union-find over global document numbers; a set's root is its smallest member.
#[derive(Default)]
struct Clusters {
    parent: std::collections::HashMap<u64, u64>,
}

impl Clusters {
    fn root(&mut self, mut x: u64) -> u64 {
        while let Some(&p) = self.parent.get(&x) {
            if p == x {
                break;
            }
            // Path halving.
            let grand = self.parent.get(&p).copied().unwrap_or(p);
            self.parent.insert(x, grand);
            x = p;
        }
        x
    }

    fn join(&mut self, a: u64, b: u64) {
        let (ra, rb) = (self.root(a), self.root(b));
        let (keep, child) = (ra.min(rb), ra.max(rb));
        self.parent.entry(keep).or_insert(keep);
        self.parent.insert(child, keep);
    }
}

/// The near duplicates across the shards in `dirs` (holding `docs` documents each): documents
/// sharing a band are candidates; a candidate pair (each record and the one before it among
/// the records with its band, in (shard, document) order) whose signatures agree on at least
/// `jaccard` of their values joins a cluster; every cluster keeps its first document, in
/// shard order. Returns the others as (shard, document, bytes).
fn near_clusters(
    dirs: &[std::path::PathBuf],
    docs: &[u64],
    jaccard: f64,
    check: &dyn Fn() -> Result<()>,
) -> Result<Vec<(usize, u64, u64)>> {
    let offsets: Vec<u64> = docs
        .iter()
        .scan(0u64, |acc, d| {
            let start = *acc;
            *acc += d;
            Some(start)
        })
        .collect();
    let signatures = dirs
        .iter()
        .zip(docs)
        .map(|(d, &n)| Signatures::open(d, n))
        .collect::<Result<Vec<_>>>()?;
    let mut records = Merged::open(dirs, NEAR, false)?;
    let mut clusters = Clusters::default();
    let mut bytes_of = std::collections::HashMap::new();
    let (mut previous, mut merged): (Option<([u8; 16], usize, u64)>, u64) = (None, 0);
    while let Some((shard, DocHash { hash, doc, bytes })) = records.next()? {
        if let Some((h, s, d)) = previous
            && h == hash
            && (s, d) != (shard, doc)
        {
            let (a, b) = (signatures[s].get(d)?, signatures[shard].get(doc)?);
            if crate::minhash::similarity(&a, &b) >= jaccard {
                clusters.join(offsets[s] + d, offsets[shard] + doc);
                bytes_of.insert(offsets[shard] + doc, (shard, doc, bytes));
            }
        }
        previous = Some((hash, shard, doc));
        merged += 1;
        if merged.is_multiple_of(1 << 20) {
            check()?;
        }
    }
    // Every member but a cluster's root (its first document) goes. A member whose bytes were
    // not noted (it was only ever the earlier of a pair) is read back from its shard's records.
    let members: Vec<u64> = clusters.parent.keys().copied().collect();
    let mut out = Vec::new();
    let mut unknown = std::collections::BTreeSet::new();
    for m in members {
        if clusters.root(m) != m {
            match bytes_of.get(&m) {
                Some(&rec) => out.push(rec),
                None => {
                    unknown.insert(m);
                }
            }
        }
    }
    if !unknown.is_empty() {
        for (i, dir) in dirs.iter().enumerate() {
            for mut run in open_runs(&dir.join(NEAR), false)? {
                while let Some(h) = run.next_record()? {
                    if unknown.remove(&(offsets[i] + h.doc)) {
                        out.push((i, h.doc, h.bytes));
                    }
                }
            }
        }
    }
    out.sort_unstable();
    Ok(out)
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
fn raise_open_files_limit() {
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

    fn record(text: &str, doc: u64) -> DocHash {
        DocHash::of(&blake3::hash(text.as_bytes()), doc, text.len() as u64)
    }

    /// Writes a shard's `bands/` (in runs of 7 records) and `signatures.bin` for `docs` (each:
    /// its signature and its band keys, which a test may forge).
    fn write_shard(dir: &Path, docs: &[(Vec<u64>, Vec<[u8; 16]>)]) {
        std::fs::create_dir_all(dir).unwrap();
        let mut bands = Vec::new();
        let mut sigs = Vec::new();
        for (doc, (sig, keys)) in docs.iter().enumerate() {
            bands.extend(keys.iter().map(|&hash| DocHash {
                hash,
                doc: doc as u64,
                bytes: 100 + doc as u64,
            }));
            sigs.extend(sig.iter().flat_map(|v| v.to_le_bytes()));
        }
        let mut runs = crate::sorted_runs::RunWriter::create(dir.join(NEAR), 7).unwrap();
        for b in bands {
            runs.push(b).unwrap();
        }
        assert!(runs.finish().unwrap() > 1, "several runs");
        std::fs::write(dir.join(SIGNATURES), sigs).unwrap();
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
            (sig, keys)
        };
        // A chain: a ~ b ~ c (each a few words off the one before), one per shard, and two
        // unrelated texts d, e made to share a band (a forged key): a candidate pair that the
        // signatures refuse.
        let (d, mut e) = (doc(text(7, &[])), doc(text(8, &[])));
        e.1[3] = d.1[3];
        let tmp = tempfile::tempdir().unwrap();
        let dirs: Vec<std::path::PathBuf> =
            (0..3).map(|i| tmp.path().join(format!("s{i}"))).collect();
        write_shard(&dirs[0], &[doc(text(1, &[])), d]);
        write_shard(&dirs[1], &[e, doc(text(1, &[10, 200]))]);
        write_shard(&dirs[2], &[doc(text(1, &[10, 200, 40, 250]))]);
        let drops = near_clusters(&dirs, &[2, 2, 1], 0.7, &|| Ok(())).unwrap();
        assert_eq!(drops, vec![(1, 1, 101), (2, 0, 100)]);
        // Without the check every candidate counts, as datatrove does: e goes too.
        let drops = near_clusters(&dirs, &[2, 2, 1], 0.0, &|| Ok(())).unwrap();
        assert_eq!(drops, vec![(1, 0, 100), (1, 1, 101), (2, 0, 100)]);
    }

    #[test]
    fn exact_repeats_in_other_runs_and_other_inputs_go_and_the_first_stays() {
        let tmp = tempfile::tempdir().unwrap();
        let dirs: Vec<std::path::PathBuf> =
            (0..2).map(|i| tmp.path().join(format!("s{i}"))).collect();
        // Input 0: a, b | c, a (runs of 2: the second a is in another run); input 1: b, d.
        for (dir, texts) in dirs.iter().zip([&["a", "b", "c", "a"][..], &["b", "d"]]) {
            let mut w = crate::sorted_runs::RunWriter::create(dir.join(EXACT), 2).unwrap();
            for (doc, t) in texts.iter().enumerate() {
                w.push(record(t, doc as u64)).unwrap();
            }
            w.finish().unwrap();
        }
        let mut later = Vec::new();
        let records = Merged::open(&dirs, EXACT, true).unwrap();
        merge(records, &|| Ok(()), |input, h| later.push((input, h.doc))).unwrap();
        later.sort();
        assert_eq!(later, vec![(0, 3), (1, 0)]);
        assert_eq!(drops_file("web", 3, 12), "drops/web/03.bin");
        assert_eq!(drops_file("web", 0, 1), "drops/web/0.bin");
    }
}
