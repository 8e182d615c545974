//! Sorted runs of fixed-size records on disk: what an ingest stage writes for its source's
//! `dedup` stages ([`crate::dedup_keys`], [`crate::dedup`]) instead of holding a set of every
//! document it has seen, and what those stages sort through in bounded memory
//! ([`crate::external_sort`]).
//!
//! A [`Record`] has a fixed size and an order. An ingest's ([`DocHash`]) is a 16-byte hash (of a
//! document's text, or of one of its LSH bands), the document's index in its stage's
//! `documents.parquet` and its size in bytes. A [`RunWriter`] buffers at most `capacity`
//! records, then sorts them and writes them as one run, `<dir>/<k>.bin` (k = 0, 1, ...);
//! [`open_runs`] reads a folder's runs back, one record at a time each, for a k-way merge, and
//! [`Run::seek`] starts a run at the first record of a key range. So the memory a stage needs
//! for its records is bounded by `capacity`, however large its source, and a merge holds one
//! record (and one read buffer) per run.

use std::io::{BufReader, BufWriter, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, ensure};

/// A fixed-size, ordered record of a run.
pub trait Record: Copy + Ord + std::fmt::Debug {
    /// Bytes per record on disk.
    const LEN: usize;
    /// Appends the record's `LEN` bytes to `out`.
    fn encode(&self, out: &mut Vec<u8>);
    /// The record in `bytes` (`LEN` of them).
    fn decode(bytes: &[u8]) -> Self;
    /// Whether this record repeats `earlier` where a run may hold no repeats (`unique`): for a
    /// text hash, the same hash.
    fn repeats(&self, earlier: &Self) -> bool {
        self == earlier
    }
}

/// One record of a document, as an ingest's runs hold it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct DocHash {
    /// The first 16 bytes of the blake3 of the normalised text, or an LSH band's key (the
    /// order of the records).
    pub hash: [u8; 16],
    /// The document's index in its stage's `documents.parquet`.
    pub doc: u64,
    /// Its size in bytes.
    pub bytes: u64,
}

impl DocHash {
    /// The record of document `doc` of `bytes` bytes whose text's blake3 is `text_hash`.
    pub fn of(text_hash: &blake3::Hash, doc: u64, bytes: u64) -> DocHash {
        DocHash {
            hash: text_hash.as_bytes()[..16].try_into().expect("16 bytes"),
            doc,
            bytes,
        }
    }

    /// The hash's first 8 bytes as a big-endian number: where the record falls in the key
    /// space that [`crate::dedup_keys`] cuts into ranges.
    pub fn key_prefix(&self) -> u64 {
        u64::from_be_bytes(self.hash[..8].try_into().expect("8 bytes"))
    }
}

impl Record for DocHash {
    const LEN: usize = 32;

    fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.hash);
        out.extend_from_slice(&self.doc.to_le_bytes());
        out.extend_from_slice(&self.bytes.to_le_bytes());
    }

    fn decode(b: &[u8]) -> DocHash {
        DocHash {
            hash: b[..16].try_into().expect("16 bytes"),
            doc: u64::from_le_bytes(b[16..24].try_into().expect("8 bytes")),
            bytes: u64::from_le_bytes(b[24..32].try_into().expect("8 bytes")),
        }
    }

    fn repeats(&self, earlier: &Self) -> bool {
        self.hash == earlier.hash
    }
}

/// `N` numbers (little-endian u64 each), ordered as a tuple: a drop `(document, bytes)` or a
/// graph edge `(a, b, bytes of a, bytes of b)`.
impl<const N: usize> Record for [u64; N] {
    const LEN: usize = 8 * N;

    fn encode(&self, out: &mut Vec<u8>) {
        for v in self {
            out.extend_from_slice(&v.to_le_bytes());
        }
    }

    fn decode(b: &[u8]) -> Self {
        std::array::from_fn(|i| u64::from_le_bytes(b[8 * i..8 * i + 8].try_into().expect("8")))
    }
}

/// Records written to `dir` in sorted runs of at most `capacity` records each.
pub struct RunWriter<R: Record = DocHash> {
    dir: PathBuf,
    buffer: Vec<R>,
    capacity: usize,
    runs: usize,
    /// Whether each run is synced to disk as it is written (not for scratch runs, which a crash
    /// discards with their stage's attempt).
    durable: bool,
}

impl<R: Record> RunWriter<R> {
    /// A writer of runs into `dir` (created, empty), each synced as it is written.
    pub fn create(dir: PathBuf, capacity: usize) -> Result<RunWriter<R>> {
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        Ok(RunWriter {
            dir,
            buffer: Vec::new(),
            capacity: capacity.max(1),
            runs: 0,
            durable: true,
        })
    }

    /// A writer of scratch runs (not synced): a sort's spills.
    pub fn scratch(dir: PathBuf, capacity: usize) -> Result<RunWriter<R>> {
        Ok(RunWriter {
            durable: false,
            ..RunWriter::create(dir, capacity)?
        })
    }

    /// Adds a record; returns whether its run was then full and went to disk.
    pub fn push(&mut self, record: R) -> Result<bool> {
        if self.buffer.capacity() == 0 {
            // One allocation of the whole run, not a doubling that peaks at twice it.
            self.buffer.reserve_exact(self.capacity);
        }
        self.buffer.push(record);
        if self.buffer.len() < self.capacity {
            return Ok(false);
        }
        self.spill()?;
        Ok(true)
    }

    /// Writes the buffered records, sorted, as the next run.
    fn spill(&mut self) -> Result<()> {
        self.buffer.sort_unstable();
        let path = self.dir.join(format!("{}.bin", self.runs));
        let file =
            std::fs::File::create(&path).with_context(|| format!("creating {}", path.display()))?;
        let mut w = BufWriter::with_capacity(1 << 16, file);
        let mut bytes = Vec::with_capacity(R::LEN);
        for h in &self.buffer {
            bytes.clear();
            h.encode(&mut bytes);
            w.write_all(&bytes)?;
        }
        let file = w.into_inner()?;
        if self.durable {
            file.sync_all()?;
        }
        self.buffer.clear();
        self.runs += 1;
        Ok(())
    }

    /// Takes the buffered records, sorted, when nothing went to disk (the whole sort fit in
    /// memory); otherwise writes them as the last run and gives them back empty.
    pub fn finish_in_memory(mut self) -> Result<(Vec<R>, usize)> {
        if self.runs == 0 {
            self.buffer.sort_unstable();
            return Ok((std::mem::take(&mut self.buffer), 0));
        }
        Ok((Vec::new(), self.finish()?))
    }

    /// Writes what is left as the last run; returns the number of runs.
    pub fn finish(mut self) -> Result<usize> {
        if !self.buffer.is_empty() {
            self.spill()?;
        }
        Ok(self.runs)
    }
}

/// One run's records, read one at a time, checked to be in order.
pub struct Run<R: Record = DocHash> {
    reader: BufReader<std::fs::File>,
    path: PathBuf,
    previous: Option<R>,
    /// No two records repeat each other ([`Record::repeats`]): a text-hash run, whose stage
    /// dropped the run's repeats.
    unique: bool,
}

impl<R: Record> Run<R> {
    /// The next record, or `None` at the end.
    pub fn next_record(&mut self) -> Result<Option<R>> {
        // Records are at most 64 bytes ([u64; 8]), read into the stack.
        const { assert!(R::LEN <= 64) };
        let mut b = [0u8; 64];
        let b = &mut b[..R::LEN];
        match self.reader.read_exact(b) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
            Err(e) => return Err(e).with_context(|| format!("reading {}", self.path.display())),
        }
        let h = R::decode(b);
        ensure!(
            self.previous
                .is_none_or(|p| p <= h && !(self.unique && h.repeats(&p))),
            "{}: records out of order or repeated (a damaged file?)",
            self.path.display()
        );
        self.previous = Some(h);
        Ok(Some(h))
    }

    /// Moves to the first record for which `at_or_after` holds (false for every record before
    /// it, true from it on: the start of a key range), by a binary search of the file, reading
    /// O(log n) records.
    pub fn seek(&mut self, at_or_after: impl Fn(&R) -> bool) -> Result<()> {
        let file = self.reader.get_ref();
        let len = file.metadata()?.len();
        ensure!(
            len % R::LEN as u64 == 0,
            "{}: {len} bytes is not a whole number of {}-byte records",
            self.path.display(),
            R::LEN
        );
        let (mut lo, mut hi) = (0u64, len / R::LEN as u64);
        let mut b = vec![0u8; R::LEN];
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            file.read_exact_at(&mut b, mid * R::LEN as u64)
                .with_context(|| format!("reading {}", self.path.display()))?;
            if at_or_after(&R::decode(&b)) {
                hi = mid;
            } else {
                lo = mid + 1;
            }
        }
        self.reader.seek(SeekFrom::Start(lo * R::LEN as u64))?;
        self.previous = None;
        Ok(())
    }
}

/// The runs of `dir`, in the order they were written; `unique` when no run repeats a record
/// ([`Record::repeats`]). Each reads through a buffer of `buffer` bytes.
pub fn open_runs<R: Record>(dir: &Path, unique: bool, buffer: usize) -> Result<Vec<Run<R>>> {
    let mut numbered = Vec::new();
    let entries = std::fs::read_dir(dir).with_context(|| {
        format!(
            "listing {} (the ingest stage of a deduplicated source writes it)",
            dir.display()
        )
    })?;
    for entry in entries {
        let path = entry?.path();
        let k = path
            .file_stem()
            .and_then(|s| s.to_str())
            .and_then(|s| s.parse::<usize>().ok())
            .filter(|_| path.extension().is_some_and(|e| e == "bin"))
            .with_context(|| format!("{}: not a run (`<k>.bin`)", path.display()))?;
        numbered.push((k, path));
    }
    numbered.sort();
    ensure!(
        numbered.iter().enumerate().all(|(i, (k, _))| i == *k),
        "{}: runs missing (found {:?})",
        dir.display(),
        numbered.iter().map(|(k, _)| k).collect::<Vec<_>>()
    );
    numbered
        .into_iter()
        .map(|(_, path)| {
            let file = std::fs::File::open(&path)
                .with_context(|| format!("opening {}", path.display()))?;
            Ok(Run {
                reader: BufReader::with_capacity(buffer.max(R::LEN), file),
                path,
                previous: None,
                unique,
            })
        })
        .collect()
}

/// The read buffer of each of `runs` runs that a merge may hold within `memory` bytes: between
/// 4 KiB and 64 KiB.
pub fn read_buffer(memory: usize, runs: usize) -> usize {
    (memory / runs.max(1)).clamp(4 << 10, 64 << 10)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(text: &str, doc: u64) -> DocHash {
        DocHash::of(&blake3::hash(text.as_bytes()), doc, text.len() as u64)
    }

    #[test]
    fn records_round_trip_and_sort_by_hash_first() {
        let a = record("one text", 7);
        let mut bytes = Vec::new();
        a.encode(&mut bytes);
        assert_eq!(DocHash::decode(&bytes), a);
        let edge = [1u64, 2, 3, u64::MAX];
        bytes.clear();
        edge.encode(&mut bytes);
        assert_eq!(<[u64; 4]>::decode(&bytes), edge);
        let mut v = [record("b", 0), record("a", 1), record("c", 2)];
        v.sort();
        assert!(v.windows(2).all(|w| w[0].hash < w[1].hash));
    }

    #[test]
    fn a_writer_spills_sorted_runs_of_its_capacity_that_read_back_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let mut w = RunWriter::<DocHash>::create(dir.path().join("h"), 3).unwrap();
        let spilled: Vec<bool> = (0..7)
            .map(|d| w.push(record(&format!("t{d}"), d)).unwrap())
            .collect();
        assert_eq!(
            spilled,
            [false, false, true, false, false, true, false],
            "a full run goes to disk"
        );
        assert_eq!(w.finish().unwrap(), 3);
        let mut runs = open_runs::<DocHash>(&dir.path().join("h"), true, 4096).unwrap();
        let mut docs = Vec::new();
        for run in &mut runs {
            let mut previous = None;
            while let Some(h) = run.next_record().unwrap() {
                assert!(previous.is_none_or(|p| p < h));
                previous = Some(h);
                docs.push(h.doc);
            }
        }
        docs.sort();
        assert_eq!(docs, (0..7).collect::<Vec<u64>>());
        // A run that repeats a hash where none may is damage, named.
        let mut w = RunWriter::<DocHash>::create(dir.path().join("r"), 2).unwrap();
        w.push(record("x", 0)).unwrap();
        w.push(record("x", 1)).unwrap();
        w.finish().unwrap();
        let mut runs = open_runs::<DocHash>(&dir.path().join("r"), true, 4096).unwrap();
        runs[0].next_record().unwrap();
        let err = runs[0].next_record().unwrap_err().to_string();
        assert!(err.contains("0.bin") && err.contains("repeated"), "{err}");
    }

    #[test]
    fn a_run_entered_at_a_key_reads_from_the_first_record_at_or_after_it() {
        let dir = tempfile::tempdir().unwrap();
        let mut w = RunWriter::<DocHash>::create(dir.path().join("b"), 1000).unwrap();
        for d in 0..100u64 {
            let mut hash = [0u8; 16];
            hash[..8].copy_from_slice(&(d / 2 * 10).to_be_bytes());
            w.push(DocHash {
                hash,
                doc: d,
                bytes: 1,
            })
            .unwrap();
        }
        w.finish().unwrap();
        let mut run = open_runs::<DocHash>(&dir.path().join("b"), false, 4096)
            .unwrap()
            .remove(0);
        for (key, first) in [(0, Some(0)), (15, Some(4)), (20, Some(4)), (491, None)] {
            run.seek(|r| r.key_prefix() >= key).unwrap();
            assert_eq!(
                run.next_record().unwrap().map(|r| r.doc),
                first,
                "key {key}"
            );
        }
    }
}
