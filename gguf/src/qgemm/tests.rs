use super::*;
use candle_core::{Device, Tensor};

#[test]
fn f16_decodes_exactly() {
    let cases = [
        (0x3C00, 1.0),
        (0xC000, -2.0),
        (0x7BFF, 65504.0),
        (0x0001, 5.960_464_5e-8),
        (0x8400, -6.103_515_6e-5),
        (0x3555, 0.333_251_95),
        (0, 0.0),
    ];
    for (h, v) in cases {
        assert_eq!(f16_at(&u16::to_le_bytes(h), 0), v, "{h:#06x}");
    }
    assert!(f16_at(&u16::to_le_bytes(0xFC00), 0) == f32::NEG_INFINITY);
}

fn check(dtype: GgmlDType, n: usize, k: usize, m: usize) {
    let dev = Device::Cpu;
    let w = Tensor::randn(0f32, 1.0, (n, k), &dev).unwrap();
    let qt = QTensor::quantize(&w, dtype).unwrap();
    let qm = QMatrix::from_qtensor(&qt).unwrap().unwrap();
    let deq: Vec<f32> = qt
        .dequantize(&dev)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1()
        .unwrap();
    let mine = qm.dequantize();
    // Equal values for the formats without mins (scale * w is exact in f32); Q4_K's
    // `d * (sc * q) - dmin * m` may round differently from ggml's `(d * sc) * q - dmin * m`.
    for i in 0..deq.len() {
        let tol = if dtype == GgmlDType::Q4K {
            1e-6 * deq[i].abs().max(1.0)
        } else {
            0.0
        };
        assert!(
            (mine[i] - deq[i]).abs() <= tol,
            "{dtype:?}: unpacked blocks differ from ggml's values at {i}: {} vs {}",
            mine[i],
            deq[i]
        );
    }
    let x: Vec<f32> = Tensor::randn(0f32, 1.0, (m, k), &dev)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1()
        .unwrap();
    let xa = QActs::quantize(&x, m, k);
    let fast = qm.matmul(&xa).unwrap();
    // The scalar path gives the same bits.
    let mut slow = vec![0f32; m * n];
    for r in 0..m {
        for c in 0..n {
            slow[r * n + c] = qm.dot_scalar(&xa, r, c);
        }
    }
    assert_eq!(fast, slow, "{dtype:?}: AVX2 and scalar kernels differ");
    // And close to the f32 product (activations are rounded to 16 bits).
    for r in 0..m {
        for c in 0..n {
            let exact: f64 = (0..k)
                .map(|j| x[r * k + j] as f64 * deq[c * k + j] as f64)
                .sum();
            let tol = 1e-3 * (k as f64).sqrt();
            assert!(
                (fast[r * n + c] as f64 - exact).abs() < tol,
                "{dtype:?} [{r},{c}]: {} vs {exact}",
                fast[r * n + c]
            );
        }
    }
    // A row's result does not depend on the other rows of the batch.
    let one = qm.matmul(&QActs::quantize(&x[k..2 * k], 1, k)).unwrap();
    assert_eq!(one, fast[n..2 * n]);
}

#[test]
fn kernels_match_dequantized_weights_and_each_other() {
    for dtype in [
        GgmlDType::Q8_0,
        GgmlDType::Q5_0,
        GgmlDType::Q4K,
        GgmlDType::Q6K,
    ] {
        check(dtype, 13, 512, 7);
    }
}
