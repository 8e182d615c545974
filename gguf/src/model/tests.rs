use super::*;

#[test]
fn exp_and_gelu_are_accurate() {
    let mut worst = 0f64;
    for i in -87_000..88_000 {
        let x = i as f32 / 1000.0;
        let (got, want) = (exp(x) as f64, (x as f64).exp());
        worst = worst.max((got - want).abs() / want);
    }
    assert!(worst < 5e-7, "exp: relative error {worst}");
    assert_eq!(exp(-100.0), 0.0);
    assert_eq!(exp(f32::NEG_INFINITY), 0.0);
    for i in -20_000..20_000 {
        let x = i as f32 / 1000.0;
        let xd = x as f64;
        let want = 0.5
            * xd
            * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (xd + 0.044715 * xd * xd * xd)).tanh());
        assert!(
            (gelu_tanh(x) as f64 - want).abs() < 1e-6 * want.abs().max(1e-3),
            "gelu({x}) = {} vs {want}",
            gelu_tanh(x)
        );
    }
}

#[test]
fn q5_0_converts_to_q8_0_exactly() {
    use candle_core::quantized::{GgmlDType, QTensor};
    let x = candle_core::Tensor::randn(0f32, 1.0, (8, 64), &candle_core::Device::Cpu).unwrap();
    let q5 = QTensor::quantize(&x, GgmlDType::Q5_0).unwrap();
    let q8 = q5_0_to_q8_0(&q5).unwrap();
    assert_eq!(q8.dtype(), GgmlDType::Q8_0);
    let a: Vec<f32> = q5
        .dequantize(&candle_core::Device::Cpu)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1()
        .unwrap();
    let b: Vec<f32> = q8
        .dequantize(&candle_core::Device::Cpu)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1()
        .unwrap();
    assert_eq!(a, b);
}
