//! The Rust side of the scoring benchmark against llama.cpp (`evals/bench/llama_cpp_score.py`).
//!
//! ```text
//! # token-level requests of some tasks, as the harness would send them:
//! cargo run -p zflow-evals --example bench_gguf -- dump --model M.gguf --data DIR \
//!     --tasks piqa,arc_easy --limit 200 --out reqs.jsonl
//! # score them and print tokens/s (input tokens: context + continuation - 1 per request):
//! cargo run -p zflow-evals --example bench_gguf -- score --model M.gguf --requests reqs.jsonl \
//!     [--out scores.jsonl]
//! python3 evals/bench/llama_cpp_score.py --model M.gguf --requests reqs.jsonl --compare scores.jsonl
//! ```

use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use serde_json::json;
use zflow_evals::engine::{packed_len, plan_batches, truncate};
use zflow_evals::gguf::GgufModel;
use zflow_evals::request::{PreparedTask, Request};
use zflow_evals::{LanguageModel, TaskRegistry, TokenRequest};

#[derive(Parser)]
struct Args {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Writes the tokenized loglikelihood requests of tasks, one document per line.
    Dump {
        #[arg(long)]
        model: PathBuf,
        #[arg(long)]
        tokenizer: Option<PathBuf>,
        #[arg(long)]
        data: PathBuf,
        #[arg(long, value_delimiter = ',', required = true)]
        tasks: Vec<String>,
        #[arg(long)]
        limit: Option<usize>,
        #[arg(long)]
        out: PathBuf,
    },
    /// Scores a requests file and prints throughput.
    Score {
        #[arg(long)]
        model: PathBuf,
        #[arg(long)]
        tokenizer: Option<PathBuf>,
        #[arg(long)]
        requests: PathBuf,
        #[arg(long, default_value_t = 2048)]
        batch_tokens: usize,
        #[arg(long)]
        out: Option<PathBuf>,
    },
}

fn load(model: &Path, tokenizer: &Option<PathBuf>) -> Result<GgufModel> {
    let tok = tokenizer.clone().or_else(|| {
        Some(model.with_file_name("tokenizer-gemma3/tokenizer.json")).filter(|p| p.exists())
    });
    GgufModel::load(model, None, Some(4096))
        .or_else(|_| GgufModel::load(model, tok.as_deref(), Some(4096)))
}

fn main() -> Result<()> {
    match Args::parse().cmd {
        Cmd::Dump {
            model,
            tokenizer,
            data,
            tasks,
            limit,
            out,
        } => {
            let m = load(&model, &tokenizer)?;
            let reg = TaskRegistry::load_dir(&zflow_evals::task::builtin_tasks_dir())?;
            let mut f = std::io::BufWriter::new(std::fs::File::create(&out)?);
            let mut group = 0;
            for name in &tasks {
                for t in reg.tasks_of(name)? {
                    let p = PreparedTask::prepare(&reg.tasks[&t], &data, None)?;
                    for inst in p.instances(limit)? {
                        let mut reqs = Vec::new();
                        for r in &inst.requests {
                            if let Request::Loglikelihood {
                                context,
                                continuation,
                            } = r
                            {
                                let tr = truncate(
                                    m.tokenizer().encode_pair(context, continuation)?,
                                    m.max_length(),
                                );
                                reqs.push(
                                    json!({"context": tr.context, "continuation": tr.continuation}),
                                );
                            }
                        }
                        if !reqs.is_empty() {
                            writeln!(
                                f,
                                "{}",
                                json!({"group": group, "task": t, "doc": inst.doc_index, "requests": reqs})
                            )?;
                            group += 1;
                        }
                    }
                }
            }
            eprintln!("{group} groups written to {}", out.display());
        }
        Cmd::Score {
            model,
            tokenizer,
            requests,
            batch_tokens,
            out,
        } => {
            let mut m = load(&model, &tokenizer)?;
            let mut ids = Vec::new();
            let mut groups: Vec<Vec<TokenRequest>> = Vec::new();
            let file = std::fs::File::open(&requests)
                .with_context(|| format!("opening {}", requests.display()))?;
            for line in std::io::BufReader::new(file).lines() {
                let v: serde_json::Value = serde_json::from_str(&line?)?;
                let ids_of = |x: &serde_json::Value| -> Vec<u32> {
                    x.as_array()
                        .unwrap()
                        .iter()
                        .map(|t| t.as_u64().unwrap() as u32)
                        .collect()
                };
                ids.push(v["group"].as_u64().context("group")?);
                groups.push(
                    v["requests"]
                        .as_array()
                        .context("requests")?
                        .iter()
                        .map(|r| TokenRequest {
                            context: ids_of(&r["context"]),
                            continuation: ids_of(&r["continuation"]),
                        })
                        .collect(),
                );
            }
            let input: usize = groups.iter().flatten().map(TokenRequest::input_len).sum();
            let packed: usize = groups.iter().map(|g| packed_len(g)).sum();
            // Warm up on the smallest group (first calls allocate), then time everything.
            let smallest = groups
                .iter()
                .min_by_key(|g| packed_len(g))
                .cloned()
                .into_iter()
                .collect::<Vec<_>>();
            m.loglikelihood(&smallest)?;
            let mut scores = vec![Vec::new(); groups.len()];
            let cpu0 = cpu_seconds();
            let t0 = Instant::now();
            for batch in plan_batches(&groups, batch_tokens) {
                let b: Vec<Vec<TokenRequest>> = batch.iter().map(|&g| groups[g].clone()).collect();
                for (&g, s) in batch.iter().zip(m.loglikelihood(&b)?) {
                    scores[g] = s;
                }
            }
            let dt = t0.elapsed().as_secs_f64();
            let cpu = cpu_seconds() - cpu0;
            let n: usize = groups.iter().map(Vec::len).sum();
            println!(
                "zflow-evals GGUF adapter ({} threads): {n} requests, {input} input tokens ({packed} packed) in {dt:.2} s: {:.1} input tokens/s; {cpu:.1} CPU s: {:.1} input tokens per CPU s",
                candle_core::utils::get_num_threads(),
                input as f64 / dt,
                input as f64 / cpu
            );
            if let Some(out) = out {
                let mut f = std::io::BufWriter::new(std::fs::File::create(&out)?);
                for (g, s) in ids.iter().zip(&scores) {
                    for (i, sc) in s.iter().enumerate() {
                        writeln!(
                            f,
                            "{}",
                            json!({"group": g, "index": i, "logprob": sc.logprob, "is_greedy": sc.is_greedy})
                        )?;
                    }
                }
            }
        }
    }
    Ok(())
}

/// CPU seconds (user + system, all threads) this process has used, from /proc (0 elsewhere): a
/// measure of work that the other load on a shared machine does not inflate the way it
/// inflates wall time.
fn cpu_seconds() -> f64 {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return 0.0;
    };
    let f: Vec<&str> = stat
        .rsplit(')')
        .next()
        .unwrap_or("")
        .split_whitespace()
        .collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    // utime and stime, in clock ticks (100 a second on Linux).
    (ticks(11) + ticks(12)) / 100.0
}
