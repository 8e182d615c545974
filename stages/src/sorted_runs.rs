//! Sorted runs of document records on disk: what an ingest stage writes for its source's `dedup`
//! stage ([`crate::dedup`]) instead of holding a set of every document it has seen.
//!
//! A record ([`DocHash`]) is a 16-byte hash (of a document's text, or of one of its LSH bands),
//! the document's index in its stage's `documents.parquet` and its size in bytes. A
//! [`RunWriter`] buffers at most `capacity` records, then sorts them and writes them as one run,
//! `<dir>/<k>.bin` (k = 0, 1, ...); [`open_runs`] reads a folder's runs back, one record at a
//! time each, for a k-way merge. So the memory a stage needs for its records is bounded by
//! `capacity`, however large its source, and the merge holds one record per run.

use std::io::{BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, ensure};

/// One record of a document, as a run holds it.
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

/// Records written to `dir` in sorted runs of at most `capacity` records each.
pub struct RunWriter {
    dir: PathBuf,
    buffer: Vec<DocHash>,
    capacity: usize,
    runs: usize,
}

impl RunWriter {
    /// A writer of runs into `dir` (created, empty).
    pub fn create(dir: PathBuf, capacity: usize) -> Result<RunWriter> {
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        Ok(RunWriter {
            dir,
            buffer: Vec::new(),
            capacity: capacity.max(1),
            runs: 0,
        })
    }

    /// Adds a record; returns whether its run was then full and went to disk.
    pub fn push(&mut self, record: DocHash) -> Result<bool> {
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
        let mut w = BufWriter::new(file);
        for h in &self.buffer {
            w.write_all(&h.encode())?;
        }
        w.into_inner()?.sync_all()?;
        self.buffer.clear();
        self.runs += 1;
        Ok(())
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
pub struct Run {
    reader: BufReader<std::fs::File>,
    path: PathBuf,
    previous: Option<DocHash>,
    /// No two records with one hash (a text-hash run: its stage dropped the run's repeats).
    unique: bool,
}

impl Run {
    /// The next record, or `None` at the end.
    pub fn next_record(&mut self) -> Result<Option<DocHash>> {
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

/// The runs of `dir`, in the order they were written; `unique` when no run repeats a hash.
pub fn open_runs(dir: &Path, unique: bool) -> Result<Vec<Run>> {
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
                reader: BufReader::with_capacity(1 << 16, file),
                path,
                previous: None,
                unique,
            })
        })
        .collect()
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
        assert_eq!(DocHash::decode(&a.encode()), a);
        let mut v = [record("b", 0), record("a", 1), record("c", 2)];
        v.sort();
        assert!(v.windows(2).all(|w| w[0].hash < w[1].hash));
    }

    #[test]
    fn a_writer_spills_sorted_runs_of_its_capacity_that_read_back_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let mut w = RunWriter::create(dir.path().join("h"), 3).unwrap();
        let spilled: Vec<bool> = (0..7)
            .map(|d| w.push(record(&format!("t{d}"), d)).unwrap())
            .collect();
        assert_eq!(
            spilled,
            [false, false, true, false, false, true, false],
            "a full run goes to disk"
        );
        assert_eq!(w.finish().unwrap(), 3);
        let mut runs = open_runs(&dir.path().join("h"), true).unwrap();
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
        let mut w = RunWriter::create(dir.path().join("r"), 2).unwrap();
        w.push(record("x", 0)).unwrap();
        w.push(record("x", 1)).unwrap();
        w.finish().unwrap();
        let mut runs = open_runs(&dir.path().join("r"), true).unwrap();
        runs[0].next_record().unwrap();
        let err = runs[0].next_record().unwrap_err().to_string();
        assert!(err.contains("0.bin") && err.contains("repeated"), "{err}");
    }
}
