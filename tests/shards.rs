//! Sharded sources through the real binary (`sources.<name>.shards`): a changed or added file
//! re-runs only the shard it lands in; exact dedup across shards keeps what one unsharded ingest
//! keeps; the mixture over a sharded and an unsharded source realises its shares within a
//! percentage point; outputs are byte-identical across `-j 1`, `-j 2` and the real local Slurm,
//! where the shard stages go out as job arrays.

mod common;

use std::collections::BTreeMap;
use std::path::Path;

use common::{Sandbox, stage_dir};
use zflow_stages::shard::Shard;

const SHARDS: usize = 4;

/// `n` pseudo-random words drawn from `seed`.
fn words(seed: u64, n: usize) -> Vec<String> {
    let mut x = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            format!("w{}", (x >> 33) % 100_000)
        })
        .collect()
}

/// A corpus of `files` text files of paragraphs, in `<sandbox>/corpus`. Every file has a long
/// paragraph of its own and repeats a boilerplate one; every third file repeats its
/// predecessor's first paragraph (exact duplicates, within a shard and across shards); every
/// fourth file has a near copy (one word changed) of the long paragraph of the file three
/// before it. Other paragraphs share no run of five words.
fn write_corpus(sb: &Sandbox, files: usize) {
    let long = |f: usize| words(1_000_000 + f as u64, 80);
    for f in 0..files {
        let mut paragraphs = Vec::new();
        let first = if f % 3 == 2 { f - 1 } else { f };
        paragraphs.push(format!(
            "File {first} opens with: {}",
            words(first as u64, 12).join(" ")
        ));
        for p in 0..12 {
            paragraphs.push(words(1000 * f as u64 + p + 7, 20).join(" "));
        }
        paragraphs.push(long(f).join(" "));
        if f % 4 == 3 {
            let mut copy = long(f - 3);
            copy[40] = "changed".into();
            paragraphs.push(copy.join(" "));
        }
        paragraphs.push(
            "This boilerplate paragraph closes every file of the corpus, word for word.".into(),
        );
        sb.write(
            &format!("corpus/doc-{f:03}.txt"),
            &(paragraphs.join("\n\n") + "\n"),
        );
    }
}

/// Data stages only: the corpus (sharded `shards` ways, or not), this repository's pipeline
/// sources as a second source, a trained tokenizer and one mixed phase.
fn recipe(shards: Option<usize>) -> String {
    let shards = shards.map_or(String::new(), |n| {
        format!("\n    shards: {n}\n    dedup_tasks: {{count: {n}}}")
    });
    format!(
        r#"
name: shards-test
sources:
  corpus:
    url: "corpus/*.txt"
    format: text
    split_regex: "\n\n+"
    min_chars: 20
    near_dedup: {{}}{shards}
  code:
    url: "{repo}/pipeline/src/*.rs"
    format: text
tokenizer:
  train: {{vocab_size: 512, sample_bytes_per_source: 100000}}
phases:
  p1:
    tokens: 40000
    seq_len: 64
    block_size: 64
    mixture: {{corpus: 0.3, code: 0.7}}
"#,
        repo = env!("CARGO_MANIFEST_DIR")
    )
}

fn json(path: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

fn sorted(mut v: Vec<String>) -> Vec<String> {
    v.sort();
    v
}

/// Every complete output of the store: stage name -> its content hash.
fn outputs(store: &Path) -> BTreeMap<String, String> {
    std::fs::read_dir(store)
        .unwrap()
        .flatten()
        .filter_map(|e| {
            let m = e.path().join(".zflow-manifest.json");
            m.exists().then(|| {
                let m = json(&m);
                (
                    m["stage"].as_str().unwrap().to_string(),
                    m["content_hash"].as_str().unwrap().to_string(),
                )
            })
        })
        .collect()
}

/// The first file (by name) of the corpus that is not in shard 0 (whose documents the tokenizer
/// trains on): changing it must leave the tokenizer, and so every other shard, alone.
fn file_outside_shard_zero(files: usize) -> (String, usize) {
    (0..files)
        .map(|f| format!("doc-{f:03}.txt"))
        .map(|name| {
            let shard = Shard::of(&name, SHARDS);
            (name, shard)
        })
        .find(|(_, s)| *s != 0)
        .unwrap()
}

#[test]
fn a_target_size_picks_the_shard_count_from_the_files() {
    let sb = Sandbox::new();
    write_corpus(&sb, 16);
    let total: u64 = common::entries_starting_with(&sb.path().join("corpus"), "doc-")
        .iter()
        .map(|p| std::fs::metadata(p).unwrap().len())
        .sum();
    // A third of the corpus (and a byte) per shard: 3 shards.
    let target = total / 3 + 1;
    sb.write(
        "r.yaml",
        &recipe(None).replace(
            "near_dedup: {}",
            &format!("near_dedup: {{}}\n    shards: {{target: {target}}}"),
        ),
    );
    let plan = sb.ok(&["plan", "r.yaml"]).stdout;
    assert!(
        plan.contains("ingest.corpus.s2") && !plan.contains("ingest.corpus.s3"),
        "{plan}"
    );
    // A file of half a target takes the corpus past three targets: a fourth shard.
    sb.write(
        "corpus/doc-999.txt",
        &"more words here\n\n".repeat(target as usize / 34 + 1),
    );
    let plan = sb.ok(&["plan", "r.yaml"]).stdout;
    assert!(
        plan.contains("ingest.corpus.s3") && !plan.contains("ingest.corpus.s4"),
        "{plan}"
    );
}

#[test]
fn a_changed_or_added_file_reruns_only_its_shard_and_dedup_across_shards_matches_one_ingest() {
    let files = 16;
    let sb = Sandbox::new();
    write_corpus(&sb, files);
    sb.write("r.yaml", &recipe(Some(SHARDS)));
    let plan = sb.ok(&["plan", "r.yaml"]).stdout;
    for i in 0..SHARDS {
        for stage in [
            format!("ingest.corpus.s{i}"),
            format!("tokenize.corpus.s{i}"),
        ] {
            assert!(
                plan.contains(&stage),
                "{stage} missing from the plan:\n{plan}"
            );
        }
    }
    assert!(plan.contains("dedup.corpus"), "{plan}");
    sb.ok(&["run", "r.yaml"]);
    let store = sb.path().join("zflow-store");

    // Dedup over the shards keeps exactly the documents the dedup of one unsharded ingest keeps,
    // and so it does when that ingest's records go to disk in runs of 16 (the boilerplate and
    // the repeated paragraphs then repeat in other runs, which only the merge finds), and its
    // dedup cuts the keys into 3 ranges where the sharded one has a task per shard.
    let whole = Sandbox::new();
    write_corpus(&whole, files);
    let small_runs = recipe(None).replace(
        "near_dedup: {}",
        "near_dedup: {}\n    dedup_run_records: 16\n    dedup_tasks: {count: 3}",
    );
    whole.write("r.yaml", &small_runs);
    whole.ok(&["run", "r.yaml", "--until", "dedup.corpus"]);
    let runs = std::fs::read_dir(whole.output("ingest.corpus").join("hashes"))
        .unwrap()
        .count();
    assert!(runs > 2, "{runs} runs of text hashes");
    let count_in = |dedup: &serde_json::Value, rule: &str| -> u64 {
        dedup
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| r["rule"] == rule)
            .map(|r| r["documents"].as_u64().unwrap())
            .sum()
    };
    let dedup = json(&sb.output("dedup.corpus").join("stats.json"));
    let unsharded = json(&whole.output("dedup.corpus").join("stats.json"));
    let count = |rule: &str| count_in(&dedup, rule);
    let (across, near) = (count("dropped:duplicate"), count("dropped:near_duplicate"));
    assert!(across > 0, "no duplicate across shards was found: {dedup}");
    assert!(
        count_in(&unsharded, "dropped:duplicate") > 0,
        "no duplicate across runs was found: {unsharded}"
    );
    // Every fourth file holds one near copy.
    assert_eq!(near, (files / 4) as u64, "{dedup}");
    assert_eq!(
        count_in(&unsharded, "dropped:near_duplicate"),
        near,
        "{unsharded}"
    );
    assert_eq!(
        count("kept"),
        count_in(&unsharded, "kept"),
        "sharded + dedup kept {} documents ({across} exact and {near} near duplicates dropped across shards), one ingest in runs {}",
        count("kept"),
        count_in(&unsharded, "kept")
    );
    let tokenized: u64 = (0..SHARDS)
        .map(|i| {
            let s = json(&stage_dir(&store, &format!("tokenize.corpus.s{i}")).join("stats.json"));
            s["documents"].as_u64().unwrap() + s["heldout_documents"].as_u64().unwrap()
        })
        .sum();
    assert_eq!(
        tokenized,
        count("kept"),
        "the tokenize shards left out the duplicates"
    );

    // The mixture reads the shards as one source: shares within 1 percentage point.
    common::assert_shares_within_a_point(&sb.output("mix.p1").join("report.json"));

    // A changed file re-runs its shard's ingest and tokenize stages (and the source's dedup and
    // the mixture over it), nothing else.
    let (name, shard) = file_outside_shard_zero(files);
    let path = format!("corpus/{name}");
    let mut text = sb.read(&path);
    text.push_str("\nA new closing paragraph, added to this file only, long enough to stay.\n");
    sb.write(&path, &text);
    let rerun = sb.ok(&["run", "r.yaml"]);
    let expected = |shard: usize| {
        let keys = (0..SHARDS).map(|k| format!("dedup_keys.corpus.k{k}"));
        sorted(
            [
                "fetch.corpus".into(),
                format!("ingest.corpus.s{shard}"),
                "dedup.corpus".into(),
                format!("tokenize.corpus.s{shard}"),
                "mix.p1".into(),
            ]
            .into_iter()
            .chain(keys)
            .collect(),
        )
    };
    assert_eq!(sorted(rerun.ran()), expected(shard), "{}", rerun.stderr);

    // A file only touched (new times, same bytes) re-runs the fetch, which finds the same
    // content, and nothing after it.
    std::fs::File::options()
        .write(true)
        .open(sb.path().join(&path))
        .unwrap()
        .set_modified(std::time::SystemTime::now() + std::time::Duration::from_secs(5))
        .unwrap();
    let touched = sb.ok(&["run", "r.yaml"]);
    assert_eq!(touched.ran(), vec!["fetch.corpus"], "{}", touched.stderr);

    // So does a new file, in the shard it lands in.
    let added = (files..files + 64)
        .map(|f| format!("doc-{f:03}.txt"))
        .find(|n| Shard::of(n, SHARDS) != 0)
        .unwrap();
    sb.write(
        &format!("corpus/{added}"),
        "A file added later, with a paragraph of its own that no other file has.\n",
    );
    let rerun = sb.ok(&["run", "r.yaml"]);
    assert_eq!(
        sorted(rerun.ran()),
        expected(Shard::of(&added, SHARDS)),
        "{}",
        rerun.stderr
    );
}

#[test]
fn sharded_outputs_are_byte_identical_across_jobs() {
    let runs: Vec<BTreeMap<String, String>> = ["1", "2"]
        .iter()
        .map(|jobs| {
            let sb = Sandbox::new();
            write_corpus(&sb, 12);
            sb.write("r.yaml", &recipe(Some(SHARDS)));
            sb.ok(&["run", "r.yaml", "-j", jobs]);
            outputs(&sb.path().join("zflow-store"))
        })
        .collect();
    assert!(runs[0].len() >= 2 * SHARDS + 5, "{:?}", runs[0]);
    assert_eq!(runs[0], runs[1], "-j 1 and -j 2 made different outputs");
}

#[test]
#[cfg_attr(
    not(zflow_slurm),
    ignore = "needs the local Slurm: scripts/test.sh starts it and sets SLURM_CONF"
)]
fn sharded_stages_run_as_slurm_job_arrays_and_end_as_the_local_run() {
    let conf = std::env::var_os("SLURM_CONF").expect("SLURM_CONF names the local Slurm");
    let local = Sandbox::new();
    write_corpus(&local, 12);
    local.write("r.yaml", &recipe(Some(SHARDS)));
    local.ok(&["run", "r.yaml"]);

    let sb = Sandbox::new();
    write_corpus(&sb, 12);
    sb.write(
        "r.yaml",
        &format!(
            "executor: {{kind: slurm, poll_s: 0.3}}\n{}",
            recipe(Some(SHARDS))
        ),
    );
    let out = sb
        .cmd(&["run", "r.yaml"])
        .env("SLURM_CONF", &conf)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    // The ingest shards became ready together (after fetch.corpus): one array, a task each.
    let tasks = stderr
        .lines()
        .filter(|l| l.contains("[ingest.corpus.s") && l.contains("submitted slurm job"))
        .count();
    let in_array = stderr.lines().any(|l| {
        l.contains("[ingest.corpus.s") && l.contains("submitted slurm job") && l.contains("_1 (")
    });
    assert!(
        tasks == SHARDS && in_array,
        "the ingest shards were not one job array:\n{stderr}"
    );
    // So were the dedup's key-range tasks, each declaring its memory.
    let keys: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("[dedup_keys.corpus.k") && l.contains("submitted slurm job"))
        .collect();
    assert!(
        keys.len() == SHARDS && keys.iter().any(|l| l.contains("_1 (")),
        "the dedup_keys tasks were not one job array:\n{stderr}"
    );
    assert_eq!(
        outputs(&sb.path().join("zflow-store")),
        outputs(&local.path().join("zflow-store")),
        "the Slurm run made other outputs than the local one"
    );
}

#[test]
fn cross_dedup_drops_a_later_sources_copies_of_an_earlier_sources_documents() {
    let sb = Sandbox::new();
    // Source `a`: four files of their own; `b`: two of its own, an exact copy of a's first
    // and a near copy (two words changed) of a's second.
    for f in 0..4 {
        sb.write(&format!("a/doc-{f}.txt"), &words(f, 120).join(" "));
    }
    for f in 0..2 {
        sb.write(&format!("b/own-{f}.txt"), &words(100 + f, 120).join(" "));
    }
    sb.write("b/copy.txt", &words(0, 120).join(" "));
    let mut near = words(1, 120);
    near[30] = "changed".into();
    near[90] = "also".into();
    sb.write("b/near.txt", &near.join(" "));
    let source = |name: &str| {
        format!(
            "  {name}:\n    url: \"{name}/*.txt\"\n    format: text\n    shards: 2\n    near_dedup: {{}}\n    cross_dedup: true\n"
        )
    };
    sb.write(
        "r.yaml",
        &format!("name: cross\nsources:\n{}{}", source("a"), source("b")),
    );
    sb.ok(&["run", "r.yaml", "--until", "dedup"]);
    let stats = json(&sb.output("dedup").join("stats.json"));
    let count = |source: &str, rule: &str| -> u64 {
        stats
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| r["source"] == source && r["rule"] == rule)
            .map(|r| r["documents"].as_u64().unwrap())
            .sum()
    };
    assert_eq!(count("a", "kept"), 4, "{stats}");
    assert_eq!(count("b", "dropped:duplicate"), 1, "{stats}");
    assert_eq!(count("b", "dropped:near_duplicate"), 1, "{stats}");
    assert_eq!(count("b", "kept"), 2, "{stats}");

    // Sources that disagree on the rules are refused at load, naming the line.
    sb.write(
        "bad.yaml",
        &format!(
            "name: cross\nsources:\n{}{}",
            source("a"),
            source("b").replace("    near_dedup: {}\n", "")
        ),
    );
    let out = sb.zflow(&["plan", "bad.yaml"]);
    assert_ne!(out.code, 0);
    // (The line of b's `cross_dedup`.)
    assert!(
        out.stderr.contains("bad.yaml:13:") && out.stderr.contains("share one rule"),
        "{}",
        out.stderr
    );
}
