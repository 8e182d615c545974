//! Import: a Hugging Face folder to a zflow checkpoint.

use super::config::model_config_from_hf;
use super::files::HfFiles;
use super::layout::{Layout, biases_name};
use super::tensors::{Lazy, specs, widen};
use super::{CHECKPOINT_FORMAT, IMPORTED_PHASE};
use crate::checkpoint::{Manifest, TrainerState};
use crate::contract::balance::BalanceState;
use crate::data::mixture::DataCursor;
use crate::model::config::ModelConfig;
use anyhow::{Context, Result, anyhow, bail, ensure};
use safetensors::Dtype;
use safetensors::tensor::TensorView;
use serde_json::Value;
use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fs;
use std::path::Path;
use zflow_files::atomic::publish;

/// Refuses a tensor of a dtype other than F32, BF16 and F16.
fn check_dtype(view: &TensorView<'_>, name: &str, file: &Path) -> Result<()> {
    match view.dtype() {
        Dtype::F32 | Dtype::BF16 | Dtype::F16 => Ok(()),
        other => bail!(
            "{}: tensor `{name}` is {other:?}; zflow reads F32, BF16 and F16",
            file.display()
        ),
    }
}

/// A tensor's values as f32 bytes, refusing dtypes other than F32, BF16 and F16.
fn to_f32<'a>(view: &TensorView<'a>, name: &str, file: &Path) -> Result<Cow<'a, [u8]>> {
    check_dtype(view, name, file)?;
    Ok(widen(view.data(), view.dtype()))
}

/// Imports Hugging Face folder `hf` (a ZAYA1 in either [`Layout`], read from its
/// `config.json`; `model.safetensors` or its shards) as zflow checkpoint folder `out`: `model.safetensors` with
/// our names and layouts (f32, the bytes the trainer would write for these weights),
/// `trainer.json` (the balancing biases, the RoPE base, step 0 of phase `hf-import`; no data
/// cursor or optimizer state), `model.json` and `manifest.json`. Returns the model config.
pub fn import_hf(hf: &Path, out: &Path) -> Result<ModelConfig> {
    // Before the folder is read: a taken `out` is refused at no cost.
    zflow_files::atomic::ensure_free(out)?;
    read_hf(hf, |model, tensors, state| {
        write_checkpoint(out, model, tensors, state)
    })
}

/// Checks Hugging Face folder `hf` as [`import_hf`] does, writing nothing: its `config.json`
/// (every field, and every size against what the safetensors hold), and every tensor (none
/// missing, none unexpected, each of the shape and a dtype the config implies). Returns the
/// model config. `zflow eval` runs it before a ZAYA1 folder is loaded as it is.
pub fn check_hf(hf: &Path) -> Result<ModelConfig> {
    read_hf(hf, |_, _, _| Ok(()))
}

/// The most bytes of a `config.json` read: a real one is a few KB.
const CONFIG_BYTES: u64 = 1 << 20;

/// Reads and checks folder `hf`, then hands its model config, its tensors under our names
/// and layouts (lazily converted) and its trainer state to `write`.
fn read_hf(
    hf: &Path,
    write: impl for<'a> FnOnce(&ModelConfig, Vec<(String, Lazy<'a>)>, &TrainerState) -> Result<()>,
) -> Result<ModelConfig> {
    let cpath = hf.join("config.json");
    let v: Value = serde_json::from_slice(&zflow_files::read::bounded(&cpath, CONFIG_BYTES)?)
        .with_context(|| format!("{}: not JSON", cpath.display()))?;
    let model = model_config_from_hf(&v, &cpath)?;
    let layout = Layout::of_config(&v);

    let files = HfFiles::open(hf)?;
    let tables = files.tables()?;
    let present = Present {
        tensors: tables.iter().map(|(_, t)| t.len()).sum(),
        values: tables
            .iter()
            .flat_map(|(_, t)| t.tensors())
            .map(|(_, view)| view.shape().iter().product::<usize>() as u128)
            .sum(),
    };
    check_sizes(&model, &present, &cpath)?;
    // Every tensor name -> the file holding it.
    let mut at: BTreeMap<String, usize> = BTreeMap::new();
    for (i, (p, t)) in tables.iter().enumerate() {
        for name in t.names() {
            if at.insert(name.to_string(), i).is_some() {
                bail!("{}: tensor `{name}` is in two shards", p.display());
            }
        }
    }
    let get = |name: &str| -> Result<(TensorView<'_>, &Path)> {
        let &i = at.get(name).ok_or_else(|| {
            anyhow!(
                "{}: tensor `{name}` is missing (config.json implies it)",
                hf.display()
            )
        })?;
        let (p, t) = &tables[i];
        Ok((t.tensor(name)?, p))
    };

    let specs = specs(&model, layout);
    let routes = model.num_experts + usize::from(model.mod_skip);
    let mut expected: BTreeSet<String> = specs.iter().map(|s| s.hf.clone()).collect();
    expected.extend((0..model.num_blocks).map(|i| biases_name(layout, i)));
    if let Some(extra) = at
        .keys()
        .find(|n| !expected.contains(*n) && n.as_str() != "lm_head.weight")
    {
        bail!(
            "{}: unexpected tensor `{extra}` (not part of the ZAYA1 model config.json describes)",
            hf.display()
        );
    }

    let mut tensors: Vec<(String, Lazy<'_>)> = Vec::with_capacity(specs.len());
    for s in &specs {
        let (view, file) = get(&s.hf)?;
        let want = s.hf_shape();
        ensure!(
            view.shape() == want.as_slice(),
            "{}: tensor `{}` is {:?}, config.json implies {:?}",
            file.display(),
            s.hf,
            view.shape(),
            want
        );
        check_dtype(&view, &s.hf, file)?; // before anything is written
        let slice = s.slice_shape();
        let transpose = s.linear.then(|| (slice[0], slice[1]));
        let data = match s.stacked {
            // Expert `e`'s slice of the stacked tensor.
            Some((e, experts)) => {
                let len = view.data().len() / experts;
                &view.data()[e * len..(e + 1) * len]
            }
            None => view.data(),
        };
        tensors.push((
            s.ours.clone(),
            Lazy::one(
                Cow::Borrowed(data),
                view.dtype(),
                s.shape.clone(),
                transpose,
            ),
        ));
    }
    // A saved tied head duplicates the embedding; anything else is a model zflow cannot hold.
    if at.contains_key("lm_head.weight") {
        let (head, file) = get("lm_head.weight")?;
        let (embed, efile) = get("model.embed_tokens.weight")?;
        let same = head.shape() == embed.shape()
            && to_f32(&head, "lm_head.weight", file)?
                == to_f32(&embed, "model.embed_tokens.weight", efile)?;
        ensure!(
            same,
            "{}: `lm_head.weight` differs from the embedding; zflow's ZAYA1 ties the output head to it",
            file.display()
        );
    }
    let mut balance = Vec::with_capacity(model.num_blocks);
    for i in 0..model.num_blocks {
        let name = biases_name(layout, i);
        let (view, file) = get(&name)?;
        ensure!(
            view.shape() == [routes],
            "{}: tensor `{name}` is {:?}, config.json implies [{routes}]",
            file.display(),
            view.shape()
        );
        let biases = to_f32(&view, &name, file)?
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        // A fresh controller around the imported biases (its gains' state is not exported).
        balance.push(BalanceState {
            biases,
            ..BalanceState::new(routes, model.mod_skip)
        });
    }
    let cursor = DataCursor {
        phase: IMPORTED_PHASE.into(),
        sample: 0,
        fingerprint: String::new(),
    };
    let state = TrainerState::new(IMPORTED_PHASE, 0, cursor, balance, 0);
    write(&model, tensors, &state)?;
    Ok(model)
}

/// Writes checkpoint folder `out` (atomically) from an imported model.
fn write_checkpoint(
    out: &Path,
    model: &ModelConfig,
    tensors: Vec<(String, Lazy<'_>)>,
    state: &TrainerState,
) -> Result<()> {
    publish(out, |dir| {
        let meta = HashMap::from([("format".to_string(), CHECKPOINT_FORMAT.to_string())]);
        safetensors::serialize_to_file(tensors, Some(meta), &dir.join("model.safetensors"))
            .context("writing model.safetensors")?;
        fs::write(dir.join("trainer.json"), serde_json::to_vec_pretty(state)?)?;
        fs::write(dir.join("model.json"), serde_json::to_vec_pretty(model)?)?;
        // The manifest, as `checkpoint::commit` writes it (step, size and blake3 per file), last.
        let mut manifest = Manifest {
            step: 0,
            files: BTreeMap::new(),
        };
        for name in ["model.safetensors", "trainer.json", "model.json"] {
            manifest
                .files
                .insert(name.to_string(), zflow_files::hash::file(&dir.join(name))?);
        }
        fs::write(
            dir.join("manifest.json"),
            serde_json::to_vec_pretty(&manifest)?,
        )?;
        Ok(())
    })
    .with_context(|| format!("writing {}", out.display()))
}

/// What the safetensors of a folder hold: the bound every size config.json states must fit.
struct Present {
    tensors: usize,
    values: u128,
}

/// Refuses a config.json whose sizes the tensors beside it cannot hold, before anything is
/// allocated from them: a block count above the tensor count, or a matrix (computed in 128
/// bits, so no product overflows) with more values than all the tensors together. Without
/// this a hostile `num_hidden_layers` of 10^8 exhausted memory, and a head count of 2^33
/// overflowed the shape arithmetic.
fn check_sizes(m: &ModelConfig, present: &Present, file: &Path) -> Result<()> {
    ensure!(
        m.num_blocks <= present.tensors,
        "{}: `num_hidden_layers` gives {} blocks, but the safetensors hold only {} tensors (every block has several)",
        file.display(),
        m.num_blocks,
        present.tensors
    );
    // `None`: beyond 128 bits, so beyond any folder.
    let n = |xs: &[usize]| {
        xs.iter()
            .try_fold(1u128, |acc, &x| acc.checked_mul(x as u128))
    };
    let heads = m.num_query_heads.saturating_add(m.num_kv_heads);
    let matrices = [
        (
            "vocab_size x hidden_size",
            n(&[m.vocab_size, m.hidden_size]),
        ),
        (
            "query heads x head_dim x hidden_size",
            n(&[m.num_query_heads, m.head_dim, m.hidden_size]),
        ),
        (
            "key/value heads x head_dim x hidden_size",
            n(&[m.num_kv_heads, m.head_dim, m.hidden_size]),
        ),
        (
            "num_experts x expert width x hidden_size",
            n(&[m.num_experts, m.expert_ffn, m.hidden_size]),
        ),
        (
            "router width x hidden_size",
            n(&[m.router_dim, m.hidden_size]),
        ),
        ("blocks x hidden_size", n(&[m.num_blocks, m.hidden_size])),
        (
            "conv kernel x heads x head_dim",
            n(&[m.conv_kernel, heads, m.head_dim]),
        ),
    ];
    for (what, values) in matrices {
        ensure!(
            values.is_some_and(|v| v <= present.values),
            "{}: the sizes give a {what} matrix of {} values, but the safetensors hold {} values in all",
            file.display(),
            values.map_or("more than 2^128".to_string(), |v| v.to_string()),
            present.values
        );
    }
    Ok(())
}
