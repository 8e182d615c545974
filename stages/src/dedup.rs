//! `dedup.<source>`: exact and near-duplicate removal across the shards of a sharded source.
//!
//! Each shard's ingest drops its own exact duplicates and writes `hashes.bin`: one record per
//! kept document (the first 16 bytes of the blake3 of its normalised text, its index in the
//! shard, its size in bytes), sorted; with `near_dedup`, also `bands.bin`, a record per LSH band
//! of each kept document ([`crate::minhash`]). This stage merges every shard's records of a kind,
//! a k-way merge that holds one record per shard in memory however large the source: of equal
//! texts, the first in shard order stays. Documents sharing a band are candidate pairs; a pair
//! whose signatures (`signatures.bin`, read per pair) agree on at least `jaccard` of their
//! values joins a cluster (union-find over the documents in some verified pair), and each
//! cluster keeps its first document in shard order ([`crate::minhash`]). Every other document
//! goes into its shard's drop list,
//! `drops/<index>.bin` (document indices, u64 little-endian, ascending; a file for every shard,
//! empty when it drops nothing), which that shard's tokenize stage leaves out. A tokenize
//! stage's identity hashes its own drop list only ([`crate::tokenize::SkipList`]), so a
//! changed shard re-runs this stage (cheap: it reads 32 bytes per document) but only the
//! tokenize stages whose drop lists changed.
//!
//! The exact result equals deduplicating the concatenation of the shards in order: what stays
//! is the same set of texts as one unsharded ingest keeps (in shard order rather than file
//! order).
//!
//! `stats.json` and `stats.parquet` (`source`, `shard`, `rule`, `documents`, `bytes`): per
//! shard, the documents it holds, those dropped as exact duplicates of an earlier shard's and
//! as near duplicates, and those kept.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, Result, ensure};
use arrow::array::{ArrayRef, StringArray, UInt64Array};
use arrow::datatypes::{DataType, Field};
use serde::{Deserialize, Serialize};
use zflow_pipeline::{ConfigError, Stage, StageContext};

use crate::names;
use crate::shard::Shard;

/// The `dedup` stage kind.
pub struct Dedup;

/// `dedup` settings (what `sources.<name>.shards`, or `cross_dedup`, writes).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DedupConfig {
    /// The sources, in the order their documents count: of duplicates, the first in this
    /// order (then shard order) stays. One for a sharded source; several with `cross_dedup`.
    pub sources: Vec<DedupSource>,
    /// Exact duplicates across shards (the shards' `hashes.bin`).
    pub exact: bool,
    /// Near duplicates (the shards' `bands.bin` and `signatures.bin`).
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
    /// Its number of shards; its ingest shards are inputs.
    pub shards: usize,
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
                names::sharded(&names::ingest(&src.name), Some(src.shards))
                    .into_iter()
                    .enumerate()
                    .map(move |(i, stage)| (stage, src, i))
            })
            .collect()
    }
}

/// A shard's records of its documents' text hashes.
pub const EXACT: &str = "hashes.bin";
/// A shard's records of its documents' LSH bands.
pub const NEAR: &str = "bands.bin";
/// A shard's kept documents' MinHash signatures, in document order: `bands * rows` u64
/// (little-endian) each ([`crate::minhash::MinHasher::signature`]).
pub const SIGNATURES: &str = "signatures.bin";

/// One kept document of a shard, as `hashes.bin` holds it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct DocHash {
    /// The first 16 bytes of the blake3 of the normalised text (the order of the records).
    pub hash: [u8; 16],
    /// The document's index in its shard's `documents.parquet`.
    pub doc: u64,
    /// Its size in bytes.
    pub bytes: u64,
}

impl DocHash {
    /// Bytes per record.
    const LEN: usize = 32;

    /// The record of document `doc` of `bytes` bytes whose text's blake3 is `text_hash`.
    pub fn of(text_hash: &blake3::Hash, doc: u64, bytes: u64) -> DocHash {
        DocHash {
            hash: text_hash.as_bytes()[..16].try_into().expect("16 bytes"),
            doc,
            bytes,
        }
    }

    fn encode(&self) -> [u8; Self::LEN] {
        let mut out = [0; Self::LEN];
        out[..16].copy_from_slice(&self.hash);
        out[16..24].copy_from_slice(&self.doc.to_le_bytes());
        out[24..].copy_from_slice(&self.bytes.to_le_bytes());
        out
    }

    fn decode(b: &[u8; Self::LEN]) -> DocHash {
        DocHash {
            hash: b[..16].try_into().expect("16 bytes"),
            doc: u64::from_le_bytes(b[16..24].try_into().expect("8 bytes")),
            bytes: u64::from_le_bytes(b[24..].try_into().expect("8 bytes")),
        }
    }
}

/// Writes a shard's records ([`EXACT`] or [`NEAR`]) to `path`, sorted.
pub fn write_records(path: &Path, mut hashes: Vec<DocHash>) -> Result<()> {
    hashes.sort_unstable();
    let mut w = BufWriter::new(std::fs::File::create(path)?);
    for h in &hashes {
        w.write_all(&h.encode())?;
    }
    w.into_inner()?.sync_all()?;
    Ok(())
}

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

/// One shard's records, read one at a time.
struct Records {
    reader: BufReader<std::fs::File>,
    path: std::path::PathBuf,
    previous: Option<DocHash>,
    /// No two records with one hash (the exact kind: the shard dropped its own duplicates).
    unique: bool,
}

impl Records {
    fn open(path: std::path::PathBuf, unique: bool) -> Result<Records> {
        let file = std::fs::File::open(&path).with_context(|| {
            format!(
                "opening {} (an ingest shard of a deduplicated source writes it)",
                path.display()
            )
        })?;
        Ok(Records {
            reader: BufReader::with_capacity(1 << 16, file),
            path,
            previous: None,
            unique,
        })
    }

    fn next(&mut self) -> Result<Option<DocHash>> {
        let mut b = [0u8; DocHash::LEN];
        match self.reader.read_exact(&mut b) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
            Err(e) => return Err(e).with_context(|| format!("reading {}", self.path.display())),
        }
        let h = DocHash::decode(&b);
        ensure!(
            self.previous
                .is_none_or(|p| p < h && !(self.unique && p.hash == h.hash)),
            "{}: records out of order or repeated (a damaged file?)",
            self.path.display()
        );
        self.previous = Some(h);
        Ok(Some(h))
    }
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
        raise_open_files_limit(inputs.len() as u64 + 64);
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
                .set_message(format!("merging the shards' {EXACT}"));
            let readers = dirs
                .iter()
                .map(|d| Records::open(d.join(EXACT), true))
                .collect::<Result<Vec<_>>>()?;
            merge(readers, &|| ctx.check_cancelled(), |shard, h| {
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
                .set_message(format!("clustering the shards' {NEAR}"));
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
                ctx.out_dir().join(drops_file(&src.name, *i, src.shards)),
                bytes,
            )?;
        }
        let (exact, near): (u64, u64) = shards
            .iter()
            .fold((0, 0), |(e, n), t| (e + t.exact.0, n + t.near.0));
        let names: Vec<&str> = c.sources.iter().map(|s| s.name.as_str()).collect();
        tracing::info!(
            "{}: {} shards; dropped {exact} exact duplicates of an earlier shard's documents and {near} near duplicates",
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

/// Merges the shards' sorted records by (hash, shard, document) and calls `later` with every
/// record whose hash an earlier one (in that order) had.
fn merge(
    mut shards: Vec<Records>,
    check: &dyn Fn() -> Result<()>,
    mut later: impl FnMut(usize, DocHash),
) -> Result<()> {
    let mut heap = BinaryHeap::new();
    for (i, r) in shards.iter_mut().enumerate() {
        if let Some(h) = r.next()? {
            heap.push(Reverse((h.hash, i, h.doc, h.bytes)));
        }
    }
    let (mut last, mut merged) = (None, 0u64);
    while let Some(Reverse((hash, shard, doc, bytes))) = heap.pop() {
        if last == Some(hash) {
            later(shard, DocHash { hash, doc, bytes });
        }
        last = Some(hash);
        if let Some(h) = shards[shard].next()? {
            heap.push(Reverse((h.hash, shard, h.doc, h.bytes)));
        }
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
    let mut readers = dirs
        .iter()
        .map(|d| Records::open(d.join(NEAR), false))
        .collect::<Result<Vec<_>>>()?;
    let mut heap = BinaryHeap::new();
    for (i, r) in readers.iter_mut().enumerate() {
        if let Some(h) = r.next()? {
            heap.push(Reverse((h.hash, i, h.doc, h.bytes)));
        }
    }
    let mut clusters = Clusters::default();
    let mut bytes_of = std::collections::HashMap::new();
    let (mut previous, mut merged): (Option<([u8; 16], usize, u64)>, u64) = (None, 0);
    while let Some(Reverse((hash, shard, doc, bytes))) = heap.pop() {
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
        if let Some(h) = readers[shard].next()? {
            heap.push(Reverse((h.hash, shard, h.doc, h.bytes)));
        }
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
            let mut r = Records::open(dir.join(NEAR), false)?;
            while let Some(h) = r.next()? {
                if unknown.remove(&(offsets[i] + h.doc)) {
                    out.push((i, h.doc, h.bytes));
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
        push("dropped:duplicate_of_earlier_shard", t.exact);
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

/// Raises this process's soft limit on open files towards `want` (up to the hard limit): the
/// merge holds every shard's file open at once.
fn raise_open_files_limit(want: u64) {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit with a valid pointer to a local struct.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 && lim.rlim_cur < want {
            lim.rlim_cur = want.min(lim.rlim_max);
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

    /// Writes a shard's `bands.bin` and `signatures.bin` for `docs` (each: its signature and
    /// its band keys, which a test may forge).
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
        write_records(&dir.join(NEAR), bands).unwrap();
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
    fn records_round_trip_and_sort_by_hash_first() {
        let a = record("one text", 7);
        assert_eq!(DocHash::decode(&a.encode()), a);
        let mut v = [record("b", 0), record("a", 1), record("c", 2)];
        v.sort();
        assert!(v.windows(2).all(|w| w[0].hash < w[1].hash));
        assert_eq!(drops_file("web", 3, 12), "drops/web/03.bin");
        assert_eq!(drops_file("web", 0, 1), "drops/web/0.bin");
    }
}
