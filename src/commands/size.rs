//! `zflow size`: a recipe's model sized per phase, and its cost projected on hardware.

use super::open;
use crate::RecipeArgs;
use anyhow::{Context, Result};
use std::process::ExitCode;
use std::time::Instant;

pub fn size(
    args: &RecipeArgs,
    dp: usize,
    micro_batch: usize,
    hardware: Option<&str>,
    gpus: Option<usize>,
) -> Result<ExitCode> {
    let engine = open(args)?;
    let doc = super::recipe_doc(&engine)?;
    let model = doc.model_or_default();
    // One report per phase (sequence length differs); without phases, ZAYA1's 4K context.
    let mut phases: Vec<(String, usize)> = doc
        .phases
        .iter()
        .map(|p| (p.name.clone(), p.phase.seq_len))
        .collect();
    if phases.is_empty() {
        phases.push(("(no phases)".into(), 4096));
    }
    for (i, (phase, seq_len)) in phases.iter().enumerate() {
        if i > 0 {
            println!();
        }
        println!(
            "== {} phase {phase}: seq_len {seq_len}, dp {dp}, micro-batch {micro_batch}",
            engine.recipe.name
        );
        print!("{}", model.report(*seq_len, micro_batch, dp));
    }
    if let Some(name) = hardware {
        project(&doc, &model, name, gpus)?;
    }
    Ok(ExitCode::SUCCESS)
}

/// The cost projection part of `zflow size --hardware`: every phase's step time, tokens/s,
/// GPU-hours and days on the named hardware (or this machine, measured now).
fn project(
    doc: &zflow_stages::recipe::RecipeDoc,
    model: &zflow_runtime::model::config::ModelConfig,
    name: &str,
    gpus: Option<usize>,
) -> Result<()> {
    use zflow_runtime::size::projection::{self, Assumptions, Hardware};
    let hw = match name {
        "this" => measure_this_machine()?,
        _ => Hardware::named(name)
            .with_context(|| format!("--hardware {name}: expected mi300x, h200 or this"))?,
    };
    let a = Assumptions::default();
    println!("
== cost projection on {} ({}): bf16 {:.1} TFLOP/s x {:.0}% for GEMMs, memory {:.0} GB/s, link {:.1} GB/s bus bandwidth", hw.name, hw.source, hw.bf16_tflops, 100.0 * a.gemm_efficiency, hw.hbm_gbps, hw.link_gbps);
    println!(
        "   step = max(compute, memory) + exchange (no overlap assumed); see runtime/src/size/projection.rs"
    );
    if doc.phases.is_empty() {
        println!("   (the recipe has no phases)");
        return Ok(());
    }
    println!(
        "{:<10} {:>6} {:>7} {:>9} {:>9} {:>9} {:>9} {:>12} {:>6} {:>12} {:>8}",
        "phase",
        "gpus",
        "seq",
        "compute",
        "memory",
        "exchange",
        "step s",
        "tokens/s",
        "MFU",
        "GPU-hours",
        "days"
    );
    let (mut total_gpu_hours, mut total_days) = (0.0, 0.0);
    for entry in &doc.phases {
        let (phase, train, launch) = (&entry.name, &entry.train.settings, &entry.train.launch);
        let (seq_len, tokens) = (entry.phase.seq_len, entry.phase.tokens as f64);
        let n = gpus.unwrap_or(launch.world());
        let s = projection::step(
            model,
            seq_len,
            train.global_batch,
            train.micro_batch,
            n,
            &hw,
            &a,
        );
        let (_, _, gpu_hours, days) = projection::phase(&s, tokens, n);
        total_gpu_hours += gpu_hours;
        total_days += days;
        println!(
            "{phase:<10} {n:>6} {seq_len:>7} {:>9.3} {:>9.3} {:>9.3} {:>9.3} {:>12.0} {:>5.0}% {:>12.2} {:>8.2}",
            s.compute_s,
            s.memory_s,
            s.comm_s,
            s.step_s,
            s.tokens_per_s,
            100.0 * s.mfu,
            gpu_hours,
            days
        );
        if hw.name == "MI300X" && seq_len == 4096 && train.global_batch == 4096 {
            println!(
                "{:<10} ZAYA1 report: ~2.5 s per step at 4096 x 4096 tokens on 1024 MI300X; projected {:.2} s on {n}: ratio {:.2}",
                "",
                s.step_s,
                s.step_s / 2.5
            );
        }
    }
    println!(
        "{:<10} {:>89.2} {:>8.2}",
        "all phases", total_gpu_hours, total_days
    );
    Ok(())
}

/// This machine as a [`Hardware`]: the f32 matmul peak of its cores (as the "bf16"
/// throughput, with the efficiency applied on top), STREAM triad, and the bandwidth of one TCP
/// stream over loopback (what two ranks on this machine would exchange gradients over).
fn measure_this_machine() -> Result<zflow_runtime::size::projection::Hardware> {
    let gflops = zflow_runtime::bench::matmul_gflops(1024, 3);
    let threads = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    let membw = zflow_runtime::bench::micro::stream_gbps(
        zflow_runtime::bench::micro::Stream::Triad,
        8 << 20,
        threads,
        3,
    );
    let link = loopback_gbps(64 << 20)?;
    Ok(zflow_runtime::size::projection::Hardware {
        name: "this machine".into(),
        bf16_tflops: gflops / 1e3,
        hbm_gbps: membw,
        link_gbps: link,
        source: format!(
            "measured now: matmul {gflops:.1} GFLOP/s f32, STREAM triad {membw:.1} GB/s, loopback TCP {link:.2} GB/s"
        ),
    })
}

/// GB/s of `bytes` sent over one loopback TCP connection to a reading thread (best of 3).
fn loopback_gbps(bytes: usize) -> Result<f64> {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    let addr = listener.local_addr()?;
    let reader = std::thread::spawn(move || -> std::io::Result<()> {
        let (mut conn, _) = listener.accept()?;
        let mut buf = vec![0u8; 1 << 20];
        while conn.read(&mut buf)? > 0 {}
        Ok(())
    });
    let mut conn = std::net::TcpStream::connect(addr)?;
    let chunk = vec![1u8; 1 << 20];
    let mut best = f64::MAX;
    for _ in 0..3 {
        let t = Instant::now();
        for _ in 0..bytes / chunk.len() {
            conn.write_all(&chunk)?;
        }
        conn.flush()?;
        best = best.min(t.elapsed().as_secs_f64());
    }
    drop(conn);
    reader
        .join()
        .map_err(|_| anyhow::anyhow!("the reading thread panicked"))??;
    Ok(bytes as f64 / best / 1e9)
}
