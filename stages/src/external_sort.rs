//! Sorting more records than fit in memory: [`Sorter`] keeps at most a budget of records,
//! spills each full buffer as a sorted run ([`crate::sorted_runs`]) into a scratch folder, and
//! [`Sorter::finish`] merges the runs back ([`Merge`]), one record and one read buffer per run.
//! A sort that never filled its buffer never touches the disk.
//!
//! Hand-written on `sorted_runs` rather than taken from a crate (`extsort`): the runs, their
//! checks and their files are the ones the dedup stages already read, and the records are
//! plain `[u64; N]`.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::path::PathBuf;

use anyhow::Result;

use crate::sorted_runs::{Record, Run, RunWriter, open_runs, read_buffer};

/// A k-way merge of sorted runs: their records, least first (ties: the earlier run first).
pub struct Merge<R: Record> {
    runs: Vec<Run<R>>,
    heap: BinaryHeap<Reverse<(R, usize)>>,
}

impl<R: Record> Merge<R> {
    /// The merge of `runs`.
    pub fn new(runs: Vec<Run<R>>) -> Result<Merge<R>> {
        let mut merge = Merge {
            runs,
            heap: BinaryHeap::new(),
        };
        for run in 0..merge.runs.len() {
            merge.refill(run)?;
        }
        Ok(merge)
    }

    fn refill(&mut self, run: usize) -> Result<()> {
        if let Some(r) = self.runs[run].next_record()? {
            self.heap.push(Reverse((r, run)));
        }
        Ok(())
    }

    /// The next record in order, or `None` at the end.
    pub fn next_record(&mut self) -> Result<Option<R>> {
        let Some(Reverse((r, run))) = self.heap.pop() else {
            return Ok(None);
        };
        self.refill(run)?;
        Ok(Some(r))
    }
}

/// Records sorted within a memory budget.
pub struct Sorter<R: Record> {
    runs: RunWriter<R>,
    dir: PathBuf,
    memory: usize,
}

impl<R: Record> Sorter<R> {
    /// A sort that holds at most `memory` bytes of records, spilling runs into `dir` (created;
    /// removed when the sorted records are dropped).
    pub fn new(dir: PathBuf, memory: usize) -> Result<Sorter<R>> {
        let capacity = (memory / std::mem::size_of::<R>().max(1)).max(1);
        Ok(Sorter {
            runs: RunWriter::scratch(dir.clone(), capacity)?,
            dir,
            memory,
        })
    }

    /// Adds a record.
    pub fn push(&mut self, record: R) -> Result<()> {
        self.runs.push(record)?;
        Ok(())
    }

    /// The records, sorted.
    pub fn finish(self) -> Result<Sorted<R>> {
        let (in_memory, runs) = self.runs.finish_in_memory()?;
        let source = if runs == 0 {
            Source::Memory(in_memory.into_iter())
        } else {
            let buffer = read_buffer(self.memory, runs);
            Source::Runs(Merge::new(open_runs(&self.dir, false, buffer)?)?)
        };
        Ok(Sorted {
            source,
            dir: self.dir,
        })
    }
}

/// A sort's records, least first; its scratch folder goes when it is dropped.
pub struct Sorted<R: Record> {
    source: Source<R>,
    dir: PathBuf,
}

enum Source<R: Record> {
    Memory(std::vec::IntoIter<R>),
    Runs(Merge<R>),
}

impl<R: Record> Sorted<R> {
    /// The next record in order, or `None` at the end.
    pub fn next_record(&mut self) -> Result<Option<R>> {
        match &mut self.source {
            Source::Memory(it) => Ok(it.next()),
            Source::Runs(m) => m.next_record(),
        }
    }
}

impl<R: Record> Drop for Sorted<R> {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sort_larger_than_its_memory_spills_and_merges_back_in_order() {
        let tmp = tempfile::tempdir().unwrap();
        let mut rng = zflow_runtime::rng::SplitMix64(3);
        let records: Vec<[u64; 2]> = (0..10_000).map(|i| [rng.below(500), i]).collect();
        // 16 bytes a record, 1 KiB of memory: 64 records a run, 157 runs.
        let mut sorter = Sorter::new(tmp.path().join("sort"), 1024).unwrap();
        for &r in &records {
            sorter.push(r).unwrap();
        }
        let mut sorted = sorter.finish().unwrap();
        assert!(tmp.path().join("sort/156.bin").exists());
        let mut out = Vec::new();
        while let Some(r) = sorted.next_record().unwrap() {
            out.push(r);
        }
        let mut want = records.clone();
        want.sort();
        assert_eq!(out, want);
        drop(sorted);
        assert!(!tmp.path().join("sort").exists(), "the scratch runs go");

        // One that fits stays in memory.
        let mut sorter = Sorter::new(tmp.path().join("small"), 1 << 20).unwrap();
        for &r in records.iter().rev() {
            sorter.push(r).unwrap();
        }
        let mut sorted = sorter.finish().unwrap();
        assert!(!tmp.path().join("small/0.bin").exists());
        assert_eq!(sorted.next_record().unwrap(), Some(want[0]));
    }
}
