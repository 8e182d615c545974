//! A dedup's tasks stay within the memory they declare on records many times that size: four
//! ingest shards' sorted runs of band keys and text hashes (synthetic, 8 x the declared
//! memory), deduplicated by four `dedup_keys` tasks and the join, each run the way a Slurm job
//! runs it (`zflow exec-stage`, its own process) and reporting its peak RSS in its log. The
//! planted duplicates are the ones found.

mod common;

use std::io::Write;
use std::path::{Path, PathBuf};

use common::Sandbox;
use zflow_runtime::rng::SplitMix64;

const SHARDS: usize = 4;
const TASKS: usize = 4;
/// What each task declares: what its process holds before the stage runs (~50 MiB for a
/// debug build) and the stage's own buffers.
const MEMORY_MIB: u64 = 80;
/// Band records per shard: 4 shards x 32 bytes each = 8 x the declared memory.
const RECORDS: u64 = 2 * (MEMORY_MIB << 20) / 32;
/// Records per run, as an ingest would spill them.
const RUN: u64 = 1 << 19;
/// Documents per shard.
const DOCS: u64 = 1 << 16;

/// Writes run `k` of `dir` holding `records` (key prefix, doc), which must be sorted:
/// `[key (16 bytes), doc, bytes]` each.
fn write_run(dir: &Path, k: usize, records: impl Iterator<Item = (u64, u64)>) {
    std::fs::create_dir_all(dir).unwrap();
    let file = std::fs::File::create(dir.join(format!("{k}.bin"))).unwrap();
    let mut w = std::io::BufWriter::new(file);
    for (key, doc) in records {
        w.write_all(&key.to_be_bytes()).unwrap();
        w.write_all(&[0; 8]).unwrap();
        w.write_all(&doc.to_le_bytes()).unwrap();
        w.write_all(&(100 + doc % 7).to_le_bytes()).unwrap();
    }
    w.flush().unwrap();
}

/// `n` records with random keys in ascending order (random gaps over the key space) and random
/// documents.
fn ascending(rng: &mut SplitMix64, n: u64) -> impl Iterator<Item = (u64, u64)> + '_ {
    let mean_gap = u64::MAX / n;
    let mut key = 0u64;
    (0..n).map(move |_| {
        key += rng.next_u64() % mean_gap;
        (key, rng.next_u64() % DOCS)
    })
}

/// Shard `s`: runs of random band keys and text hashes, and a last run of each with the
/// planted duplicates: in each shard document `d` (d < 8) shares a band with and has the
/// signature of document `d + 8` of the shard before it (a near duplicate), and document 100
/// has the text of the shard before's document 101 (an exact one). Every signature is 2
/// values: its document's number, or its original's, and 7. Returns the planted (exact, near)
/// duplicates.
fn write_shard(dir: &Path, s: u64) -> (Vec<u64>, Vec<u64>) {
    let mut rng = SplitMix64(1000 + s);
    let planted_band = |orig: u64, d: u64| (orig << 32 | d).wrapping_mul(0x1000_0000_0001);
    let planted_text = |orig: u64| (orig + 1).wrapping_mul(0x0700_0000_0000_0003);
    let global = |shard: u64, d: u64| shard * DOCS + d;
    let runs = RECORDS.div_ceil(RUN);
    for k in 0..runs {
        let n = RUN.min(RECORDS - k * RUN);
        write_run(&dir.join("bands"), k as usize, ascending(&mut rng, n));
    }
    write_run(&dir.join("hashes"), 0, ascending(&mut rng, DOCS));
    let mut signatures: Vec<[u64; 2]> = (0..DOCS).map(|d| [global(s, d), 7]).collect();
    let (mut bands, mut hashes) = (Vec::new(), vec![(planted_text(s), 101)]);
    let (mut near, mut exact) = (Vec::new(), Vec::new());
    for d in 0..8 {
        bands.push((planted_band(s, d + 8), d + 8));
        if s > 0 {
            bands.push((planted_band(s - 1, d + 8), d));
            signatures[d as usize] = [global(s - 1, d + 8), 7];
            near.push(d);
        }
    }
    if s > 0 {
        hashes.push((planted_text(s - 1), 100));
        exact.push(100);
    }
    bands.sort();
    hashes.sort();
    write_run(&dir.join("bands"), runs as usize, bands.into_iter());
    write_run(&dir.join("hashes"), 1, hashes.into_iter());
    let sig: Vec<u8> = signatures
        .iter()
        .flat_map(|v| v.iter().flat_map(|x| x.to_le_bytes()))
        .collect();
    std::fs::write(dir.join("signatures.bin"), sig).unwrap();
    let bytes: u64 = (0..DOCS).map(|d| 100 + d % 7).sum();
    std::fs::write(
        dir.join("stats.json"),
        format!(
            r#"{{"docs_in": {DOCS}, "bytes_in": {bytes}, "docs_out": {DOCS}, "bytes_out": {bytes}, "dropped": []}}"#
        ),
    )
    .unwrap();
    (exact, near)
}

/// Runs one stage as a Slurm job would (`zflow exec-stage`); returns its log.
fn exec(
    sb: &Sandbox,
    stage: &str,
    kind: &str,
    config: serde_json::Value,
    inputs: &[(String, PathBuf)],
) -> String {
    let out = sb.path().join("out").join(stage);
    std::fs::create_dir_all(&out).unwrap();
    let log = sb.path().join(format!("{stage}.log"));
    let spec = serde_json::json!({
        "stage": stage,
        "kind": kind,
        "config": config,
        "needs": inputs.iter().map(|(n, _)| n.clone()).collect::<Vec<_>>(),
        "inputs": inputs.iter().map(|(n, p)| (n.clone(), p.clone())).collect::<std::collections::BTreeMap<_, _>>(),
        "out_dir": out,
        "cwd": sb.path(),
        "cache_dir": sb.path().join("cache"),
        "threads": 1,
        "memory_gb": MEMORY_MIB as f64 / 1024.0,
        "log": log,
    });
    let spec_path = sb.write(&format!("{stage}.spec.json"), &spec.to_string());
    let done = sb
        .cmd(&["exec-stage", spec_path.to_str().unwrap()])
        .output()
        .unwrap();
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(
        done.status.success(),
        "{stage}: {}\n{text}",
        String::from_utf8_lossy(&done.stderr)
    );
    text
}

/// The peak RSS a stage's log reports, in MiB.
fn peak_mib(log: &str) -> u64 {
    if let Some(line) = log.lines().find(|l| l.contains("=== peak RSS")) {
        eprintln!("{line}");
    }
    log.lines()
        .find_map(|l| l.split("=== peak RSS ").nth(1))
        .and_then(|rest| rest.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no peak RSS in the log:\n{log}"))
}

#[test]
fn dedup_tasks_stay_within_their_declared_memory_on_records_eight_times_its_size() {
    let sb = Sandbox::new();
    let mut inputs = Vec::new();
    let mut want = Vec::new();
    for s in 0..SHARDS {
        let dir = sb.path().join(format!("ingest{s}"));
        want.push(write_shard(&dir, s as u64));
        inputs.push((format!("ingest.web.s{s}"), dir));
    }
    let dedup = serde_json::json!({
        "sources": [{"name": "web", "shards": SHARDS}],
        "exact": true, "near": true, "jaccard": 0.7,
        "tasks": TASKS, "memory_gb": MEMORY_MIB as f64 / 1024.0,
    });
    let mut peaks = Vec::new();
    let mut join_inputs = inputs.clone();
    for t in 0..TASKS {
        let stage = format!("dedup_keys.web.k{t}");
        let log = exec(
            &sb,
            &stage,
            "dedup_keys",
            serde_json::json!({"dedup": dedup, "task": t}),
            &inputs,
        );
        peaks.push((stage.clone(), peak_mib(&log)));
        join_inputs.push((stage.clone(), sb.path().join("out").join(&stage)));
    }
    let log = exec(&sb, "dedup.web", "dedup", dedup, &join_inputs);
    peaks.push(("dedup.web".into(), peak_mib(&log)));
    eprintln!("peak RSS (MiB) against {MEMORY_MIB} MiB declared: {peaks:?}");
    for (stage, peak) in &peaks {
        assert!(
            *peak <= MEMORY_MIB,
            "{stage} peaked at {peak} MiB, over the {MEMORY_MIB} MiB it declared"
        );
    }
    for (s, (exact, near)) in want.iter().enumerate() {
        let mut all: Vec<u64> = exact.iter().chain(near).copied().collect();
        all.sort();
        let path = sb
            .path()
            .join("out/dedup.web/drops/web")
            .join(format!("{s}.bin"));
        let got: Vec<u64> = std::fs::read(&path)
            .unwrap()
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
            .collect();
        assert_eq!(got, all, "shard {s}'s drops");
    }
}
