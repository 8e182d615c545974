//! `zflow bench data-scale`: what the data plane costs as a corpus grows. For each count N it
//! synthesises a pre-tokenized (Megatron) source of N small documents, then measures:
//! - validating it (what a `megatron` stage does once, in Rust);
//! - the mix stage's work (plan + index + read plan) and its documents per second;
//! - one rank's start-up up to its first batch, in the torch engine's Python: the time from
//!   opening the mixture to holding the batch, the whole process's wall time (interpreter and
//!   numpy imports included), its peak RSS and its private (anonymous) memory. The files are
//!   dropped from the page cache first, as on a node that did not write them: pages the mix
//!   stage just wrote sit in large folios, and a rank mapping them would count whole folios as
//!   its own.
//!
//! The rank's figures are the curve that must stay flat: they do not depend on N.

use std::process::{Command, ExitCode};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result, bail, ensure};
use zflow_runtime::data::TokenSource;
use zflow_runtime::data::megatron::{DType, IndexedDataset, IndexedDatasetWriter};
use zflow_runtime::data::mixture::{self, MixSpec, MixStage};

/// Tokens per sample of the synthetic phase.
const SEQ_LEN: usize = 64;
/// Rows in the rank's first batch.
const MICRO_BATCH: usize = 4;

/// Parses `1e5,1e6,...` (or plain integers) into document counts.
pub fn parse_counts(text: &str) -> Result<Vec<u64>> {
    text.split(',')
        .map(|item| {
            let v: f64 = item
                .trim()
                .parse()
                .with_context(|| format!("--docs: `{item}` is not a number (e.g. 1e6)"))?;
            ensure!(
                v >= 1.0 && v.fract() == 0.0 && v <= 1e12,
                "--docs: `{item}` is not a whole count of documents between 1 and 1e12"
            );
            Ok(v as u64)
        })
        .collect()
}

/// Runs the benchmark for every count in `docs`, in `dir` (a fresh temporary folder when
/// `None`); each count's files are removed before the next is made.
pub fn run(docs: &[u64], dir: Option<&std::path::Path>) -> Result<ExitCode> {
    let scratch = match dir {
        Some(d) => d.to_path_buf(),
        None => std::env::temp_dir().join(format!("zflow-bench-data-{}", std::process::id())),
    };
    println!(
        "| documents | tokens | validate s | mix s | mix docs/s | rank open+batch s | rank process s | rank peak RSS MB | rank anonymous MB |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    for &n in docs {
        let here = scratch.join(format!("n{n}"));
        std::fs::create_dir_all(&here).with_context(|| format!("creating {}", here.display()))?;
        let result = one(n, &here);
        let _ = std::fs::remove_dir_all(&here);
        let r = result?;
        println!(
            "| {n:.0e} | {} | {:.2} | {:.2} | {:.3e} | {:.3} | {:.2} | {:.0} | {:.0} |",
            r.tokens,
            r.validate_s,
            r.mix_s,
            n as f64 / r.mix_s,
            r.rank_batch_s,
            r.rank_process_s,
            r.rank_peak_rss as f64 / 1e6,
            r.rank_anonymous as f64 / 1e6
        );
    }
    println!();
    println!(
        "near-dedup on a text corpus of N documents ({} ingest shards, {} dedup_keys tasks and the join, each declaring {} MiB):",
        super::near_dedup_scale::SHARDS,
        super::near_dedup_scale::SHARDS,
        super::near_dedup_scale::MEMORY_MIB
    );
    println!(
        "| documents | zflow run s (ingest + dedup) | dedup tasks + join s | near duplicates dropped | largest task | its peak RSS MB |"
    );
    println!("|---|---|---|---|---|---|");
    for &n in docs {
        let here = scratch.join(format!("near{n}"));
        std::fs::create_dir_all(&here).with_context(|| format!("creating {}", here.display()))?;
        if let Err(why) = super::near_dedup_scale::fits(n, &here) {
            println!("| {n:.0e} | {why} | | | | |");
            continue;
        }
        eprintln!("data-scale: near-dedup of {n} documents");
        let result = super::near_dedup_scale::measure(n, &here);
        let _ = std::fs::remove_dir_all(&here);
        let r = result?;
        println!(
            "| {n:.0e} | {:.1} | {:.1} | {} | {} | {:.0} |",
            r.run_s,
            r.dedup_s,
            r.dropped,
            r.largest_task.0,
            r.largest_task.1 as f64 / 1e6
        );
    }
    let _ = std::fs::remove_dir_all(&scratch);
    Ok(ExitCode::SUCCESS)
}

struct Figures {
    tokens: u64,
    validate_s: f64,
    mix_s: f64,
    rank_batch_s: f64,
    rank_process_s: f64,
    rank_peak_rss: u64,
    rank_anonymous: u64,
}

/// Drops the files under `dir` from the page cache (`posix_fadvise(DONTNEED)`: clean pages
/// only, which these are once synced).
fn evict(dir: &std::path::Path) -> Result<()> {
    use std::os::fd::AsRawFd;
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
            evict(&path)?;
            continue;
        }
        let file = std::fs::File::open(&path)?;
        file.sync_all()?;
        // SAFETY: an advisory call on an open descriptor; it reads or writes no memory.
        unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    }
    Ok(())
}

fn one(n: u64, dir: &std::path::Path) -> Result<Figures> {
    let prefix = dir.join("source");
    eprintln!("data-scale: writing {n} documents");
    let mut w = IndexedDatasetWriter::create(&prefix, DType::U16)?;
    let mut doc = [0u32; 3];
    for d in 0..n {
        // 1 to 3 tokens, as short web documents' ends and code snippets are.
        let len = 1 + (d % 3) as usize;
        for (t, slot) in doc[..len].iter_mut().enumerate() {
            *slot = ((d * 7 + t as u64) % 50_000) as u32;
        }
        w.add_document(&doc[..len])?;
    }
    w.finish()?;

    let start = Instant::now();
    let ds = IndexedDataset::open(&prefix)?;
    let validate_s = start.elapsed().as_secs_f64();
    let tokens = ds.num_tokens();

    let index = dir.join("mix").join("samples.idx");
    std::fs::create_dir_all(index.parent().expect("has a parent"))?;
    let spec = MixSpec {
        seq_len: SEQ_LEN,
        seed: 1,
        block_size: 512,
        // One epoch's windows: every document is laid out once.
        budget_tokens: (tokens - 1) / SEQ_LEN as u64 * SEQ_LEN as u64,
        sources: vec!["synthetic".into()],
        schedule: vec![MixStage {
            start: 0.0,
            weights: vec![1.0],
        }],
        max_epochs: vec![],
    };
    ensure!(
        spec.budget_tokens > 0,
        "{n} documents hold too few tokens for one sample"
    );
    eprintln!("data-scale: mixing {n} documents");
    let source: Arc<dyn TokenSource> = Arc::new(ds);
    let start = Instant::now();
    let refs = [source.as_ref()];
    mixture::plan(&spec, &refs)?.write(&index, &refs)?;
    let mix_s = start.elapsed().as_secs_f64();
    // Unmapped, so that the page cache can let its pages go (below).
    drop(source);

    eprintln!("data-scale: a rank's first batch");
    evict(dir)?;
    let mut cmd = zflow_stages::engine::torch_module(
        "zflow_torch.mixture",
        vec![
            "first-batch".into(),
            index.into_os_string(),
            MICRO_BATCH.to_string().into(),
            prefix.into_os_string(),
        ],
    )?;
    let start = Instant::now();
    let out = Command::new(&cmd.program)
        .args(std::mem::take(&mut cmd.args))
        .envs(cmd.env.iter().map(|(k, v)| (k, v)))
        .output()
        .with_context(|| format!("running {}", cmd.program.display()))?;
    let rank_process_s = start.elapsed().as_secs_f64();
    if !out.status.success() {
        bail!(
            "the rank's first batch failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let line: serde_json::Value = serde_json::from_slice(&out.stdout)
        .context("parsing the rank's figures (one JSON line)")?;
    Ok(Figures {
        tokens,
        validate_s,
        mix_s,
        rank_batch_s: line["seconds"].as_f64().unwrap_or(f64::NAN),
        rank_process_s,
        rank_peak_rss: line["peak_rss_bytes"].as_u64().unwrap_or(0),
        rank_anonymous: line["anonymous_bytes"].as_u64().unwrap_or(0),
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn counts_parse_in_either_notation_and_bad_ones_are_named() {
        assert_eq!(
            super::parse_counts("1e5, 2000,1e6").unwrap(),
            vec![100_000, 2000, 1_000_000]
        );
        let err = super::parse_counts("1e5,lots").unwrap_err().to_string();
        assert!(err.contains("`lots`"), "{err}");
        assert!(super::parse_counts("0.5").is_err());
    }
}
