//! `zflow bench gemm` and `zflow bench membw`: the hardware numbers a run's size and cost
//! projection rest on, measured here, as tables, Parquet and plots (PNG + SVG).

use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Result;
use arrow::array::{ArrayRef, Float64Array, StringArray, UInt64Array};
use arrow::datatypes::{DataType, Field};
use zflow_runtime::bench::micro::{self, Stream};

use zflow_stages::plot::{LineChart, Scale, Series};

use crate::RecipeArgs;

/// GEMM throughput over the recipe model's shapes for `tokens` tokens, and the same shapes
/// off alignment; writes `out/gemm.parquet`.
pub fn gemm(args: &RecipeArgs, tokens: usize, out: &Path) -> Result<ExitCode> {
    let engine = crate::commands::open(args)?;
    let model = crate::commands::recipe_doc(&engine)?.model_or_default();
    let shapes = micro::model_shapes(&model, tokens);
    let sweep = micro::dimension_sweep(tokens, model.hidden_size, 64, 8);
    let all: Vec<_> = shapes.iter().chain(&sweep).cloned().collect();
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let device = format!("cpu ({threads} threads)");
    let mut gflops = micro::gemm_sweep(&all, 3);
    let swept = gflops.split_off(shapes.len());
    println!("GEMM on {device}, f32, {tokens} tokens, best of 3:");
    println!(
        "{:<34} {:>7} {:>7} {:>7} {:>10} {:>12}",
        "shape", "m", "n", "k", "GFLOP/s", "vs aligned"
    );
    for (i, (s, g)) in shapes.iter().zip(&gflops).enumerate() {
        let versus = if i % 2 == 1 {
            format!("{:+.0}%", 100.0 * (g / gflops[i - 1] - 1.0))
        } else {
            String::new()
        };
        println!(
            "{:<34} {:>7} {:>7} {:>7} {:>10.1} {:>12}",
            s.name, s.m, s.n, s.k, g, versus
        );
    }
    println!(
        "\nSweep of d around hidden = {}: [{tokens}, d] x [d, d]",
        model.hidden_size
    );
    for (s, g) in sweep.iter().zip(&swept) {
        let mark = if s.n % 128 == 0 {
            "  (x128)"
        } else if s.n % 64 == 0 {
            "  (x64)"
        } else {
            ""
        };
        println!("  d = {:>6} {:>10.1} GFLOP/s{mark}", s.n, g);
    }
    std::fs::create_dir_all(out)?;
    let points: Vec<(f64, f64)> = sweep
        .iter()
        .zip(&swept)
        .map(|(s, &g)| (s.n as f64, g))
        .collect();
    let chart = LineChart {
        title: format!("GEMM [{tokens}, d] x [d, d] on {device}, f32"),
        x_label: "d".into(),
        y_label: "GFLOP/s".into(),
        series: vec![
            Series::line("every 8", points.clone()),
            Series {
                marks_only: true,
                ..Series::line(
                    "multiples of 64",
                    points
                        .into_iter()
                        .filter(|p| (p.0 as usize).is_multiple_of(64))
                        .collect(),
                )
            },
        ],
        ..Default::default()
    };
    let [png, svg] = chart.write(&out.join("gemm-sweep"))?;
    let (shapes, gflops) = (all, gflops.into_iter().chain(swept).collect::<Vec<_>>());
    let path = out.join("gemm.parquet");
    zflow_stages::util::write_parquet(
        &path,
        vec![
            Field::new("device", DataType::Utf8, false),
            Field::new("shape", DataType::Utf8, false),
            Field::new("m", DataType::UInt64, false),
            Field::new("n", DataType::UInt64, false),
            Field::new("k", DataType::UInt64, false),
            Field::new("gflops", DataType::Float64, false),
        ],
        vec![
            Arc::new(StringArray::from(vec![device.as_str(); shapes.len()])) as ArrayRef,
            Arc::new(StringArray::from_iter_values(
                shapes.iter().map(|s| s.name.as_str()),
            )),
            Arc::new(UInt64Array::from_iter_values(
                shapes.iter().map(|s| s.m as u64),
            )),
            Arc::new(UInt64Array::from_iter_values(
                shapes.iter().map(|s| s.n as u64),
            )),
            Arc::new(UInt64Array::from_iter_values(
                shapes.iter().map(|s| s.k as u64),
            )),
            Arc::new(Float64Array::from(gflops)),
        ],
    )?;
    println!("\n{}\n{} {}", path.display(), png.display(), svg.display());
    Ok(ExitCode::SUCCESS)
}

/// STREAM copy/scale/add/triad on one thread and on all, over `mib` MiB per array; writes
/// `out/membw.parquet`.
pub fn membw(mib: usize, out: &Path) -> Result<ExitCode> {
    let len = mib * (1 << 20) / 8;
    let all = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    let mut rows = Vec::new();
    println!("STREAM, f64 arrays of {mib} MiB, best of 5, GB/s:");
    println!(
        "{:<8} {:>10} {:>10}",
        "kernel",
        "1 thread",
        format!("{all} threads")
    );
    for kernel in Stream::ALL {
        let one = micro::stream_gbps(kernel, len, 1, 5);
        let many = micro::stream_gbps(kernel, len, all, 5);
        println!(
            "{:<8} {:>10.1} {:>10.1}",
            format!("{kernel:?}").to_lowercase(),
            one,
            many
        );
        rows.push((kernel, 1u64, one));
        rows.push((kernel, all as u64, many));
    }
    // Bandwidth over array size on all threads: the caches show as a plateau above DRAM's.
    let sizes: Vec<usize> = (0..)
        .map(|i| 1usize << (i + 2))
        .take_while(|&m| m <= mib.max(4))
        .collect();
    let series = Stream::ALL
        .iter()
        .map(|&kernel| {
            let points = sizes
                .iter()
                .map(|&m| {
                    (
                        (m << 20) as f64,
                        micro::stream_gbps(kernel, m * (1 << 20) / 8, all, 5),
                    )
                })
                .collect();
            Series::line(format!("{kernel:?}").to_lowercase(), points)
        })
        .collect();
    std::fs::create_dir_all(out)?;
    let chart = LineChart {
        title: format!("STREAM bandwidth, {all} threads"),
        x_label: "array size (bytes)".into(),
        y_label: "GB/s".into(),
        x_scale: Scale::Log2,
        series,
        ..Default::default()
    };
    let [png, svg] = chart.write(&out.join("membw"))?;
    let path = out.join("membw.parquet");
    zflow_stages::util::write_parquet(
        &path,
        vec![
            Field::new("kernel", DataType::Utf8, false),
            Field::new("threads", DataType::UInt64, false),
            Field::new("gbps", DataType::Float64, false),
        ],
        vec![
            Arc::new(StringArray::from_iter_values(
                rows.iter().map(|r| format!("{:?}", r.0).to_lowercase()),
            )) as ArrayRef,
            Arc::new(UInt64Array::from_iter_values(rows.iter().map(|r| r.1))),
            Arc::new(Float64Array::from_iter_values(rows.iter().map(|r| r.2))),
        ],
    )?;
    println!("\n{}\n{} {}", path.display(), png.display(), svg.display());
    Ok(ExitCode::SUCCESS)
}
