//! Megatron-LM compatible indexed datasets: a `<prefix>.bin` of tokens and a `<prefix>.idx`
//! that says where each sequence starts, in the `MMIDIDX` version 1 format read by
//! `megatron/core/datasets/indexed_dataset.py`.
//!
//! The `.idx` file, all integers little-endian:
//!
//! ```text
//! magic             9 bytes  b"MMIDIDX\x00\x00"
//! version           u64      1
//! dtype code        u8       see [`DType::code`]
//! sequence count    u64      S
//! document count    u64      D (entries in the document index: documents + 1)
//! sequence lengths  i32 × S  in tokens
//! sequence pointers i64 × S  byte offsets into the .bin
//! document indices  i64 × D  0, then the sequence index where each document ends
//! ```
//!
//! Megatron's multimodal datasets append one `i8` mode per sequence; the reader accepts and
//! ignores it. The `.bin` file is every sequence's tokens back to back in the dtype.
//!
//! Megatron lets a document hold several sequences. zflow writes exactly one sequence per
//! document, and reads datasets from other tools by treating each *sequence* as a document
//! of the [`TokenSource`](crate::data::TokenSource) (that is how Megatron's GPT dataset samples them too).

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use anyhow::Result;

/// The 9 bytes every `.idx` file starts with.
const MAGIC: &[u8; 9] = b"MMIDIDX\x00\x00";
/// The only index version Megatron has ever written.
const VERSION: u64 = 1;
/// Magic, version, dtype code, sequence count, document count.
const HEADER_LEN: usize = 9 + 8 + 1 + 8 + 8;
/// Bytes per sequence in the index: an i32 length and an i64 pointer.
const BYTES_PER_SEQUENCE: usize = 4 + 8;
/// Bytes per document-index entry (an i64).
const BYTES_PER_DOC_INDEX: usize = 8;
/// Buffer for `.bin` writes: large enough that writes are sequential and cheap, small enough
/// that a writer's memory stays bounded however large the dataset grows.
const BIN_BUFFER_BYTES: usize = 1 << 20;

/// The element type of a dataset's tokens, with Megatron's numeric codes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    /// `uint8`, code 1.
    U8,
    /// `int8`, code 2.
    I8,
    /// `int16`, code 3.
    I16,
    /// `int32`, code 4: Megatron's choice for vocabularies too large for `u16`.
    I32,
    /// `int64`, code 5.
    I64,
    /// `float32`, code 7. Exists in the format, but cannot hold token ids: never read or written.
    F32,
    /// `float64`, code 6. Exists in the format, but cannot hold token ids: never read or written.
    F64,
    /// `uint16`, code 8: Megatron's choice for vocabularies below 65,500 tokens.
    U16,
}

impl DType {
    /// Every dtype, in code order.
    pub const ALL: [DType; 8] = [
        DType::U8,
        DType::I8,
        DType::I16,
        DType::I32,
        DType::I64,
        DType::F64,
        DType::F32,
        DType::U16,
    ];

    /// Megatron's numeric code for this dtype, as stored in the `.idx` header.
    ///
    /// Note the float codes: Megatron's `DType` enum has `float64 = 6` and `float32 = 7`.
    pub fn code(self) -> u8 {
        match self {
            DType::U8 => 1,
            DType::I8 => 2,
            DType::I16 => 3,
            DType::I32 => 4,
            DType::I64 => 5,
            DType::F64 => 6,
            DType::F32 => 7,
            DType::U16 => 8,
        }
    }

    /// The dtype with Megatron code `code`, or `None` for a code Megatron does not define.
    pub fn from_code(code: u8) -> Option<DType> {
        DType::ALL.into_iter().find(|d| d.code() == code)
    }

    /// Size of one element in bytes.
    pub fn size(self) -> usize {
        match self {
            DType::U8 | DType::I8 => 1,
            DType::I16 | DType::U16 => 2,
            DType::I32 | DType::F32 => 4,
            DType::I64 | DType::F64 => 8,
        }
    }

    /// The dtype Megatron's `preprocess_data.py` picks for a tokenizer with `vocab_size` ids
    /// (`DType.optimal_dtype`): `U16` below 65,500, otherwise `I32`.
    ///
    /// The cutoff is Megatron's, not the `u16` range (65,536): matching it means zflow and
    /// Megatron write byte-identical datasets for the same tokenizer.
    pub fn for_vocab(vocab_size: usize) -> DType {
        if vocab_size < 65_500 {
            DType::U16
        } else {
            DType::I32
        }
    }

    /// The short name used in messages (`u16`, `i32`, ...).
    pub fn name(self) -> &'static str {
        match self {
            DType::U8 => "u8",
            DType::I8 => "i8",
            DType::I16 => "i16",
            DType::I32 => "i32",
            DType::I64 => "i64",
            DType::F32 => "f32",
            DType::F64 => "f64",
            DType::U16 => "u16",
        }
    }

    /// Whether this is a floating-point dtype, which cannot hold token ids.
    pub fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F64)
    }

    /// The largest token id this dtype holds (`None` for float dtypes).
    fn max_token(self) -> Option<u32> {
        match self {
            DType::U8 => Some(u8::MAX.into()),
            DType::I8 => Some(i8::MAX as u32),
            DType::I16 => Some(i16::MAX as u32),
            DType::U16 => Some(u16::MAX.into()),
            DType::I32 => Some(i32::MAX as u32),
            DType::I64 => Some(u32::MAX),
            DType::F32 | DType::F64 => None,
        }
    }

    /// Appends `token` to `out` in this dtype. The caller has checked it against `max_token`,
    /// so the narrowing casts below never lose bits.
    fn encode(self, token: u32, out: &mut Vec<u8>) {
        match self {
            DType::U8 => out.push(token as u8),
            DType::I8 => out.push(token as i8 as u8),
            DType::I16 => out.extend_from_slice(&(token as i16).to_le_bytes()),
            DType::U16 => out.extend_from_slice(&(token as u16).to_le_bytes()),
            DType::I32 => out.extend_from_slice(&(token as i32).to_le_bytes()),
            DType::I64 => out.extend_from_slice(&i64::from(token).to_le_bytes()),
            DType::F32 | DType::F64 => unreachable!("float dtypes are rejected before encoding"),
        }
    }

    /// Decodes `out.len()` tokens from `bytes`. On a value that is not a `u32` (a negative
    /// id, or an `i64` above `u32::MAX`), returns that value.
    fn decode(self, bytes: &[u8], out: &mut [u32]) -> Result<(), i64> {
        debug_assert_eq!(bytes.len(), out.len() * self.size());
        match self {
            DType::U8 => decode_with(bytes, out, |b: [u8; 1]| b[0].into()),
            DType::I8 => decode_with(bytes, out, |b: [u8; 1]| i8::from_le_bytes(b).into()),
            DType::I16 => decode_with(bytes, out, |b| i16::from_le_bytes(b).into()),
            DType::U16 => decode_with(bytes, out, |b| u16::from_le_bytes(b).into()),
            DType::I32 => decode_with(bytes, out, |b| i32::from_le_bytes(b).into()),
            DType::I64 => decode_with(bytes, out, i64::from_le_bytes),
            DType::F32 | DType::F64 => unreachable!("float datasets are rejected at open"),
        }
    }
}

impl std::fmt::Display for DType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Decodes fixed-size little-endian elements of `N` bytes with `widen`, checking each fits
/// a `u32`.
fn decode_with<const N: usize>(
    bytes: &[u8],
    out: &mut [u32],
    widen: impl Fn([u8; N]) -> i64,
) -> Result<(), i64> {
    for (slot, chunk) in out.iter_mut().zip(bytes.chunks_exact(N)) {
        let value = widen(chunk.try_into().expect("chunks_exact yields N bytes"));
        *slot = u32::try_from(value).map_err(|_| value)?;
    }
    Ok(())
}

/// `<prefix><suffix>`, e.g. `data/web` + `.bin`. Not `Path::with_extension`, which would
/// replace a dot already in the prefix (`web.v2` would become `web.bin`).
fn with_suffix(prefix: &Path, suffix: &str) -> PathBuf {
    let mut name = OsString::from(prefix.as_os_str());
    name.push(suffix);
    PathBuf::from(name)
}

/// The `.bin` path of the dataset at `prefix`.
pub fn bin_path(prefix: &Path) -> PathBuf {
    with_suffix(prefix, ".bin")
}

/// The `.idx` path of the dataset at `prefix`.
pub fn idx_path(prefix: &Path) -> PathBuf {
    with_suffix(prefix, ".idx")
}

mod reader;
mod writer;

pub use reader::IndexedDataset;
pub use writer::{IndexedDatasetWriter, WriteSummary};

#[cfg(test)]
mod tests;
