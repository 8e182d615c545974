//! The transformers adapter: a model scored by the transformers release (5.23, the torch
//! engine's environment) in a child process, `python -m zflow_torch.score FOLDER DEVICE`
//! (`workers/torch/zflow_torch/score.py` documents its JSON-lines protocol): how zflow scores a
//! zflow checkpoint or a Hugging Face folder (a ZAYA1, or another causal LM in transformers'
//! layout, such as Gemma 3), on the CPU or on GPUs (CUDA, or ROCm through
//! PyTorch's ROCm build).
//!
//! The model may be a zflow checkpoint (exported first, into a temporary folder, in
//! transformers' layout) or a Hugging Face folder in either layout (a legacy one is converted
//! the same way). Tokenization, batching, caching and metrics stay the harness's: the child
//! sees token ids, and each [`LanguageModel::loglikelihood`] call is one message; the child runs
//! each group's shared prefix once.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

use anyhow::{Context, Result, bail, ensure};
use serde_json::{Value, json};
use zflow_runtime::hf::{self, ExportOptions, Layout};

use crate::model::{LanguageModel, Score, TokenRequest};
use crate::tokenizer::Tokenizer;

/// Bumped when the way scores are computed changes (part of the identity).
const ADAPTER_VERSION: u32 = 3;

/// The most bytes of a `config.json` read: a real one is a few KB.
const CONFIG_BYTES: u64 = 1 << 20;

/// One scorer process (one device).
struct Scorer {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Scorer {
    fn send(&mut self, msg: &Value) -> Result<()> {
        let mut line = serde_json::to_vec(msg)?;
        line.push(b'\n');
        self.stdin
            .write_all(&line)
            .and_then(|()| self.stdin.flush())
            .context("writing to the transformers scorer")
    }

    fn receive(&mut self) -> Result<Value> {
        read_reply(&mut self.stdout, &mut self.child)
    }
}

impl Drop for Scorer {
    fn drop(&mut self) {
        // Its stdin closes with us, which ends its loop; don't leave it behind if it hangs.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A model scored through transformers, as a [`LanguageModel`]: one scorer process per device,
/// each call's work split between them in contiguous parts.
pub struct TransformersModel {
    scorers: Vec<Scorer>,
    tokenizer: Tokenizer,
    identity: String,
    max_length: usize,
    /// Holds a converted folder for as long as the child reads it.
    _converted: Option<tempfile::TempDir>,
}

/// The folder transformers loads for `dir`: `dir` itself when it is a Hugging Face folder in
/// transformers' layout; otherwise `dir` (a zflow checkpoint, or a legacy folder) exported in
/// that layout into a temporary folder (the returned guard).
fn transformers_folder(dir: &Path) -> Result<(PathBuf, Option<tempfile::TempDir>)> {
    let config = dir.join("config.json");
    if !dir.join("trainer.json").exists() && config.exists() {
        let v: Value = serde_json::from_slice(&zflow_files::read::bounded(&config, CONFIG_BYTES)?)
            .with_context(|| format!("{}: not JSON", config.display()))?;
        // Only a ZAYA1 has a legacy layout to convert; transformers loads any other model as is
        // (the scorer checks its tensors against the model its config describes).
        if v["model_type"].as_str().is_some_and(|t| t != "zaya") {
            return Ok((dir.to_path_buf(), None));
        }
        if Layout::of_config(&v) == Layout::Transformers {
            // Checked as `ckpt import` checks it: every config size against the tensors, and
            // every tensor against the config, before transformers allocates anything.
            hf::check_hf(dir)
                .with_context(|| format!("reading the Hugging Face folder {}", dir.display()))?;
            return Ok((dir.to_path_buf(), None));
        }
    }
    let tmp = tempfile::tempdir()?;
    let checkpoint = if dir.join("trainer.json").exists() {
        dir.to_path_buf()
    } else {
        let imported = tmp.path().join("imported");
        hf::import_hf(dir, &imported)
            .with_context(|| format!("reading the Hugging Face folder {}", dir.display()))?;
        imported
    };
    let model = zflow_runtime::checkpoint::model_config(&checkpoint)?;
    let out = tmp.path().join("hf");
    hf::export_hf(&checkpoint, &model, &ExportOptions::default(), &out)
        .with_context(|| format!("exporting {} for transformers", checkpoint.display()))?;
    Ok((out, Some(tmp)))
}

impl TransformersModel {
    /// Starts `scorer` (the torch engine's Python running `-m zflow_torch.score`, with its
    /// environment: `zflow_stages::engine::torch_module`; the folder, the device and the
    /// tokenizer are appended) on `dir` (a zflow checkpoint or a Hugging Face folder),
    /// once per device of `devices` (`cpu`, or `cuda:N` ones, comma-separated), with the
    /// tokenizer at `tokenizer` whose `eos` token doubles as the prefix of empty contexts.
    /// `max_length` is the context the model was trained at.
    pub fn open(
        scorer: Command,
        dir: &Path,
        tokenizer: &Path,
        eos: &str,
        max_length: usize,
        devices: &str,
    ) -> Result<TransformersModel> {
        let (folder, converted) = transformers_folder(dir)?;
        let (tokenizer_model, tok_hash) = scoring_tokenizer(tokenizer, eos)?;
        // The weights' hash is of their tensors, read through memory maps: a sharded folder and
        // its single-file copy are one model, and no file is held in memory to hash it.
        let weights = hf::HfFiles::open(&folder)?.content_hash()?[..16].to_string();
        let config = zflow_files::read::bounded(&folder.join("config.json"), CONFIG_BYTES)?;
        let config = blake3::hash(&config).to_hex()[..16].to_string();
        let mut scorers = Vec::new();
        let mut hellos = Vec::new();
        // Every scorer loads the model at once; the replies are read after all have started.
        for device in devices.split(',').map(str::trim) {
            let mut command = Command::new(scorer.get_program());
            command
                .args(scorer.get_args())
                .envs(
                    scorer
                        .get_envs()
                        .filter_map(|(k, v)| v.map(|v| (k.to_owned(), v.to_owned()))),
                )
                .arg(&folder)
                .arg(device)
                .arg(tokenizer)
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit());
            let mut child = command
                .spawn()
                .with_context(|| format!("starting {:?}", scorer.get_program()))?;
            let stdin = child.stdin.take().expect("piped");
            let stdout = BufReader::new(child.stdout.take().expect("piped"));
            scorers.push(Scorer {
                child,
                stdin,
                stdout,
            });
        }
        for s in &mut scorers {
            let hello = s.receive()?;
            // The scorer's typed refusal of the folder (score.py's `FolderError`).
            if let Some(error) = hello["error"].as_str() {
                bail!("{}: {error}", dir.display());
            }
            ensure!(
                hello["ready"] == json!(true),
                "the scorer did not start: {hello}"
            );
            hellos.push(hello);
        }
        let hello = &hellos[0];
        let device = hello["device"].as_str().unwrap_or("?");
        let on = if hellos.len() > 1 {
            format!("{} x {device}", hellos.len())
        } else {
            device.to_string()
        };
        let identity = format!(
            "zflow-transformers v{ADAPTER_VERSION} transformers {} torch {} weights {weights} config {config} tokenizer {tok_hash} on {on}",
            hello["transformers"].as_str().unwrap_or("?"),
            hello["torch"].as_str().unwrap_or("?"),
        );
        Ok(TransformersModel {
            scorers,
            tokenizer: tokenizer_model,
            identity,
            max_length,
            _converted: converted,
        })
    }

    /// Sends part `i` of `parts` (at most one per scorer, in order) to scorer `i`, then
    /// gathers the replies in the same order: the scorers work at the same time.
    fn ask_all(&mut self, parts: Vec<Value>) -> Result<Vec<Value>> {
        for (s, msg) in self.scorers.iter_mut().zip(&parts) {
            s.send(msg)?;
        }
        self.scorers
            .iter_mut()
            .take(parts.len())
            .map(Scorer::receive)
            .collect()
    }
}

/// `items` cut into at most `n` contiguous, non-empty, nearly equal parts.
fn split_parts<T>(items: &[T], n: usize) -> Vec<&[T]> {
    let n = n.clamp(1, items.len().max(1));
    let (size, extra) = (items.len() / n, items.len() % n);
    let mut parts = Vec::new();
    let mut at = 0;
    for i in 0..n {
        let len = size + usize::from(i < extra);
        parts.push(&items[at..at + len]);
        at += len;
    }
    parts
}

/// The child's next JSON line; if it ended instead, its exit status.
fn read_reply(stdout: &mut BufReader<ChildStdout>, child: &mut Child) -> Result<Value> {
    let mut line = String::new();
    if stdout.read_line(&mut line)? == 0 {
        let status = child.wait()?;
        bail!("the transformers scorer ended ({status}); its errors are above");
    }
    serde_json::from_str(&line).with_context(|| format!("the scorer answered `{}`", line.trim()))
}

impl LanguageModel for TransformersModel {
    fn identity(&self) -> String {
        self.identity.clone()
    }

    fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    fn max_length(&self) -> usize {
        self.max_length
    }

    fn loglikelihood(&mut self, groups: &[Vec<TokenRequest>]) -> Result<Vec<Vec<Score>>> {
        if groups.iter().all(Vec::is_empty) {
            return Ok(groups.iter().map(|_| Vec::new()).collect());
        }
        let request =
            |r: &TokenRequest| json!({"context": r.context, "continuation": r.continuation});
        let parts = split_parts(groups, self.scorers.len());
        let messages = parts
            .iter()
            .map(|part| {
                let groups: Vec<Vec<Value>> = part
                    .iter()
                    .map(|g| g.iter().map(request).collect())
                    .collect();
                json!({"op": "loglikelihood", "groups": groups})
            })
            .collect();
        let mut scores: Vec<Vec<(f64, bool)>> = Vec::new();
        for reply in self.ask_all(messages)? {
            let part: Vec<Vec<(f64, bool)>> = serde_json::from_value(reply["scores"].clone())
                .with_context(|| format!("the scorer's scores: {reply}"))?;
            scores.extend(part);
        }
        ensure!(
            scores.len() == groups.len()
                && scores.iter().zip(groups).all(|(s, g)| s.len() == g.len()),
            "the scorers' scores do not match the {} groups asked for",
            groups.len()
        );
        Ok(scores
            .into_iter()
            .map(|g| {
                g.into_iter()
                    .map(|(logprob, is_greedy)| Score { logprob, is_greedy })
                    .collect()
            })
            .collect())
    }

    fn generate_greedy(
        &mut self,
        context: &[u32],
        max_new_tokens: usize,
        stop: &mut dyn FnMut(&[u32]) -> bool,
    ) -> Result<Vec<u32>> {
        let tokens = self
            .generate_batch(&[context.to_vec()], max_new_tokens, &[])?
            .pop()
            .unwrap_or_default();
        // Greedy decoding is deterministic, so cutting the result at the first stop is what
        // stopping there would have given.
        let mut generated = Vec::new();
        for t in tokens {
            generated.push(t);
            if stop(&generated) {
                break;
            }
        }
        Ok(generated)
    }

    fn generate_batch(
        &mut self,
        contexts: &[Vec<u32>],
        max_new_tokens: usize,
        until: &[String],
    ) -> Result<Vec<Vec<u32>>> {
        if contexts.is_empty() {
            return Ok(Vec::new());
        }
        let windows: Vec<&[u32]> = contexts
            .iter()
            .map(|c| &c[c.len().saturating_sub(self.max_length)..])
            .collect();
        let eos = self.tokenizer.eos.clone();
        let messages = split_parts(&windows, self.scorers.len())
            .into_iter()
            .map(|part| {
                json!({
                    "op": "generate", "contexts": part, "max_new_tokens": max_new_tokens,
                    "until": until, "eos": eos,
                })
            })
            .collect();
        let mut out: Vec<Vec<u32>> = Vec::new();
        for reply in self.ask_all(messages)? {
            let part: Vec<Vec<u32>> = serde_json::from_value(reply["generations"].clone())
                .with_context(|| format!("the scorer's generations: {reply}"))?;
            out.extend(part);
        }
        ensure!(
            out.len() == contexts.len(),
            "the scorers returned {} generations for {} contexts",
            out.len(),
            contexts.len()
        );
        Ok(out)
    }
}

/// A model's tokenizer (a `tokenizer.json` whose `eos` token doubles as the prefix of empty
/// contexts) and the short hash of its file, for model identities. Contexts start with the token
/// that the file's post-processor puts before a text (Gemma's `<bos>`), if it puts one: that is
/// what transformers' tokenizer, and so lm-eval's hf backend, feed the model. zflow's own
/// tokenizers have no post-processor.
fn scoring_tokenizer(tokenizer: &Path, eos: &str) -> Result<(Tokenizer, String)> {
    // Read once, for both the tokenizer and its hash (Gemma's is 33 MB).
    let bytes = zflow_files::read::bounded(tokenizer, hf::MAX_TOKENIZER_BYTES)?;
    let inner = tokenizers::Tokenizer::from_bytes(&bytes)
        .map_err(|e| anyhow::anyhow!("{}: {e}", tokenizer.display()))?;
    let eos_id = inner
        .token_to_id(eos)
        .with_context(|| format!("{}: no token `{eos}`", tokenizer.display()))?;
    let bos = leading_special_token(&inner)
        .with_context(|| format!("{}: its post-processor", tokenizer.display()))?;
    let tok_hash = blake3::hash(&bytes).to_hex()[..16].to_string();
    // Unchanged for tokenizers without a BOS, so their cached scores stay valid.
    let identity = match bos {
        None => format!("zflow tokenizer {tok_hash}"),
        Some(b) => format!("zflow tokenizer {tok_hash} bos {b}"),
    };
    let tokenizer = Tokenizer::new(inner, bos, vec![eos_id], bos.is_some(), identity);
    Ok((tokenizer, tok_hash))
}

/// The token a tokenizer's post-processor puts before every text, if any: the difference
/// between a text encoded with special tokens and without. Any other addition (a token after
/// the text, or several before it) is refused: the harness scores causal models, whose
/// contexts can take one leading token.
fn leading_special_token(inner: &tokenizers::Tokenizer) -> Result<Option<u32>> {
    let encode = |special: bool| -> Result<Vec<u32>> {
        Ok(inner
            .encode_fast("a", special)
            .map_err(|e| anyhow::anyhow!("tokenizing: {e}"))?
            .get_ids()
            .to_vec())
    };
    let (plain, with_special) = (encode(false)?, encode(true)?);
    match with_special.strip_suffix(plain.as_slice()) {
        Some([]) => Ok(None),
        Some([bos]) => Ok(Some(*bos)),
        _ => bail!(
            "it turns {plain:?} into {with_special:?}; zflow scores models whose tokenizer adds \
             at most one token, before the text"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A word-level toy vocabulary with the given post-processor (JSON).
    fn toy(post_processor: &str) -> tokenizers::Tokenizer {
        let json = format!(
            r#"{{"version":"1.0","truncation":null,"padding":null,"added_tokens":[
            {{"id":0,"content":"<bos>","single_word":false,"lstrip":false,"rstrip":false,"normalized":false,"special":true}},
            {{"id":1,"content":"<eos>","single_word":false,"lstrip":false,"rstrip":false,"normalized":false,"special":true}}],
            "normalizer":null,"pre_tokenizer":{{"type":"Whitespace"}},"post_processor":{post_processor},"decoder":null,
            "model":{{"type":"WordLevel","vocab":{{"<bos>":0,"<eos>":1,"a":2,"[UNK]":3}},"unk_token":"[UNK]"}}}}"#
        );
        tokenizers::Tokenizer::from_bytes(json.as_bytes()).unwrap()
    }

    fn template(single: &str) -> String {
        format!(
            r#"{{"type":"TemplateProcessing","single":{single},"pair":{single},
            "special_tokens":{{"<bos>":{{"id":"<bos>","ids":[0],"tokens":["<bos>"]}},
            "<eos>":{{"id":"<eos>","ids":[1],"tokens":["<eos>"]}}}}}}"#
        )
    }

    #[test]
    fn the_post_processors_leading_token_is_the_bos() {
        assert_eq!(leading_special_token(&toy("null")).unwrap(), None);
        // Gemma's tokenizer.json: <bos> before the text.
        let gemma = template(
            r#"[{"SpecialToken":{"id":"<bos>","type_id":0}},{"Sequence":{"id":"A","type_id":0}}]"#,
        );
        assert_eq!(leading_special_token(&toy(&gemma)).unwrap(), Some(0));
        // A token after the text would be fed to the model too: refused, not dropped.
        let trailing = template(
            r#"[{"Sequence":{"id":"A","type_id":0}},{"SpecialToken":{"id":"<eos>","type_id":0}}]"#,
        );
        let err = leading_special_token(&toy(&trailing)).unwrap_err();
        assert!(
            format!("{err}").contains("at most one token, before the text"),
            "{err}"
        );
    }
}
