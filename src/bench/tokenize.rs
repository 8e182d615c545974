//! `zflow bench tokenize`: zflow's tokenize path (read Parquet + encode + write Megatron
//! .bin/.idx) against the Python `tokenizers` package's `encode_batch` (encode only), on the
//! same documents with the same tokenizer.json, in one run.

use std::collections::BTreeSet;
use std::io::Write;
use std::process::{Command, ExitCode};
use std::time::Instant;

use anyhow::{Context, Result, bail};
use zflow_pipeline::StageState;
use zflow_stages::tokenize::{TokenizeConfig, tokenize_documents};

use crate::RecipeArgs;
use zflow_stages::names;

/// The Python side: reads the documents (untimed), times `encode_batch`, prints JSON.
const PYTHON: &str = r#"
import json, sys, time
from tokenizers import Tokenizer
texts = [json.loads(line) for line in open(sys.argv[2], encoding="utf-8")]
best = float("inf")
for _ in range(int(sys.argv[3])):
    # A fresh tokenizer each time: its BPE word cache starts cold, as zflow's does.
    tok = Tokenizer.from_file(sys.argv[1])
    t0 = time.perf_counter()
    enc = tok.encode_batch(texts, add_special_tokens=False)
    best = min(best, time.perf_counter() - t0)
import tokenizers
from array import array
ids = array("I")
for e in enc:
    ids.append(len(e.ids))
    ids.extend(e.ids)
open(sys.argv[4], "wb").write(ids.tobytes())
print(json.dumps({"seconds": best, "tokens": sum(len(e.ids) for e in enc), "version": tokenizers.__version__}))
"#;

/// Runs per side; the best is reported.
const REPEAT: usize = 3;

/// Pinned version of the Python package installed for the comparison when missing.
const PY_TOKENIZERS: &str = "tokenizers==0.23.2";

pub fn run(args: &RecipeArgs, source: &str) -> Result<ExitCode> {
    let engine = crate::commands::open(args)?;
    let states = engine.plan(&BTreeSet::new())?;
    let done = |name: &str| -> Result<std::path::PathBuf> {
        let i = engine
            .graph
            .position(name)
            .with_context(|| format!("the recipe has no stage `{name}`"))?;
        match &states[i] {
            StageState::Cached { manifest } => Ok(engine.output_dir(name, &manifest.identity)),
            _ => bail!(
                "`{name}` is not complete; run `zflow run {} --until {name}` first",
                args.recipe.display()
            ),
        }
    };
    let documents = done(&names::ingest(source))?.join("documents.parquet");
    let tok_dir = done("tokenizer")?;
    let scratch = tempfile_dir()?;
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);

    // Export the texts for Python (not timed on either side).
    let jsonl = scratch.join("docs.jsonl");
    let mut f = std::io::BufWriter::new(std::fs::File::create(&jsonl)?);
    let mut bytes = 0u64;
    for batch in zflow_stages::docs::stream(&documents, 4096)? {
        for text in batch? {
            bytes += text.len() as u64;
            writeln!(f, "{}", serde_json::Value::String(text))?;
        }
    }
    f.flush()?;
    drop(f);

    let config = TokenizeConfig {
        prepend_bos: false,
        batch_docs: 2048,
        holdout_every: 0,
        skip: None,
    };
    // Best of `REPEAT` on both sides: this machine's timings wander by 20-30% run to run.
    let mut zflow_s = f64::INFINITY;
    let mut stats = None;
    for _ in 0..REPEAT {
        let t = Instant::now();
        stats = Some(tokenize_documents(
            &documents,
            &tok_dir,
            &scratch.join("tokens"),
            &config,
            &[],
            cores,
            &|_| Ok(()),
        )?);
        zflow_s = zflow_s.min(t.elapsed().as_secs_f64());
    }
    let stats = stats.expect("REPEAT > 0");

    let mut python = python_with_tokenizers(&scratch)?;
    let out = python
        .arg("-c")
        .arg(PYTHON)
        .arg(tok_dir.join("tokenizer.json"))
        .arg(&jsonl)
        .arg(REPEAT.to_string())
        .arg(scratch.join("python-ids.bin"))
        .env("TOKENIZERS_PARALLELISM", "true")
        .output()
        .context("running python3")?;
    if !out.status.success() {
        bail!(
            "the Python side failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let py: serde_json::Value =
        serde_json::from_slice(&out.stdout).context("reading the Python side's result")?;
    let py_s = py["seconds"].as_f64().unwrap_or(f64::NAN);
    let py_tokens = py["tokens"].as_u64().unwrap_or(0);

    let mb = bytes as f64 / 1e6;
    println!(
        "tokenize `{source}`: {} documents, {mb:.1} MB, {cores} cores, best of {REPEAT}",
        stats.documents
    );
    println!("| path | what is timed | seconds | MB/s | tokens/s |");
    println!("|---|---|---:|---:|---:|");
    println!(
        "| zflow | read Parquet + encode + write .bin/.idx | {zflow_s:.2} | {:.2} | {:.0} |",
        mb / zflow_s,
        stats.tokens as f64 / zflow_s
    );
    println!(
        "| Python tokenizers {} encode_batch | encode only | {py_s:.2} | {:.2} | {:.0} |",
        py["version"].as_str().unwrap_or("?"),
        mb / py_s,
        py_tokens as f64 / py_s
    );
    println!("zflow / Python throughput: {:.2}x", py_s / zflow_s);
    // Same tokenizer, same documents: the same ids, document by document (zflow adds an EOD).
    let same = same_ids(&scratch.join("tokens"), &scratch.join("python-ids.bin"))?;
    println!(
        "ids: {}",
        if same {
            "identical to Python's, document by document".to_string()
        } else {
            format!(
                "DIFFERENT from Python's (zflow {} tokens incl. {} EOD, Python {py_tokens})",
                stats.tokens, stats.documents
            )
        }
    );
    let _ = std::fs::remove_dir_all(&scratch);
    Ok(ExitCode::SUCCESS)
}

/// `python3`, with the `tokenizers` package importable (installed into a scratch folder, pinned,
/// when the system does not have it).
fn python_with_tokenizers(scratch: &std::path::Path) -> Result<Command> {
    let has = Command::new("python3")
        .args(["-c", "import tokenizers"])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    let mut cmd = Command::new("python3");
    if !has {
        let target = scratch.join("py");
        eprintln!(
            "installing {PY_TOKENIZERS} for the comparison into {}",
            target.display()
        );
        let status = Command::new("python3")
            .args(["-m", "pip", "install", "--quiet", "--target"])
            .arg(&target)
            .arg(PY_TOKENIZERS)
            .status()
            .context("running pip")?;
        if !status.success() {
            bail!("pip install {PY_TOKENIZERS} failed");
        }
        cmd.env("PYTHONPATH", &target);
    }
    Ok(cmd)
}

/// Whether the dataset at `prefix` (each document's ids and an EOD) holds the ids the Python
/// side wrote to `python` (each document's length, then its ids; u32 little-endian).
fn same_ids(prefix: &std::path::Path, python: &std::path::Path) -> Result<bool> {
    use zflow_runtime::data::TokenSource;
    let ds = zflow_runtime::data::megatron::IndexedDataset::open(prefix)?;
    let bytes = std::fs::read(python)?;
    let words: Vec<u32> = bytes
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes(c.try_into().expect("4 bytes")))
        .collect();
    let (mut at, mut doc) = (0usize, vec![]);
    for d in 0..ds.num_docs() {
        let Some(&len) = words.get(at) else {
            return Ok(false);
        };
        let len = len as usize;
        doc.resize(ds.doc_len(d), 0);
        ds.read(d, 0, &mut doc)?;
        if doc.len() != len + 1 || words.get(at + 1..at + 1 + len) != Some(&doc[..len]) {
            return Ok(false);
        }
        at += 1 + len;
    }
    Ok(at == words.len())
}

fn tempfile_dir() -> Result<std::path::PathBuf> {
    let d = std::env::temp_dir().join(format!("zflow-bench-tok-{}", std::process::id()));
    std::fs::create_dir_all(&d)?;
    Ok(d)
}
