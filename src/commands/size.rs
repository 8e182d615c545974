//! `zflow size`: a recipe's model sized per phase, and its cost projected on hardware.

use super::open;
use crate::RecipeArgs;
use anyhow::{Context, Result};
use std::process::ExitCode;
use std::time::Instant;
use zflow_runtime::model::config::ModelConfig;
use zflow_runtime::size::memory::RankSetup;
use zflow_runtime::size::projection::Hardware;

/// What `zflow size` is asked: overrides of the phases' own layout, hardware, output form.
pub struct SizeArgs<'a> {
    /// Data-parallel groups instead of each phase's.
    pub dp: Option<usize>,
    /// Sequences per micro-batch instead of each phase's.
    pub micro_batch: Option<usize>,
    /// The hardware to project onto and to check the memory against.
    pub hardware: Option<&'a str>,
    /// GPUs for the projection.
    pub gpus: Option<usize>,
    /// Print the memory per phase as JSON instead of the tables.
    pub json: bool,
}

pub fn size(args: &RecipeArgs, ask: SizeArgs<'_>) -> Result<ExitCode> {
    let engine = open(args)?;
    let doc = super::recipe_doc(&engine)?;
    let model = doc.model_or_default();
    let phases = phase_setups(&doc, ask.dp, ask.micro_batch);
    let hw = match ask.hardware {
        Some(name) => Some(hardware(name)?),
        None => None,
    };
    if ask.json {
        let phases: Vec<serde_json::Value> = phases
            .iter()
            .map(|(name, setup)| {
                let mut v = serde_json::to_value(model.engine_memory(setup))
                    .expect("plain numbers serialise");
                v["name"] = name.clone().into();
                v["setup"] = serde_json::to_value(setup).expect("plain numbers serialise");
                if let Some(hw) = &hw {
                    v["hardware_bytes"] = hw.memory_bytes.into();
                }
                v
            })
            .collect();
        println!("{}", serde_json::json!({ "phases": phases }));
        return Ok(ExitCode::SUCCESS);
    }
    for (i, (phase, setup)) in phases.iter().enumerate() {
        if i > 0 {
            println!();
        }
        println!(
            "== {} phase {phase}: seq_len {}, {} data-parallel x {} context-parallel ranks, micro-batch {}",
            engine.recipe.name,
            setup.seq_len,
            setup.data_parallel,
            setup.context_parallel,
            setup.micro_batch
        );
        print!("{}", model.report(setup));
        if let Some(hw) = &hw {
            println!("  {}", fit_line(&model, setup, hw));
        }
    }
    if let Some(hw) = hw {
        project(&doc, &model, hw, ask.gpus)?;
    }
    Ok(ExitCode::SUCCESS)
}

/// Every phase's name and rank setup (ZAYA1's 4K context on one rank without phases), with
/// `zflow size`'s overrides applied.
fn phase_setups(
    doc: &zflow_stages::recipe::RecipeDoc,
    dp: Option<usize>,
    micro_batch: Option<usize>,
) -> Vec<(String, RankSetup)> {
    let mut phases: Vec<(String, RankSetup)> = doc
        .phases
        .iter()
        .map(|p| (p.name.clone(), p.train.rank_setup(p.phase.seq_len)))
        .collect();
    if phases.is_empty() {
        let train = zflow_stages::recipe::train::parse(None)
            .and_then(|t| t.resolve("", None))
            .expect("the default settings parse");
        phases.push(("(no phases)".into(), train.rank_setup(4096)));
    }
    for (_, setup) in &mut phases {
        if let Some(dp) = dp {
            setup.data_parallel = dp;
        }
        if let Some(mb) = micro_batch {
            setup.micro_batch = mb;
        }
    }
    phases
}

/// Whether a phase fits the hardware's memory, with the headroom.
fn fit_line(model: &ModelConfig, setup: &RankSetup, hw: &Hardware) -> String {
    let peak = model.engine_memory(setup).peak_bytes_per_rank;
    let gb = |b: u64| b as f64 / 1e9;
    if peak <= hw.memory_bytes {
        format!(
            "fits {}: {:.1} GB of {:.1} GB per rank, headroom {:.1} GB ({:.0}%)",
            hw.name,
            gb(peak),
            gb(hw.memory_bytes),
            gb(hw.memory_bytes - peak),
            100.0 * (hw.memory_bytes - peak) as f64 / hw.memory_bytes as f64
        )
    } else {
        format!(
            "DOES NOT FIT {}: {:.1} GB per rank, {:.1} GB over its {:.1} GB",
            hw.name,
            gb(peak),
            gb(peak - hw.memory_bytes),
            gb(hw.memory_bytes)
        )
    }
}

/// Refuses the recipe (`recipe`, for the message) if a phase's predicted peak per rank
/// exceeds the memory of hardware `name`: `zflow plan --hardware`.
pub fn check_fits(
    doc: &zflow_stages::recipe::RecipeDoc,
    recipe: &std::path::Path,
    name: &str,
) -> Result<()> {
    let hw = hardware(name)?;
    let model = doc.model_or_default();
    let mut over = Vec::new();
    for (phase, setup) in phase_setups(doc, None, None) {
        let m = model.engine_memory(&setup);
        if m.peak_bytes_per_rank > hw.memory_bytes {
            over.push(format!(
                "  phases.{phase}: {:.1} GB per rank, over {}'s {:.1} GB by {:.1} GB (activations {:.1} GB at activation_checkpointing {}, {} tokens per rank)",
                m.peak_bytes_per_rank as f64 / 1e9,
                hw.name,
                hw.memory_bytes as f64 / 1e9,
                (m.peak_bytes_per_rank - hw.memory_bytes) as f64 / 1e9,
                m.activations as f64 / 1e9,
                format!("{:?}", setup.activation_checkpointing).to_lowercase(),
                setup.tokens_per_rank(),
            ));
        }
    }
    anyhow::ensure!(
        over.is_empty(),
        "{}: the predicted memory does not fit {}:\n{}\n`zflow size {} --hardware {name}` shows every term; `train.activation_checkpointing`, `train.launch.context_parallel` or a smaller `train.micro_batch` lower it",
        recipe.display(),
        hw.name,
        over.join("\n"),
        recipe.display()
    );
    Ok(())
}

/// A named hardware profile, or this machine measured now.
fn hardware(name: &str) -> Result<Hardware> {
    match name {
        "this" => measure_this_machine(),
        _ => Hardware::named(name)
            .with_context(|| format!("--hardware {name}: expected mi300x, h200 or this")),
    }
}

/// The cost projection part of `zflow size --hardware`: every phase's step time, tokens/s,
/// GPU-hours and days on the named hardware (or this machine, measured now).
fn project(
    doc: &zflow_stages::recipe::RecipeDoc,
    model: &ModelConfig,
    hw: Hardware,
    gpus: Option<usize>,
) -> Result<()> {
    use zflow_runtime::size::projection::{self, Assumptions};
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
fn measure_this_machine() -> Result<Hardware> {
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
    Ok(Hardware {
        name: "this machine".into(),
        bf16_tflops: gflops / 1e3,
        hbm_gbps: membw,
        link_gbps: link,
        memory_bytes: memory_total()?,
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

/// This machine's RAM (`MemTotal` of /proc/meminfo), bytes.
fn memory_total() -> Result<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").context("reading /proc/meminfo")?;
    info.lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map(|kib| kib * 1024)
        .context("/proc/meminfo has no MemTotal")
}
