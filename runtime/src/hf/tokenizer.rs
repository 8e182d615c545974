//! The tokenizer files an export ships beside the model.

use super::config::Specials;
use anyhow::{Context, Result, bail};
use serde_json::{Map, Value, json};
use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

/// The most bytes of a `tokenizer.json` zflow reads: Gemma 3's is 33 MB, and a path to something
/// else (`/dev/zero`, a weights file) is refused at this bound rather than read whole.
pub const MAX_TOKENIZER_BYTES: u64 = 256 << 20;

/// A tokenizer to ship with an export.
pub(super) struct TokenizerFiles {
    /// `tokenizer.json`, byte for byte.
    pub(super) json: Vec<u8>,
    /// Where it came from (for errors).
    pub(super) path: PathBuf,
    /// Tokens it knows (highest id + 1).
    pub(super) size: usize,
    pub(super) specials: Specials,
}

impl TokenizerFiles {
    /// Reads a `tokenizer.json`, or the one in folder `path`. The special tokens are those a
    /// `tokenizer` stage recorded in its `tokenizer_info.json` next to it, else the added tokens
    /// `<bos>`, `<eos>`, `<pad>` (the names zflow's trained tokenizers and Gemma3's use).
    pub(super) fn read(path: &Path) -> Result<TokenizerFiles> {
        let (file, info) = if path.is_dir() {
            (
                path.join("tokenizer.json"),
                Some(path.join("tokenizer_info.json")),
            )
        } else {
            (path.to_path_buf(), None)
        };
        let json = zflow_files::read::bounded(&file, MAX_TOKENIZER_BYTES)
            .with_context(|| format!("reading the tokenizer {}", file.display()))?;
        let v: Value = serde_json::from_slice(&json)
            .with_context(|| format!("{}: not JSON", file.display()))?;
        let mut added: BTreeMap<u32, String> = BTreeMap::new();
        for t in v
            .get("added_tokens")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            if let (Some(id), Some(content)) = (
                t.get("id").and_then(Value::as_u64),
                t.get("content").and_then(Value::as_str),
            ) {
                added.insert(id as u32, content.to_string());
            }
        }
        let vocab = v.get("model").and_then(|m| m.get("vocab"));
        let model_size = match vocab {
            // BPE / WordPiece: token -> id.
            Some(Value::Object(m)) => m
                .values()
                .filter_map(Value::as_u64)
                .max()
                .map_or(0, |n| n as usize + 1),
            // Unigram: [piece, score] in id order.
            Some(Value::Array(a)) => a.len(),
            _ => bail!(
                "{}: no model.vocab; not a Hugging Face tokenizer.json",
                file.display()
            ),
        };
        let size = model_size.max(added.keys().next_back().map_or(0, |&id| id as usize + 1));
        let named = |id: u32| Some((id, added.get(&id).cloned()));
        let by_text = |text: &str| {
            added
                .iter()
                .find(|(_, c)| c.as_str() == text)
                .map(|(&id, c)| (id, Some(c.clone())))
        };
        let specials = match info.filter(|p| p.exists()) {
            Some(info) => {
                let i: Value = serde_json::from_slice(&fs::read(&info)?)
                    .with_context(|| format!("parsing {}", info.display()))?;
                let id = |k: &str| i.get(k).and_then(Value::as_u64).map(|n| n as u32);
                Specials {
                    bos: id("bos_id").and_then(named),
                    eos: id("eos_id").and_then(named),
                    pad: id("pad_id").and_then(named),
                }
            }
            None => Specials {
                bos: by_text("<bos>"),
                eos: by_text("<eos>"),
                pad: by_text("<pad>"),
            },
        };
        Ok(TokenizerFiles {
            json,
            path: file,
            size,
            specials,
        })
    }

    /// `tokenizer_config.json` and `special_tokens_map.json`: what `AutoTokenizer` needs to load
    /// `tokenizer.json` as a fast tokenizer with the right special tokens. Only tokens whose
    /// text is known are named.
    pub(super) fn configs(&self, max_positions: usize) -> (Value, Value) {
        let mut map = Map::new();
        for (key, t) in [
            ("bos_token", &self.specials.bos),
            ("eos_token", &self.specials.eos),
            ("pad_token", &self.specials.pad),
        ] {
            if let Some((_, Some(text))) = t {
                map.insert(key.into(), Value::String(text.clone()));
            }
        }
        let mut config = Map::new();
        config.insert("tokenizer_class".into(), json!("PreTrainedTokenizerFast"));
        config.extend(map.clone());
        config.insert("model_max_length".into(), json!(max_positions));
        config.insert("clean_up_tokenization_spaces".into(), json!(false));
        (Value::Object(config), Value::Object(map))
    }
}
