//! `zflow bench collectives`: all-reduce, reduce-scatter, all-gather and broadcast of the
//! trainer's ring between real worker processes (this binary, started once per rank), over
//! message sizes and rank counts; a table, `collectives.parquet` for `zflow query`, and a
//! bus-bandwidth plot per operation (`busbw-<op>.png/.svg`, a line per rank count).

use std::path::Path;
use std::process::{Command, ExitCode, Stdio};
use std::sync::Arc;

use anyhow::{Context, Result, bail, ensure};
use arrow::array::{ArrayRef, Float64Array, StringArray, UInt64Array};
use arrow::datatypes::{DataType, Field};
use zflow_runtime::bench::collectives::{self, Op, Point};
use zflow_runtime::dist::collective::{Group, Placement};
use zflow_stages::plot::{LineChart, Scale, Series};

/// Measures every rank count in `ranks` up to `max_bytes` per message; writes
/// `out/collectives.parquet`.
pub fn run(ranks: &[usize], max_bytes: u64, out: &Path) -> Result<ExitCode> {
    ensure!(
        !ranks.is_empty() && ranks.iter().all(|&n| n >= 2),
        "--ranks: give rank counts of at least 2, e.g. 2,4"
    );
    let exe = std::env::current_exe()?;
    let mut points: Vec<Point> = Vec::new();
    for &n in ranks {
        eprintln!("{n} ranks ...");
        let children = Placement::local(n)?
            .into_iter()
            .map(|p| {
                Command::new(&exe)
                    .args([
                        "bench",
                        "collective-rank",
                        "--max-bytes",
                        &max_bytes.to_string(),
                    ])
                    .envs(p.to_env())
                    .stdout(Stdio::piped())
                    .stderr(Stdio::inherit())
                    .spawn()
                    .context("starting a rank")
            })
            .collect::<Result<Vec<_>>>()?;
        for (rank, child) in children.into_iter().enumerate() {
            let o = child.wait_with_output()?;
            if !o.status.success() {
                bail!("rank {rank} of {n} failed ({})", o.status);
            }
            if rank == 0 {
                for line in String::from_utf8_lossy(&o.stdout).lines() {
                    points.push(
                        serde_json::from_str(line)
                            .with_context(|| format!("a rank's output: {line}"))?,
                    );
                }
            }
        }
    }
    print_table(&points, ranks);
    std::fs::create_dir_all(out)?;
    let path = out.join("collectives.parquet");
    write(&path, &points)?;
    println!("\n{} points in {}", points.len(), path.display());
    for op in Op::ALL {
        let chart = LineChart {
            title: format!("{}: bus bandwidth (nccl-tests definition)", op.name()),
            x_label: "message size (bytes)".into(),
            y_label: "bus bandwidth (GB/s)".into(),
            x_scale: Scale::Log2,
            series: ranks
                .iter()
                .map(|&n| {
                    Series::line(
                        format!("{n} ranks"),
                        points
                            .iter()
                            .filter(|p| p.op == op && p.ranks == n)
                            .map(|p| (p.bytes as f64, p.busbw_gbps()))
                            .collect(),
                    )
                })
                .collect(),
            ..Default::default()
        };
        let [png, svg] = chart.write(&out.join(format!("busbw-{}", op.name())))?;
        println!("{} {}", png.display(), svg.display());
    }
    Ok(ExitCode::SUCCESS)
}

/// One rank of the benchmark (started by [`run`], placed by the environment).
pub fn rank(max_bytes: u64) -> Result<ExitCode> {
    let placement = Placement::from_env()?
        .context("collective-rank is started by `zflow bench collectives`")?;
    let mut group = Group::join(&placement)?;
    let points = collectives::measure(&mut group, max_bytes)?;
    if group.rank == 0 {
        for p in points {
            println!("{}", serde_json::to_string(&p)?);
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn print_table(points: &[Point], ranks: &[usize]) {
    for op in Op::ALL {
        println!("\n{}: time (us), algbw and busbw (GB/s)", op.name());
        let mut head = format!("{:>12}", "bytes");
        for n in ranks {
            head.push_str(&format!(
                " | {:>10} {:>7} {:>7}",
                format!("{n} ranks"),
                "algbw",
                "busbw"
            ));
        }
        println!("{head}");
        for bytes in collectives::sizes(points.iter().map(|p| p.bytes).max().unwrap_or(1024)) {
            let mut line = format!("{bytes:>12}");
            for &n in ranks {
                match points
                    .iter()
                    .find(|p| p.op == op && p.ranks == n && p.bytes == bytes)
                {
                    Some(p) => line.push_str(&format!(
                        " | {:>10.1} {:>7.2} {:>7.2}",
                        p.time_s * 1e6,
                        p.algbw_gbps(),
                        p.busbw_gbps()
                    )),
                    None => line.push_str(&format!(" | {:>26}", "")),
                }
            }
            println!("{line}");
        }
    }
}

fn write(path: &Path, points: &[Point]) -> Result<()> {
    let cols: Vec<ArrayRef> = vec![
        Arc::new(StringArray::from_iter_values(
            points.iter().map(|p| p.op.name()),
        )),
        Arc::new(UInt64Array::from_iter_values(
            points.iter().map(|p| p.ranks as u64),
        )),
        Arc::new(UInt64Array::from_iter_values(
            points.iter().map(|p| p.bytes),
        )),
        Arc::new(Float64Array::from_iter_values(
            points.iter().map(|p| p.time_s),
        )),
        Arc::new(Float64Array::from_iter_values(
            points.iter().map(|p| p.algbw_gbps()),
        )),
        Arc::new(Float64Array::from_iter_values(
            points.iter().map(|p| p.busbw_gbps()),
        )),
    ];
    let fields = vec![
        Field::new("op", DataType::Utf8, false),
        Field::new("ranks", DataType::UInt64, false),
        Field::new("bytes", DataType::UInt64, false),
        Field::new("time_s", DataType::Float64, false),
        Field::new("algbw_gbps", DataType::Float64, false),
        Field::new("busbw_gbps", DataType::Float64, false),
    ];
    zflow_stages::util::write_parquet(path, fields, cols)
}
