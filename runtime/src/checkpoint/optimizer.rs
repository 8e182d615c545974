//! One parameter's optimizer state as both engines write it, so that a checkpoint of either
//! engine resumes in the other with its Muon and AdamW state.
//!
//! A record (one entry of an `optim-*.rank-R.bin` shard, see [`crate::dist::zero`]) is
//! [`RECORD`] followed by a safetensors file of f32 tensors in the checkpoint's weight layout
//! (`model.safetensors`: zflow's names and shapes, linear weights `[in, out]`). Its keys:
//!
//! | optimizer | key | meaning |
//! |---|---|---|
//! | Muon | `velocity` | burn's momentum (the native engine): `v <- mu * v + g` |
//! | Muon | `momentum_buffer` | torch's (`torch.optim.Muon`): `b <- mu * b + (1 - mu) * g` |
//! | AdamW | `step` | steps taken (a 0-d tensor), for the bias correction |
//! | AdamW | `exp_avg`, `exp_avg_sq` | the first and second moments (the same in both engines) |
//!
//! Both Muon conventions give the same update (`b = (1 - mu) * v`, and Newton-Schulz
//! normalises the scale away), but rescaling is not exact in floating point. So each engine
//! writes its own key, resumes its own checkpoints bit for bit, and converts the other's with
//! [`velocity_from_buffer`] / its Python twin (`zflow_torch.checkpoint`), at the resuming run's
//! momentum.
//!
//! Older checkpoints hold records this module reads as [`Record::Burn`] (the native engine's
//! burn MessagePack records) or [`Record::State`] with `torch_layout` set ([`LEGACY_TORCH`]:
//! the torch engine's records before this format, in torch's layout: linear weights
//! `[out, in]`).

use std::collections::BTreeMap;

use anyhow::{Context, Result, bail, ensure};

/// How a record of this format begins.
pub const RECORD: &[u8] = b"ZFOPTIM1";

/// How the torch engine's records began before [`RECORD`]: the same safetensors file, with
/// torch's shapes (linear weights transposed).
pub const LEGACY_TORCH: &[u8] = b"ZFTORCH1";

/// Muon's state as the native engine keeps it (`v <- mu * v + g`).
pub const VELOCITY: &str = "velocity";
/// Muon's state as torch keeps it (`b <- mu * b + (1 - mu) * g`).
pub const MOMENTUM_BUFFER: &str = "momentum_buffer";
/// AdamW's step count, a 0-d tensor.
pub const STEP: &str = "step";
/// AdamW's first moment.
pub const EXP_AVG: &str = "exp_avg";
/// AdamW's second moment.
pub const EXP_AVG_SQ: &str = "exp_avg_sq";
/// AdamW's running maximum of the second moment (AMSGrad only).
pub const MAX_EXP_AVG_SQ: &str = "max_exp_avg_sq";

/// A tensor of a record: shape and f32 values.
#[derive(Clone, Debug, PartialEq)]
pub struct Values {
    /// The shape (`[]` for a scalar).
    pub shape: Vec<usize>,
    /// The values, row-major.
    pub data: Vec<f32>,
}

/// A decoded record.
#[derive(Debug, PartialEq)]
pub enum Record {
    /// Named tensors (this format, or [`LEGACY_TORCH`] with `torch_layout`).
    State {
        /// The tensors by key.
        tensors: BTreeMap<String, Values>,
        /// Whether 2-D tensors are in torch's layout (`[out, in]`) rather than zflow's.
        torch_layout: bool,
    },
    /// A burn record (the native engine's format before this one): bytes for burn's recorder.
    Burn,
}

/// Encodes one parameter's state; the same tensors always give the same bytes.
pub fn encode(tensors: &[(&str, &[usize], &[f32])]) -> Result<Vec<u8>> {
    let bytes: Vec<(&str, &[usize], Vec<u8>)> = tensors
        .iter()
        .map(|(k, shape, data)| (*k, *shape, bytemuck::cast_slice(data).to_vec()))
        .collect();
    let mut views = Vec::with_capacity(bytes.len());
    for (key, shape, data) in &bytes {
        let view =
            safetensors::tensor::TensorView::new(safetensors::Dtype::F32, shape.to_vec(), data)
                .with_context(|| format!("optimizer state `{key}`: shape {shape:?}"))?;
        views.push((key.to_string(), view));
    }
    let mut out = RECORD.to_vec();
    out.extend(safetensors::serialize(views, None)?);
    Ok(out)
}

/// Decodes a record; `origin` names it in errors (file and parameter).
pub fn decode(record: &[u8], origin: &str) -> Result<Record> {
    let (body, torch_layout) = if let Some(body) = record.strip_prefix(RECORD) {
        (body, false)
    } else if let Some(body) = record.strip_prefix(LEGACY_TORCH) {
        (body, true)
    } else {
        return Ok(Record::Burn);
    };
    let st = safetensors::SafeTensors::deserialize(body)
        .with_context(|| format!("{origin}: the optimizer state is not a safetensors file"))?;
    let mut tensors = BTreeMap::new();
    for (key, view) in st.tensors() {
        ensure!(
            view.dtype() == safetensors::Dtype::F32,
            "{origin}: optimizer state `{key}` is {:?}, expected F32",
            view.dtype()
        );
        let data = view
            .data()
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().expect("4 bytes")))
            .collect();
        tensors.insert(
            key,
            Values {
                shape: view.shape().to_vec(),
                data,
            },
        );
    }
    Ok(Record::State {
        tensors,
        torch_layout,
    })
}

/// burn's Muon velocity from torch's momentum buffer at momentum `mu` (`v = b / (1 - mu)`).
pub fn velocity_from_buffer(buffer: &[f32], mu: f64) -> Result<Vec<f32>> {
    if !(0.0..1.0).contains(&mu) {
        bail!("Muon momentum {mu} cannot convert torch's momentum buffer (needs 0 <= mu < 1)");
    }
    let scale = 1.0 / (1.0 - mu);
    Ok(buffer.iter().map(|&b| (b as f64 * scale) as f32).collect())
}

/// The transpose of a row-major `[rows, cols]` matrix.
pub fn transpose(data: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let mut out = vec![0.0; data.len()];
    for r in 0..rows {
        for c in 0..cols {
            out[c * rows + r] = data[r * cols + c];
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_are_stable() {
        let m = [1.0f32, -2.0, 3.5, 0.25, 5.0, 6.0];
        let v = [0.5f32; 6];
        let a = encode(&[
            (STEP, &[], &[7.0]),
            (EXP_AVG, &[2, 3], &m),
            (EXP_AVG_SQ, &[2, 3], &v),
        ])
        .unwrap();
        // The order given does not matter: safetensors sorts its entries.
        let b = encode(&[
            (EXP_AVG_SQ, &[2, 3], &v),
            (EXP_AVG, &[2, 3], &m),
            (STEP, &[], &[7.0]),
        ])
        .unwrap();
        assert_eq!(a, b);
        let Record::State {
            tensors,
            torch_layout,
        } = decode(&a, "test").unwrap()
        else {
            panic!("not a state record")
        };
        assert!(!torch_layout);
        assert_eq!(tensors[STEP].shape, Vec::<usize>::new());
        assert_eq!(tensors[STEP].data, vec![7.0]);
        assert_eq!(tensors[EXP_AVG].data, m.to_vec());
        assert_eq!(tensors[EXP_AVG_SQ].shape, vec![2, 3]);
    }

    #[test]
    fn other_records_are_told_apart() {
        assert_eq!(decode(b"\x81\xa4item", "x").unwrap(), Record::Burn);
        let mut legacy = LEGACY_TORCH.to_vec();
        legacy.extend(&encode(&[(MOMENTUM_BUFFER, &[1], &[1.0])]).unwrap()[RECORD.len()..]);
        assert!(matches!(
            decode(&legacy, "x").unwrap(),
            Record::State {
                torch_layout: true,
                ..
            }
        ));
        let err = decode(b"ZFOPTIM1garbage", "optim-muon.rank-0.bin, parameter 7").unwrap_err();
        assert!(
            format!("{err:#}").contains("optim-muon.rank-0.bin, parameter 7"),
            "{err:#}"
        );
    }

    #[test]
    fn momentum_conventions_convert() {
        // Three steps of both recurrences on the same gradients.
        let (mu, grads) = (0.9f64, [1.0f64, -0.5, 2.0]);
        let (mut v, mut b) = (0.0f64, 0.0f64);
        for g in grads {
            v = mu * v + g;
            b = mu * b + (1.0 - mu) * g;
        }
        let got = velocity_from_buffer(&[b as f32], mu).unwrap()[0] as f64;
        assert!((got - v).abs() < 1e-6 * v.abs(), "{got} vs {v}");
        assert!(velocity_from_buffer(&[1.0], 1.0).is_err());
    }

    #[test]
    fn transposes() {
        assert_eq!(
            transpose(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], 2, 3),
            vec![1.0, 4.0, 2.0, 5.0, 3.0, 6.0]
        );
    }
}
