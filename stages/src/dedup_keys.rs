//! `dedup_keys.<source>.k<i>`: one range of the key space of a deduplicated source's records,
//! the fan-out of its dedup ([`crate::dedup`]), in the spirit of datatrove's MinHash buckets
//! stage. Task `i` of `n` reads, from every ingest shard's sorted runs, only the records whose
//! key (the first 8 bytes of a text hash or a band key, big-endian) falls in
//! `[i 2^64 / n, (i + 1) 2^64 / n)`: each run is entered by a binary search ([`Run::seek`]) and
//! left at the range's end. So a record is read by one task, and the tasks of a source run side
//! by side (a Slurm job array), each in the memory it declares (`memory_gb`, Slurm's `--mem`):
//! a merge holds one record and one read buffer per run, and what a task writes goes out in
//! sorted runs of a bounded size.
//!
//! - **Exact** (`hashes/`): in (hash, shard, document) order, a record whose hash the one
//!   before it had repeats an earlier document's text. Its document goes to `exact/`, runs of
//!   `[document, bytes]` (document numbered across the inputs, in input order).
//! - **Near** (`bands/`): records sharing a band key are candidates; each record and the one
//!   before it with its key form a candidate pair, verified against the two documents'
//!   MinHash signatures (`signatures.bin`, read per pair): at least `jaccard` of their values
//!   equal. A verified pair goes to `edges/`, runs of `[a, b, bytes of a, bytes of b]`.
//!
//! `stats.json`: the task's range and what it read, found and verified.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, ensure};
use serde::{Deserialize, Serialize};
use zflow_pipeline::{ConfigError, Stage, StageContext};

use crate::dedup::{DedupConfig, EXACT, NEAR, SIGNATURES};
use crate::sorted_runs::{DocHash, Run, RunWriter, open_runs, read_buffer};

/// The `dedup_keys` stage kind.
pub struct DedupKeys;

/// `dedup_keys` settings.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DedupKeysConfig {
    /// The dedup this task is part of: its sources, rules, number of tasks and memory.
    pub dedup: DedupConfig,
    /// Which range of keys, of `dedup.tasks`.
    pub task: usize,
}

/// A task's output folder of exact duplicates: runs of `[document, bytes]`.
pub const EXACT_DROPS: &str = "exact";
/// A task's output folder of verified near-duplicate pairs: runs of `[a, b, bytes a, bytes b]`.
pub const EDGES: &str = "edges";

/// The keys (a record's [`DocHash::key_prefix`]) of task `task` of `tasks`: `lo <= key < hi`.
pub fn key_range(task: usize, tasks: usize) -> (u128, u128) {
    let bound = |t: usize| ((t as u128) << 64) / tasks.max(1) as u128;
    (bound(task), bound(task + 1))
}

/// The working memory of a dedup task (its buffers): half of what its own allocations may use
/// ([`StageContext::memory_bytes`]), the rest left to what it does not count (the allocator's
/// slack, the merge heaps, the signatures being compared).
pub fn working_memory(ctx: &StageContext, config: &DedupConfig) -> usize {
    let declared = ctx
        .memory_bytes()
        .unwrap_or((config.memory_gb * (1u64 << 30) as f64) as u64);
    (declared / 2) as usize
}

impl Stage for DedupKeys {
    type Config = DedupKeysConfig;
    const KIND: &'static str = "dedup_keys";
    const VERSION: u32 = 1;

    fn validate(&self, c: &DedupKeysConfig, needs: &[String]) -> Result<(), ConfigError> {
        if c.task >= c.dedup.tasks {
            return Err(ConfigError::new(
                "task",
                format!("task {} of {}", c.task, c.dedup.tasks),
            ));
        }
        let want = c.dedup.input_stages();
        if needs != want.as_slice() {
            return Err(ConfigError::new(
                "needs",
                "a dedup_keys stage reads the ingest shards of its dedup's sources, in order",
            ));
        }
        Ok(())
    }

    fn resources(&self, c: &DedupKeysConfig) -> zflow_pipeline::Resources {
        c.dedup.task_resources()
    }

    fn run(&self, c: &DedupKeysConfig, ctx: &StageContext) -> Result<()> {
        crate::dedup::raise_open_files_limit();
        let dirs = c.dedup.input_dirs(ctx)?;
        ctx.progress().set_message(format!(
            "duplicates in key range {} of {}",
            c.task, c.dedup.tasks
        ));
        let memory = working_memory(ctx, &c.dedup);
        let stats = run_task(&c.dedup, c.task, &dirs, memory, ctx.out_dir(), &|| {
            ctx.check_cancelled()
        })?;
        tracing::info!(
            "key range {} of {} in {} MiB of read buffers: {stats}",
            c.task,
            c.dedup.tasks,
            memory >> 20
        );
        Ok(())
    }
}

/// Task `task` of dedup `c` over the ingest outputs `dirs`, its read buffers within `memory`:
/// writes `exact/`, `edges/` and `stats.json` into `out`, and returns the stats.
pub fn run_task(
    c: &DedupConfig,
    task: usize,
    dirs: &[PathBuf],
    memory: usize,
    out: &Path,
    check: &dyn Fn() -> Result<()>,
) -> Result<serde_json::Value> {
    let docs = crate::dedup::documents_per_input(dirs)?;
    let offsets = crate::dedup::offsets(&docs);
    let range = key_range(task, c.tasks);
    let mut stats = serde_json::json!({
        "task": task,
        "tasks": c.tasks,
        "keys": [format!("{:016x}", range.0), format!("{:x}", range.1)],
    });
    // What the task writes depends on its config only (the same bytes on every executor): its
    // runs hold an eighth of the declared memory. The read buffers take `memory`.
    let run_bytes = (c.memory_gb * (1u64 << 30) as f64 / 8.0) as usize;
    if c.exact {
        let mut records = KeyMerge::open(dirs, EXACT, true, range, memory)?;
        let mut drops = RunWriter::<[u64; 2]>::create(out.join(EXACT_DROPS), run_bytes / 16)?;
        let (mut read, mut repeats) = (0u64, 0u64);
        let mut previous: Option<[u8; 16]> = None;
        while let Some((input, h)) = records.next()? {
            if previous == Some(h.hash) {
                drops.push([offsets[input] + h.doc, h.bytes])?;
                repeats += 1;
            }
            previous = Some(h.hash);
            read += 1;
            if read.is_multiple_of(1 << 20) {
                check()?;
            }
        }
        drops.finish()?;
        stats["exact"] = serde_json::json!({"records": read, "repeats": repeats});
    }
    if c.near {
        let signatures = dirs
            .iter()
            .zip(&docs)
            .map(|(d, &(n, _))| Signatures::open(d, n))
            .collect::<Result<Vec<_>>>()?;
        let mut records = KeyMerge::open(dirs, NEAR, false, range, memory)?;
        let mut edges = RunWriter::<[u64; 4]>::create(out.join(EDGES), run_bytes / 32)?;
        let (mut read, mut candidates, mut verified) = (0u64, 0u64, 0u64);
        let mut previous: Option<([u8; 16], usize, u64, u64)> = None;
        while let Some((shard, DocHash { hash, doc, bytes })) = records.next()? {
            if let Some((h, s, d, b)) = previous
                && h == hash
                && (s, d) != (shard, doc)
            {
                candidates += 1;
                let (x, y) = (signatures[s].get(d)?, signatures[shard].get(doc)?);
                if crate::minhash::similarity(&x, &y) >= c.jaccard {
                    verified += 1;
                    edges.push([offsets[s] + d, offsets[shard] + doc, b, bytes])?;
                }
            }
            previous = Some((hash, shard, doc, bytes));
            read += 1;
            if read.is_multiple_of(1 << 20) {
                check()?;
            }
        }
        edges.finish()?;
        stats["near"] =
            serde_json::json!({"records": read, "candidates": candidates, "verified": verified});
    }
    std::fs::write(out.join("stats.json"), serde_json::to_vec_pretty(&stats)?)?;
    Ok(stats)
}

/// Every input's runs of one kind, merged over one key range: their records in (hash, input,
/// document) order, a k-way merge that holds one record per run.
struct KeyMerge {
    /// Each run, with the input it belongs to.
    runs: Vec<(usize, Run)>,
    /// The next record of each run that has one in the range, least first.
    heap: BinaryHeap<Reverse<Pending>>,
    /// The end of the key range (exclusive).
    end: u128,
}

/// A run's next record in the merge: (hash, input, document, bytes, run), ordered as merged.
type Pending = ([u8; 16], usize, u64, u64, usize);

impl KeyMerge {
    /// The records with keys in `range` of the runs in `<dir>/<kind>` of every input dir;
    /// `unique` when no run repeats a hash. The runs' read buffers share `memory` bytes.
    fn open(
        dirs: &[PathBuf],
        kind: &str,
        unique: bool,
        (start, end): (u128, u128),
        memory: usize,
    ) -> Result<KeyMerge> {
        let mut counts = Vec::with_capacity(dirs.len());
        for dir in dirs {
            counts.push(crate::dedup::count_runs(&dir.join(kind))?);
        }
        let buffer = read_buffer(memory, counts.iter().sum());
        let mut runs = Vec::new();
        for (input, dir) in dirs.iter().enumerate() {
            for mut run in open_runs::<DocHash>(&dir.join(kind), unique, buffer)? {
                run.seek(|r| r.key_prefix() as u128 >= start)?;
                runs.push((input, run));
            }
        }
        let mut merged = KeyMerge {
            runs,
            heap: BinaryHeap::new(),
            end,
        };
        for run in 0..merged.runs.len() {
            merged.refill(run)?;
        }
        Ok(merged)
    }

    /// Puts run `run`'s next record in the range, if any, in the heap.
    fn refill(&mut self, run: usize) -> Result<()> {
        let (input, r) = &mut self.runs[run];
        if let Some(h) = r.next_record()?
            && (h.key_prefix() as u128) < self.end
        {
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

/// A shard's signatures, read by document.
struct Signatures {
    file: std::fs::File,
    path: PathBuf,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_ranges_cover_the_key_space_once() {
        for tasks in [1, 3, 7, 64] {
            let ranges: Vec<(u128, u128)> = (0..tasks).map(|t| key_range(t, tasks)).collect();
            assert_eq!(ranges[0].0, 0);
            assert_eq!(ranges[tasks - 1].1, 1u128 << 64);
            assert!(
                ranges
                    .windows(2)
                    .all(|w| w[0].1 == w[1].0 && w[0].0 < w[0].1)
            );
        }
    }
}
