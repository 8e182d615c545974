//! `export`: the recipe's trained model as a Hugging Face folder (`zflow_runtime::hf`): `hf/`
//! in the stage's output holds `config.json`, `model.safetensors` and, with a tokenizer, its
//! files. In the default layout `AutoModelForCausalLM.from_pretrained` loads it with the
//! transformers release (5.23); `layout: legacy` writes the form of Zyphra's fork and vLLM.
//!
//! Recipe section:
//! ```yaml
//! export: {format: hf}                  # the only format; layout: transformers
//! export: {format: hf, layout: legacy}
//! ```
//! adds one stage, `export`, after the last phase's `train.<phase>` (its `final/` checkpoint),
//! needing the `tokenizer` stage too when the recipe has one.

use serde::{Deserialize, Serialize};
use zflow_pipeline::{ConfigError, Stage, StageContext};
use zflow_runtime::hf::{self, ExportOptions};

/// The `export` stage kind.
pub struct Export;

/// `export` settings (what the `export:` section writes).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExportConfig {
    /// The output format; `hf` is the one there is.
    pub format: String,
    /// The train stage whose `final/` checkpoint is exported.
    pub train: String,
    /// The tokenizer stage whose `tokenizer.json` ships with the model.
    #[serde(default)]
    pub tokenizer: Option<String>,
    /// The context the model was trained at (`max_position_embeddings`).
    #[serde(default = "default_positions")]
    pub max_position_embeddings: usize,
    /// The folder's layout (`hf::Layout`): `transformers` (the default) or `legacy`.
    #[serde(default)]
    pub layout: hf::Layout,
}

fn default_positions() -> usize {
    hf::DEFAULT_MAX_POSITIONS
}

/// Checks the format name, so the section and the stage say the same thing.
pub(crate) fn check_format(format: &str, path: &str) -> Result<(), ConfigError> {
    if format == "hf" {
        return Ok(());
    }
    Err(ConfigError::new(
        path,
        format!(
            "`{format}` is not an export format; the one there is: `hf` (Hugging Face, for ZAYA1's reference implementation)"
        ),
    ))
}

impl Stage for Export {
    type Config = ExportConfig;
    const KIND: &'static str = "export";
    // 2: the model comes from the checkpoint's model.json, not from the recipe's `model:`.
    const VERSION: u32 = 2;

    fn validate(&self, c: &ExportConfig, needs: &[String]) -> Result<(), ConfigError> {
        check_format(&c.format, "format")?;
        for stage in std::iter::once(&c.train).chain(&c.tokenizer) {
            if !needs.contains(stage) {
                return Err(ConfigError::new(
                    "needs",
                    format!("the export reads `{stage}` but does not need it"),
                ));
            }
        }
        Ok(())
    }

    fn run(&self, c: &ExportConfig, ctx: &StageContext) -> anyhow::Result<()> {
        let checkpoint = ctx.input(&c.train)?.join("final");
        let tokenizer = c
            .tokenizer
            .as_ref()
            .map(|t| ctx.input(t).map(|p| p.to_path_buf()))
            .transpose()?;
        let opts = ExportOptions {
            tokenizer,
            max_position_embeddings: c.max_position_embeddings,
            layout: c.layout,
        };
        let model = zflow_runtime::checkpoint::model_config(&checkpoint)?;
        hf::export_hf(&checkpoint, &model, &opts, &ctx.out_dir().join("hf"))?;
        tracing::info!("exported {} as a Hugging Face folder", checkpoint.display());
        Ok(())
    }
}
