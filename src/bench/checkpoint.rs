//! `zflow bench checkpoint`: checkpoint I/O of a recipe's model through the torch engine's own
//! code (`zflow_torch.bench checkpoint`), against `dd` writing the same number of bytes to the
//! same disk in the same run, and the cost of checkpointing on the step time, written in the
//! background (as training does) and inline.

use std::path::Path;
use std::process::{Command, ExitCode};
use std::time::Instant;

use anyhow::{Context, Result, ensure};

use super::median;
use crate::RecipeArgs;

/// What the step-time part of the benchmark runs.
pub struct Shape {
    /// Training steps per mode and round.
    pub steps: u64,
    /// Rounds, each running every mode once.
    pub rounds: usize,
    /// A checkpoint every this many steps.
    pub every: u64,
    /// Sequences per step (default: the phase's micro-batch).
    pub batch: Option<usize>,
    /// Tokens per sequence (default: the phase's).
    pub seq_len: Option<usize>,
}

/// Runs the benchmark in `dir` (default: a temp folder next to the store) with `phase`'s
/// training settings (default: the recipe's first phase's); prints a table.
pub fn run(
    args: &RecipeArgs,
    dir: Option<&Path>,
    phase: Option<&str>,
    shape: Shape,
) -> Result<ExitCode> {
    let Shape {
        steps,
        rounds,
        every,
        batch,
        seq_len,
    } = shape;
    let engine = crate::commands::open(args)?;
    let target = crate::bench::train::recipe_phase(args, phase)?;
    let (batch, seq_len) = target.shape(batch, seq_len);
    let parent = dir
        .map(Path::to_path_buf)
        .unwrap_or_else(|| engine.store.root().to_path_buf());
    std::fs::create_dir_all(&parent)?;
    let tmp = tempfile::tempdir_in(&parent)
        .with_context(|| format!("a scratch folder in {}", parent.display()))?;
    target.print(&format!(
        "{} parameters, batch {batch} x {seq_len} tokens, scratch folder {}",
        target.model.params().total,
        tmp.path().display()
    ));
    let t = crate::bench::train::torch_engine_bench(
        "checkpoint",
        target.config(serde_json::json!({"batch": batch, "seq_len": seq_len, "steps": steps, "rounds": rounds, "every": every, "dir": tmp.path().join("torch")})),
    )?;
    let f = |k: &str| t[k].as_f64().unwrap_or(f64::NAN);
    let (mb, write_s) = (f("bytes") / 1e6, f("write_s"));
    let dd_s = dd(&tmp.path().join("dd.bin"), f("bytes") as u64, 3)?;
    println!();
    println!(
        "{:<48} {:>10} {:>10} {:>10}",
        "write + fsync, best of 3", "MB", "s", "MB/s"
    );
    println!(
        "{:<48} {:>10.1} {:>10.3} {:>10.0}",
        "zflow checkpoint (files, blake3, manifest, rename)",
        mb,
        write_s,
        mb / write_s
    );
    println!(
        "{:<48} {:>10.1} {:>10.3} {:>10.0}",
        "dd bs=1M conv=fsync (same bytes)",
        mb,
        dd_s,
        mb / dd_s
    );
    println!(
        "zflow / dd: {:.0}%   (snapshot into host memory: {:.3} s)",
        100.0 * dd_s / write_s,
        f("snapshot_s")
    );
    println!();
    println!(
        "step time over {steps} steps of {batch} x {seq_len} tokens, a checkpoint every {every} steps"
    );
    println!(
        "(median of {rounds} rounds, each mode once per round from the same state; the rounds' range)"
    );
    let labels = [
        "no checkpoints",
        "background writer (as training)",
        "synchronous (inline)",
    ];
    let rounds = ["plain", "background", "inline"].map(|m| {
        t[format!("{m}_rounds_s")]
            .as_array()
            .map(|a| a.iter().filter_map(|v| v.as_f64()).collect())
            .unwrap_or_default()
    });
    print_modes("", &rounds, &labels);
    Ok(ExitCode::SUCCESS)
}

/// One line per mode: the median of its rounds' mean step times, their range, and the median's
/// change against the first mode's (no checkpoints).
fn print_modes(prefix: &str, rounds: &[Vec<f64>; 3], labels: &[&str; 3]) {
    let medians = rounds.each_ref().map(|r| median(r));
    for (i, label) in labels.iter().enumerate() {
        let (lo, hi) = rounds[i]
            .iter()
            .fold((f64::MAX, f64::MIN), |(lo, hi), &v| (lo.min(v), hi.max(v)));
        let change = if i == 0 {
            String::new()
        } else {
            format!("  ({:+.1}%)", 100.0 * (medians[i] / medians[0] - 1.0))
        };
        println!(
            "{:<56} {:>8.3} s  [{lo:.3}-{hi:.3}]{change}",
            format!("{prefix}{label}"),
            medians[i]
        );
    }
}

/// Best time of `repeats` runs of `dd` writing `bytes` to `path` with an fsync at the end.
fn dd(path: &Path, bytes: u64, repeats: usize) -> Result<f64> {
    let count = bytes.div_ceil(1 << 20);
    let mut best = f64::MAX;
    for _ in 0..repeats {
        let t = Instant::now();
        let out = Command::new("dd")
            .arg("if=/dev/zero")
            .arg(format!("of={}", path.display()))
            .args(["bs=1M", &format!("count={count}"), "conv=fsync"])
            .output()
            .context("running dd")?;
        ensure!(
            out.status.success(),
            "dd failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        best = best.min(t.elapsed().as_secs_f64() * bytes as f64 / (count << 20) as f64);
        std::fs::remove_file(path)?;
    }
    Ok(best)
}
