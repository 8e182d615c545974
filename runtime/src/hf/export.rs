//! Export: a verified zflow checkpoint to a Hugging Face folder.

use super::config::{Specials, check_exportable, hf_config};
use super::layout::{Layout, biases_name, skip_bias_at_minus_one};
use super::tensors::{Lazy, f32_bytes, specs};
use super::tokenizer::TokenizerFiles;
use super::{ExportOptions, GEMMA3_VOCAB};
use crate::checkpoint::TrainerState;
use crate::model::config::ModelConfig;
use anyhow::{Context, Result, anyhow, bail, ensure};
use safetensors::{Dtype, SafeTensors};
use std::borrow::Cow;
use std::collections::{BTreeSet, HashMap};
use std::fs;
use std::path::Path;
use zflow_files::atomic::publish;

/// Exports checkpoint `checkpoint` (a zflow checkpoint folder of `model`) as a Hugging Face
/// folder `out` for the reference implementation; see the module docs for what it holds.
/// Refuses a checkpoint that does not verify against its manifest, and a folder `out` that
/// exists and is not empty.
pub fn export_hf(
    checkpoint: &Path,
    model: &ModelConfig,
    opts: &ExportOptions,
    out: &Path,
) -> Result<()> {
    check_exportable(model, opts.layout)?;
    // Before the checkpoint is read: a taken `out` is refused at no cost.
    zflow_files::atomic::ensure_free(out)?;
    let listed = crate::checkpoint::verify(checkpoint).with_context(|| {
        format!(
            "{} does not verify against its manifest; refusing to export a damaged checkpoint",
            checkpoint.display()
        )
    })?;
    for name in ["model.safetensors", "trainer.json"] {
        ensure!(
            listed.contains(name),
            "{}: the manifest lists no {name}",
            checkpoint.display()
        );
    }
    let state_path = checkpoint.join("trainer.json");
    let state: TrainerState = serde_json::from_slice(&fs::read(&state_path)?)
        .with_context(|| format!("parsing {}", state_path.display()))?;
    let tokenizer = opts
        .tokenizer
        .as_deref()
        .map(TokenizerFiles::read)
        .transpose()?;
    if let Some(t) = &tokenizer {
        ensure!(
            t.size <= model.vocab_size,
            "{}: {} tokens, more than the model's vocabulary of {}; is it the model's tokenizer?",
            t.path.display(),
            t.size,
            model.vocab_size
        );
    }
    // Special ids: the tokenizer's if given (it is what the model was trained on); without one,
    // ZAYA1's own when the vocabulary is Gemma3's; otherwise unknown (null).
    let specials = match &tokenizer {
        Some(t) => t.specials.clone(),
        None if model.vocab_size == GEMMA3_VOCAB => Specials {
            bos: Some((2, None)),
            eos: Some((1, None)),
            pad: Some((0, None)),
        },
        None => Specials::default(),
    };

    let origin = checkpoint.join("model.safetensors");
    let weights = zflow_files::map::read_only(&origin)?;
    let st = SafeTensors::deserialize(&weights)
        .with_context(|| format!("{}: not a safetensors file", origin.display()))?;
    let specs = specs(model, opts.layout);
    let known: BTreeSet<&str> = specs.iter().map(|s| s.ours.as_str()).collect();
    let mut names = st.names();
    names.sort();
    if let Some(extra) = names.iter().find(|n| !known.contains(**n)) {
        bail!(
            "{}: tensor `{extra}` is not a parameter of the given model config; is it the checkpoint's model?",
            origin.display()
        );
    }
    let mut tensors: Vec<(String, Lazy<'_>)> = Vec::with_capacity(specs.len() + model.num_blocks);
    for s in &specs {
        let view = st.tensor(&s.ours).map_err(|_| {
            anyhow!(
                "{}: tensor `{}` is missing (the model config has it)",
                origin.display(),
                s.ours
            )
        })?;
        ensure!(
            view.dtype() == Dtype::F32 && view.shape() == s.shape.as_slice(),
            "{}: tensor `{}` is {:?} {:?}, the model config implies F32 {:?}; is it the checkpoint's model?",
            origin.display(),
            s.ours,
            view.dtype(),
            view.shape(),
            s.shape
        );
        let transpose = s.linear.then(|| (s.shape[0], s.shape[1]));
        let source = Cow::Borrowed(view.data());
        match s.stacked {
            // The next expert of a stacked tensor that expert 0 started (the specs list a
            // layer's experts in order).
            Some((e, _)) if e > 0 => {
                let (_, stack) = tensors
                    .iter_mut()
                    .rev()
                    .find(|(name, _)| *name == s.hf)
                    .expect("expert 0 comes first");
                stack.sources.push(source);
            }
            _ => tensors.push((
                s.hf.clone(),
                Lazy::one(source, Dtype::F32, s.hf_shape(), transpose),
            )),
        }
    }
    let routes = model.num_experts + usize::from(model.mod_skip);
    ensure!(
        state.balance.len() == model.num_blocks,
        "{}/trainer.json: balancing state for {} MoE layers, the model has {}",
        checkpoint.display(),
        state.balance.len(),
        model.num_blocks
    );
    for (i, b) in state.balance.iter().enumerate() {
        ensure!(
            b.biases.len() == routes,
            "{}/trainer.json: MoE layer {i} has {} balancing biases, the model routes to {routes}",
            checkpoint.display(),
            b.biases.len()
        );
        let values = match opts.layout {
            Layout::Transformers if model.mod_skip => skip_bias_at_minus_one(&b.biases),
            _ => b.biases.clone(),
        };
        let biases = Lazy::one(
            Cow::Owned(f32_bytes(&values)),
            Dtype::F32,
            vec![routes],
            None,
        );
        tensors.push((biases_name(opts.layout, i), biases));
    }

    let config = hf_config(model, opts.layout, opts.max_position_embeddings, &specials);
    publish(out, |dir| {
        fs::write(dir.join("config.json"), serde_json::to_vec_pretty(&config)?)?;
        let meta = HashMap::from([("format".to_string(), "pt".to_string())]);
        safetensors::serialize_to_file(tensors, Some(meta), &dir.join("model.safetensors"))
            .context("writing model.safetensors")?;
        if let Some(t) = &tokenizer {
            fs::write(dir.join("tokenizer.json"), &t.json)?;
            let (config, map) = t.configs(opts.max_position_embeddings);
            fs::write(
                dir.join("tokenizer_config.json"),
                serde_json::to_vec_pretty(&config)?,
            )?;
            fs::write(
                dir.join("special_tokens_map.json"),
                serde_json::to_vec_pretty(&map)?,
            )?;
        }
        Ok(())
    })
    .with_context(|| format!("writing {}", out.display()))
}
