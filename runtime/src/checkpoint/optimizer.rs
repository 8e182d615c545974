//! One parameter's optimizer state, as a checkpoint holds it.
//!
//! A record (one entry of an `optim-*.rank-R.bin` shard, see [`crate::checkpoint::layout`]) is
//! [`RECORD`] followed by a safetensors file of f32 tensors in the checkpoint's weight layout
//! (`model.safetensors`: zflow's names and shapes, linear weights `[in, out]`). Its keys:
//!
//! | optimizer | key | meaning |
//! |---|---|---|
//! | Muon | `momentum_buffer` | torch's (`torch.optim.Muon`): `b <- mu * b + (1 - mu) * g` |
//! | Muon | `velocity` | the retired native engine's: `v <- mu * v + g` (`b = (1 - mu) * v`) |
//! | AdamW | `step` | steps taken (a 0-d tensor), for the bias correction |
//! | AdamW | `exp_avg`, `exp_avg_sq` | the first and second moments |
//!
//! The torch engine (`workers/torch/zflow_torch/checkpoint.py`) writes and reads them, and
//! converts a native checkpoint's `velocity` at the resuming run's momentum.

use std::collections::BTreeMap;

use anyhow::{Context, Result, ensure};

/// How a record of this format begins.
pub const RECORD: &[u8] = b"ZFOPTIM1";

/// Muon's state as the retired native engine kept it (`v <- mu * v + g`).
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

/// A decoded record: its tensors by key.
pub type Record = BTreeMap<String, Values>;

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
    let body = record.strip_prefix(RECORD).with_context(|| {
        format!(
            "{origin}: not an optimizer record of this format (it begins {:?}, expected {:?})",
            String::from_utf8_lossy(&record[..record.len().min(8)]),
            String::from_utf8_lossy(RECORD)
        )
    })?;
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
    Ok(tensors)
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
        let tensors = decode(&a, "test").unwrap();
        assert_eq!(tensors[STEP].shape, Vec::<usize>::new());
        assert_eq!(tensors[STEP].data, vec![7.0]);
        assert_eq!(tensors[EXP_AVG].data, m.to_vec());
        assert_eq!(tensors[EXP_AVG_SQ].shape, vec![2, 3]);
    }

    #[test]
    fn other_records_are_refused_naming_where() {
        let err = decode(b"\x81\xa4item", "optim-muon.rank-0.bin, parameter 3").unwrap_err();
        assert!(format!("{err:#}").contains("parameter 3"), "{err:#}");
        let err = decode(b"ZFOPTIM1garbage", "optim-muon.rank-0.bin, parameter 7").unwrap_err();
        assert!(
            format!("{err:#}").contains("optim-muon.rank-0.bin, parameter 7"),
            "{err:#}"
        );
    }
}
