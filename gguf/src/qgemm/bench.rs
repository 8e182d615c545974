use super::*;
use candle_core::{Device, Tensor};

/// CPU seconds this process has used (all threads), from /proc: load-independent timing.
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap();
    let f: Vec<&str> = stat
        .rsplit(')')
        .next()
        .unwrap()
        .split_whitespace()
        .collect();
    (f[11].parse::<f64>().unwrap() + f[12].parse::<f64>().unwrap()) / 100.0
}

fn rate(macs: f64, mut f: impl FnMut()) -> (f64, f64) {
    let (c0, t0) = (cpu_seconds(), std::time::Instant::now());
    let mut reps = 0;
    while cpu_seconds() - c0 < 2.0 {
        f();
        reps += 1;
    }
    let total = macs * reps as f64 / 1e9;
    (
        total / (cpu_seconds() - c0),
        total / t0.elapsed().as_secs_f64(),
    )
}

/// `RAYON_NUM_THREADS=1 cargo test -p zflow-gguf --lib qgemm::bench -- --ignored
/// --nocapture`: GMAC per CPU second (and per wall second) of the kernels on shapes of
/// Gemma 3 270M, against candle's f32 GEMM on the dequantized weights.
#[test]
#[ignore]
fn kernel_throughput() {
    let dev = Device::Cpu;
    let only = std::env::var("QGEMM_BENCH").ok();
    for (dtype, n, k, m) in [
        (GgmlDType::Q5_0, 2048, 640, 512),
        (GgmlDType::Q8_0, 8192, 640, 256),
        (GgmlDType::Q6K, 640, 2048, 512),
        (GgmlDType::Q4K, 640, 1024, 512),
    ] {
        if only
            .as_ref()
            .is_some_and(|o| !format!("{dtype:?}").contains(o.as_str()))
        {
            continue;
        }
        let w = Tensor::randn(0f32, 1.0, (n, k), &dev).unwrap();
        let qt = QTensor::quantize(&w, dtype).unwrap();
        let qm = QMatrix::from_qtensor(&qt).unwrap().unwrap();
        let x: Vec<f32> = Tensor::randn(0f32, 1.0, (m, k), &dev)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        let xa = QActs::quantize(&x, m, k);
        let macs = (n * k * m) as f64;
        let (q_cpu, q_wall) = rate(macs, || drop(std::hint::black_box(qm.matmul(&xa).unwrap())));
        let xt = Tensor::from_vec(x.clone(), (m, k), &dev).unwrap();
        let wd = qt.dequantize(&dev).unwrap();
        let (f32_cpu, _) = rate(macs, || {
            drop(std::hint::black_box(xt.matmul(&wd.t().unwrap()).unwrap()))
        });
        eprintln!(
            "{dtype:?} {m}x{k} @ {n}x{k}^T: int16 kernel {q_cpu:.1} GMAC/cpu-s ({q_wall:.1} wall), candle f32 {f32_cpu:.1}"
        );
    }
}
