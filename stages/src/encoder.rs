//! Encoding documents to token ids: Hugging Face `tokenizers`, with a shorter path for the
//! tokenizers zflow trains (byte-level BPE).
//!
//! `Tokenizer::encode_fast` builds a full `Encoding` for every document: a normalised string
//! with an alignment per byte, the pre-tokenized splits, and a string, an offset pair and masks
//! per token. Training wants the ids only. For a tokenizer with no normaliser, the GPT-2
//! byte-level pre-tokenizer (its regex, no prefix space) and a BPE model without dropout, the
//! ids are: split the text with that regex, map each split's bytes to GPT-2's byte characters,
//! and run the BPE model on each split (its word cache included). That is what
//! [`ByteLevelBpe`] does, with the same regex engine (onig) and the tokenizer's own model, so the
//! ids are the same; `tests` checks them against `encode_fast` on this repository's text, and
//! `zflow bench tokenize` on every document of a recipe's source. A document holding one of the
//! tokenizer's added tokens (which `tokenizers` splits out first) goes through `encode_fast`,
//! as does every document of any other tokenizer.

use anyhow::Result;
use tokenizers::models::ModelWrapper;
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::utils::SysRegex;
use tokenizers::{Model, Tokenizer};

/// The GPT-2 pre-tokenizer's regex, as `tokenizers`' ByteLevel has it.
const GPT2_SPLIT: &str =
    r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";

/// Encodes documents (without special tokens) as `tokenizer` does.
pub enum Encoder<'a> {
    /// The short path for byte-level BPE.
    ByteLevel(Box<ByteLevelBpe<'a>>),
    /// Any other tokenizer: `encode_fast`.
    General(&'a Tokenizer),
}

/// The byte-level BPE path: regex splits, byte characters, the tokenizer's BPE model.
pub struct ByteLevelBpe<'a> {
    tokenizer: &'a Tokenizer,
    split: SysRegex,
    /// GPT-2's character for each byte.
    byte_char: [char; 256],
    /// The added tokens' texts: a document holding one goes through `encode_fast`.
    added: Vec<String>,
}

impl<'a> Encoder<'a> {
    /// The encoder for `tokenizer`: the short path when it applies.
    pub fn new(tokenizer: &'a Tokenizer) -> Encoder<'a> {
        let byte_level = matches!(
            tokenizer.get_pre_tokenizer(),
            Some(PreTokenizerWrapper::ByteLevel(b)) if b.use_regex && !b.add_prefix_space
        );
        let plain_bpe = matches!(
            tokenizer.get_model(),
            ModelWrapper::BPE(bpe) if bpe.dropout.is_none()
        );
        if !(byte_level && plain_bpe && tokenizer.get_normalizer().is_none()) {
            return Encoder::General(tokenizer);
        }
        let Ok(split) = SysRegex::new(GPT2_SPLIT) else {
            return Encoder::General(tokenizer);
        };
        let added = tokenizer
            .get_added_tokens_decoder()
            .values()
            .map(|t| t.content.clone())
            .filter(|c| !c.is_empty())
            .collect();
        Encoder::ByteLevel(Box::new(ByteLevelBpe {
            tokenizer,
            split,
            byte_char: byte_chars(),
            added,
        }))
    }

    /// Whether the short path is in use.
    pub fn is_byte_level(&self) -> bool {
        matches!(self, Encoder::ByteLevel(_))
    }

    /// Whether this encoder's ids for `text` are `encode_fast`'s (a check for tests: it runs
    /// both).
    pub fn agrees_with_encode_fast(&self, text: &str) -> Result<bool> {
        let mut ids = Vec::new();
        self.encode_into(text, &mut ids)?;
        let mut want = Vec::new();
        general(self.tokenizer(), text, &mut want)?;
        Ok(ids == want)
    }

    fn tokenizer(&self) -> &Tokenizer {
        match self {
            Encoder::General(t) => t,
            Encoder::ByteLevel(b) => b.tokenizer,
        }
    }

    /// The ids of `text` (no special tokens added), appended to `out`.
    pub fn encode_into(&self, text: &str, out: &mut Vec<u32>) -> Result<()> {
        match self {
            Encoder::General(t) => general(t, text, out),
            Encoder::ByteLevel(b) => {
                if b.added.iter().any(|a| text.contains(a.as_str())) {
                    return general(b.tokenizer, text, out);
                }
                b.encode_into(text, out)
            }
        }
    }
}

fn general(tokenizer: &Tokenizer, text: &str, out: &mut Vec<u32>) -> Result<()> {
    let enc = tokenizer
        .encode_fast(text, false)
        .map_err(|e| anyhow::anyhow!("encoding a document: {e}"))?;
    out.extend_from_slice(enc.get_ids());
    Ok(())
}

impl ByteLevelBpe<'_> {
    fn encode_into(&self, text: &str, out: &mut Vec<u32>) -> Result<()> {
        let model = self.tokenizer.get_model();
        let mut word = String::new();
        let mut piece = |range: &str| -> Result<()> {
            word.clear();
            word.extend(range.bytes().map(|b| self.byte_char[b as usize]));
            let tokens = model
                .tokenize(&word)
                .map_err(|e| anyhow::anyhow!("encoding a document: {e}"))?;
            out.extend(tokens.iter().map(|t| t.id));
            Ok(())
        };
        // The splits of `tokenizers`' `Isolated` behaviour: every match, and the text between.
        let mut previous = 0;
        for (start, end) in self.split.find_iter(text) {
            if previous != start {
                piece(&text[previous..start])?;
            }
            if start != end {
                piece(&text[start..end])?;
            }
            previous = end;
        }
        if previous != text.len() {
            piece(&text[previous..])?;
        }
        Ok(())
    }
}

/// GPT-2's map of bytes to printable characters (`bytes_to_unicode` in its encoder.py): the
/// printable Latin-1 bytes stand for themselves, the others for 256 + their rank among them.
fn byte_chars() -> [char; 256] {
    let printable = |b: u8| matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
    let mut out = ['\0'; 256];
    let mut next = 256u32;
    for b in 0..=255u8 {
        out[b as usize] = if printable(b) {
            char::from(b)
        } else {
            let c = char::from_u32(next).expect("256..512 are characters");
            next += 1;
            c
        };
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A byte-level BPE trained as the tokenizer stage trains one, on this crate's sources.
    fn trained() -> (Tokenizer, Vec<String>) {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut texts = Vec::new();
        for e in std::fs::read_dir(&root).unwrap().flatten() {
            if let Ok(t) = std::fs::read_to_string(e.path()) {
                texts.extend(t.split("\n\n").map(String::from));
            }
        }
        // Text that needs the other bytes: accents, CJK, emoji, tabs, CR, a control byte.
        texts.push("Café naïve — 東京 🚀\tend\r\nline\u{1}  x   y \n\n\n".into());
        texts.push("  leading and trailing spaces  ".into());
        texts.push(String::new());
        let c: crate::tokenizer::TokenizerConfig =
            serde_json::from_value(serde_json::json!({"train": {"vocab_size": 600}})).unwrap();
        let samples = [("src".to_string(), texts.clone())].into_iter().collect();
        let tokenizer = crate::tokenizer::train(&c, c.train.as_ref().unwrap(), &samples).unwrap();
        texts.push("a document with <eos> inside it, and <bos>".into());
        (tokenizer, texts)
    }

    #[test]
    fn the_byte_level_path_gives_encode_fasts_ids() {
        let (tokenizer, texts) = trained();
        let encoder = Encoder::new(&tokenizer);
        assert!(encoder.is_byte_level());
        for text in &texts {
            let mut ids = Vec::new();
            encoder.encode_into(text, &mut ids).unwrap();
            let want = tokenizer.encode_fast(text.as_str(), false).unwrap();
            assert_eq!(ids, want.get_ids(), "{text:?}");
        }
        let bytes = byte_chars();
        assert_eq!(
            (
                bytes[b' ' as usize],
                bytes[b'\n' as usize],
                bytes[b'a' as usize]
            ),
            ('Ġ', 'Ċ', 'a')
        );
    }
}
