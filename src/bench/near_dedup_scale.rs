//! `zflow bench data-scale`'s near-dedup column: the sharded MinHash pipeline on a text corpus
//! of N documents. It writes the corpus (one document a line, ~12 words, every 50th a near
//! copy of the one 25 before it), runs a recipe of it (4 ingest shards, `near_dedup`, 4
//! `dedup_keys` tasks and the join) through this binary, and reports the run's wall time. Then
//! it runs each dedup task again the way a Slurm job runs it (`zflow exec-stage`, its own
//! process, on the run's ingest outputs) and reads the task's peak RSS from its log: the
//! largest is the figure that must not grow with N.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, Result, bail};

/// Shards of the corpus, and key-range tasks of its dedup.
pub const SHARDS: usize = 4;
/// What each dedup task declares, in MiB.
pub const MEMORY_MIB: u64 = 256;
/// Bytes on disk per document, corpus and ingest outputs together (text, Parquet, 14 band
/// records, a 112-value signature, a text hash), rounded up.
const BYTES_PER_DOC: u64 = 1_600;

/// What the near-dedup pipeline cost on N documents.
pub struct NearDedupFigures {
    /// `zflow run` of the whole recipe (fetch, ingest, dedup tasks, join), seconds.
    pub run_s: f64,
    /// The dedup tasks and the join, one after another, each its own process, seconds.
    pub dedup_s: f64,
    /// Near duplicates dropped.
    pub dropped: u64,
    /// The largest peak RSS of a dedup task or the join, bytes, and which.
    pub largest_task: (String, u64),
}

/// Whether `n` documents' corpus and outputs fit the free space of `dir`'s filesystem, with
/// a quarter to spare; `Err` says what they need.
pub fn fits(n: u64, dir: &Path) -> Result<(), String> {
    let need = n * BYTES_PER_DOC;
    let free = free_bytes(dir).unwrap_or(0);
    if need + need / 4 > free {
        return Err(format!(
            "not measured: needs ~{:.0} GB of disk, {:.0} GB free",
            need as f64 / 1e9,
            free as f64 / 1e9
        ));
    }
    Ok(())
}

fn free_bytes(dir: &Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
    let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: a NUL-terminated path and a pointer to a local struct.
    (unsafe { libc::statvfs(path.as_ptr(), &mut s) } == 0).then(|| s.f_bavail * s.f_frsize)
}

/// Measures the pipeline on `n` documents in `dir`.
pub fn measure(n: u64, dir: &Path) -> Result<NearDedupFigures> {
    use std::io::Write;
    let corpus = dir.join("corpus");
    std::fs::create_dir_all(&corpus)?;
    let mut rng = zflow_runtime::rng::SplitMix64(n);
    let per_file = n.div_ceil(SHARDS as u64);
    let mut recent: std::collections::VecDeque<Vec<u64>> = Default::default();
    for f in 0..SHARDS as u64 {
        let file = std::fs::File::create(corpus.join(format!("part-{f}.txt")))?;
        let mut w = std::io::BufWriter::new(file);
        for d in f * per_file..((f + 1) * per_file).min(n) {
            let words: Vec<u64> = if d % 50 == 49 && recent.len() >= 25 {
                let mut copy = recent[recent.len() - 25].clone();
                copy[11] = rng.next_u64() % 1_000_000;
                copy
            } else {
                (0..12).map(|_| rng.next_u64() % 1_000_000).collect()
            };
            let line: Vec<String> = words.iter().map(|x| format!("w{x}")).collect();
            writeln!(w, "{}", line.join(" "))?;
            recent.push_back(words);
            if recent.len() > 25 {
                recent.pop_front();
            }
        }
        w.flush()?;
    }
    let recipe = format!(
        "name: bench-near-dedup\nsources:\n  corpus:\n    url: \"corpus/*.txt\"\n    format: text\n    split_regex: \"\\n\"\n    min_chars: 10\n    dedup: false\n    near_dedup: {{}}\n    shards: {SHARDS}\n    dedup_tasks: {{count: {SHARDS}, memory_gb: {}}}\n",
        MEMORY_MIB as f64 / 1024.0
    );
    std::fs::write(dir.join("recipe.yaml"), recipe)?;
    let exe = std::env::current_exe()?;
    let start = Instant::now();
    let out = Command::new(&exe)
        .args(["run", "recipe.yaml", "--quiet"])
        .current_dir(dir)
        .output()
        .context("running the near-dedup recipe")?;
    let run_s = start.elapsed().as_secs_f64();
    if !out.status.success() {
        bail!(
            "the near-dedup recipe failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let store = dir.join("zflow-store");
    let ingests: Vec<(String, PathBuf)> = (0..SHARDS)
        .map(|s| {
            let stage = format!("ingest.corpus.s{s}");
            stage_dir(&store, &stage).map(|d| (stage, d))
        })
        .collect::<Result<_>>()?;
    let dedup = serde_json::json!({
        "sources": [{"name": "corpus", "shards": SHARDS}],
        "exact": false, "near": true, "jaccard": zflow_stages::minhash::NearDedup::default().jaccard,
        "tasks": SHARDS, "memory_gb": MEMORY_MIB as f64 / 1024.0,
    });
    let again = dir.join("again");
    let mut peaks = Vec::new();
    let dedup_start = Instant::now();
    let mut join_inputs = ingests.clone();
    for t in 0..SHARDS {
        let stage = format!("dedup_keys.corpus.k{t}");
        let config = serde_json::json!({"dedup": dedup, "task": t});
        peaks.push((
            stage.clone(),
            exec(&exe, &again, &stage, "dedup_keys", config, &ingests)?,
        ));
        join_inputs.push((stage.clone(), again.join(&stage)));
    }
    peaks.push((
        "dedup.corpus".into(),
        exec(&exe, &again, "dedup.corpus", "dedup", dedup, &join_inputs)?,
    ));
    let dedup_s = dedup_start.elapsed().as_secs_f64();
    let stats: serde_json::Value =
        serde_json::from_slice(&std::fs::read(again.join("dedup.corpus/stats.json"))?)?;
    let dropped = stats
        .as_array()
        .into_iter()
        .flatten()
        .filter(|r| r["rule"] == "dropped:near_duplicate")
        .filter_map(|r| r["documents"].as_u64())
        .sum();
    let largest_task = peaks
        .into_iter()
        .max_by_key(|(_, p)| *p)
        .expect("five tasks");
    Ok(NearDedupFigures {
        run_s,
        dedup_s,
        dropped,
        largest_task,
    })
}

/// The complete output folder of `stage` in `store`.
fn stage_dir(store: &Path, stage: &str) -> Result<PathBuf> {
    for entry in std::fs::read_dir(store)? {
        let path = entry?.path();
        let name = path.file_name().unwrap_or_default().to_string_lossy();
        if name
            .strip_prefix(stage)
            .and_then(|rest| rest.strip_prefix('-'))
            .is_some_and(|h| h.len() == 12 && !h.contains('.'))
        {
            return Ok(path);
        }
    }
    bail!("no output of {stage} in {}", store.display())
}

/// Runs `stage` as a Slurm job runs it (`zflow exec-stage`), into `<root>/<stage>`; returns
/// its peak RSS in bytes, from its log.
fn exec(
    exe: &Path,
    root: &Path,
    stage: &str,
    kind: &str,
    config: serde_json::Value,
    inputs: &[(String, PathBuf)],
) -> Result<u64> {
    let out = root.join(stage);
    std::fs::create_dir_all(&out)?;
    let log = root.join(format!("{stage}.log"));
    let spec = serde_json::json!({
        "stage": stage,
        "kind": kind,
        "config": config,
        "needs": inputs.iter().map(|(n, _)| n.clone()).collect::<Vec<_>>(),
        "inputs": inputs.iter().cloned().collect::<std::collections::BTreeMap<_, _>>(),
        "out_dir": out,
        "cwd": root,
        "cache_dir": root.join("cache"),
        "threads": 1,
        "memory_gb": MEMORY_MIB as f64 / 1024.0,
        "log": log,
    });
    let spec_path = root.join(format!("{stage}.spec.json"));
    std::fs::write(&spec_path, spec.to_string())?;
    let done = Command::new(exe)
        .arg("exec-stage")
        .arg(&spec_path)
        .output()?;
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    if !done.status.success() {
        bail!("{stage} failed: {text}");
    }
    text.lines()
        .find_map(|l| l.split("=== peak RSS ").nth(1))
        .and_then(|rest| rest.split(' ').next())
        .and_then(|mib| mib.parse::<u64>().ok())
        .map(|mib| mib << 20)
        .with_context(|| format!("no peak RSS in {}", log.display()))
}
