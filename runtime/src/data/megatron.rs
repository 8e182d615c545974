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
//! of the [`TokenSource`] (that is how Megatron's GPT dataset samples them too).

use std::ffi::OsString;
use std::fs::{self, File};
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, anyhow, bail, ensure};
use memmap2::Mmap;

use super::TokenSource;

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

/// What [`IndexedDatasetWriter::finish`] wrote.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WriteSummary {
    /// Documents written (each is one sequence).
    pub docs: u64,
    /// Tokens written, over all documents.
    pub tokens: u64,
    /// Size of the `.bin` file in bytes.
    pub bin_bytes: u64,
    /// Size of the `.idx` file in bytes.
    pub idx_bytes: u64,
}

/// Streams documents into a new Megatron dataset at a prefix.
///
/// Tokens go straight to the `.bin` through a fixed-size buffer; only one `i32` length per
/// document is kept in memory, for the index written at [`finish`](Self::finish). Both files
/// are written under temporary names and renamed into place only by `finish`, so a crash (or
/// an error, or dropping the writer) never leaves a pair that looks like a complete dataset.
#[derive(Debug)]
pub struct IndexedDatasetWriter {
    dtype: DType,
    bin_path: PathBuf,
    idx_path: PathBuf,
    bin_tmp: PathBuf,
    idx_tmp: PathBuf,
    bin: BufWriter<File>,
    lengths: Vec<i32>,
    tokens: u64,
    /// One document's encoded bytes: a document is fully checked before any of it is written,
    /// so a rejected document leaves the writer as it was.
    scratch: Vec<u8>,
    /// Set once the files are renamed into place, so `Drop` leaves them alone.
    committed: bool,
}

impl IndexedDatasetWriter {
    /// Starts a dataset at `prefix` (`<prefix>.bin` and `<prefix>.idx`, which `finish`
    /// replaces if they exist) with tokens stored as `dtype`. Float dtypes are refused: they
    /// cannot hold token ids exactly.
    pub fn create(prefix: &Path, dtype: DType) -> Result<Self> {
        ensure!(
            !dtype.is_float(),
            "cannot write a Megatron dataset at {} with dtype {dtype}: token ids need an integer dtype",
            prefix.display()
        );
        let bin_tmp = with_suffix(prefix, ".bin.tmp");
        let file =
            File::create(&bin_tmp).with_context(|| format!("creating {}", bin_tmp.display()))?;
        Ok(IndexedDatasetWriter {
            dtype,
            bin_path: bin_path(prefix),
            idx_path: idx_path(prefix),
            bin_tmp,
            idx_tmp: with_suffix(prefix, ".idx.tmp"),
            bin: BufWriter::with_capacity(BIN_BUFFER_BYTES, file),
            lengths: Vec::new(),
            tokens: 0,
            scratch: Vec::new(),
            committed: false,
        })
    }

    /// Appends one document (one sequence). Fails, writing nothing, if a token does not fit
    /// the dtype or the document is longer than an `i32` length allows.
    pub fn add_document(&mut self, tokens: &[u32]) -> Result<()> {
        let doc = self.lengths.len();
        let length = i32::try_from(tokens.len()).map_err(|_| {
            anyhow!(
                "document {doc} has {} tokens; Megatron lengths are i32",
                tokens.len()
            )
        })?;
        self.encode(doc, tokens)?;
        self.bin
            .write_all(&self.scratch)
            .with_context(|| format!("writing {}", self.bin_tmp.display()))?;
        self.lengths.push(length);
        self.tokens += tokens.len() as u64;
        Ok(())
    }

    /// Encodes `tokens` into `self.scratch`, failing on the first token the dtype cannot hold.
    fn encode(&mut self, doc: usize, tokens: &[u32]) -> Result<()> {
        let max = self.dtype.max_token().expect("create refuses float dtypes");
        self.scratch.clear();
        self.scratch.reserve(tokens.len() * self.dtype.size());
        for (pos, &token) in tokens.iter().enumerate() {
            if token > max {
                bail!(
                    "token {token} (position {pos} of document {doc}) does not fit dtype {} \
                     (max {max}) in {}",
                    self.dtype,
                    self.bin_path.display()
                );
            }
            self.dtype.encode(token, &mut self.scratch);
        }
        Ok(())
    }

    /// Writes the index, makes both files durable and renames them into place.
    pub fn finish(mut self) -> Result<WriteSummary> {
        self.sync_bin()?;
        let idx_bytes = self.write_index()?;
        self.commit()?;
        self.committed = true;
        Ok(WriteSummary {
            docs: self.lengths.len() as u64,
            tokens: self.tokens,
            bin_bytes: self.tokens * self.dtype.size() as u64,
            idx_bytes,
        })
    }

    /// Flushes the buffered tokens and fsyncs the `.bin`, so the index never describes data
    /// that is not on disk yet.
    fn sync_bin(&mut self) -> Result<()> {
        let context = || format!("writing {}", self.bin_tmp.display());
        self.bin.flush().with_context(context)?;
        self.bin.get_ref().sync_all().with_context(context)
    }

    /// Writes the `.idx` under its temporary name; returns its size in bytes.
    fn write_index(&self) -> Result<u64> {
        let file = File::create(&self.idx_tmp)
            .with_context(|| format!("creating {}", self.idx_tmp.display()))?;
        let mut out = BufWriter::new(file);
        encode_index(&mut out, self.dtype, &self.lengths)
            .and_then(|()| out.flush())
            .and_then(|()| out.get_ref().sync_all())
            .with_context(|| format!("writing {}", self.idx_tmp.display()))?;
        let n = self.lengths.len();
        Ok((HEADER_LEN + n * BYTES_PER_SEQUENCE + (n + 1) * BYTES_PER_DOC_INDEX) as u64)
    }

    /// Renames the pair into place. The old `.idx` goes first and the new `.idx` last, so at
    /// every instant a reader sees the old pair, a lone `.bin` (which does not open), or the
    /// new pair, never a new `.bin` with an old `.idx`.
    fn commit(&self) -> Result<()> {
        remove_if_exists(&self.idx_path)?;
        rename(&self.bin_tmp, &self.bin_path)?;
        rename(&self.idx_tmp, &self.idx_path)?;
        sync_parent_dir(&self.idx_path)
    }
}

impl Drop for IndexedDatasetWriter {
    /// An unfinished writer (an error, a panic, or `finish` never called) removes its
    /// temporary files: they are not a dataset and nothing else would clean them up.
    fn drop(&mut self) {
        if !self.committed {
            let _ = fs::remove_file(&self.bin_tmp);
            let _ = fs::remove_file(&self.idx_tmp);
        }
    }
}

/// Writes a whole `.idx` for one sequence per document with the given lengths.
fn encode_index(out: &mut impl Write, dtype: DType, lengths: &[i32]) -> io::Result<()> {
    let n = lengths.len() as u64;
    out.write_all(MAGIC)?;
    out.write_all(&VERSION.to_le_bytes())?;
    out.write_all(&[dtype.code()])?;
    out.write_all(&n.to_le_bytes())?; // sequences
    out.write_all(&(n + 1).to_le_bytes())?; // document-index entries
    for length in lengths {
        out.write_all(&length.to_le_bytes())?;
    }
    let mut pointer: i64 = 0;
    for &length in lengths {
        out.write_all(&pointer.to_le_bytes())?;
        pointer += i64::from(length) * dtype.size() as i64;
    }
    // One sequence per document: document d ends at sequence d + 1.
    for end in 0..=n as i64 {
        out.write_all(&end.to_le_bytes())?;
    }
    Ok(())
}

fn remove_if_exists(path: &Path) -> Result<()> {
    match fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => {
            Err(e).with_context(|| format!("removing {}", path.display()))
        }
        _ => Ok(()),
    }
}

fn rename(from: &Path, to: &Path) -> Result<()> {
    fs::rename(from, to).with_context(|| format!("renaming {} to {}", from.display(), to.display()))
}

/// Fsyncs the directory holding `path`, so the renames survive a power loss.
fn sync_parent_dir(path: &Path) -> Result<()> {
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    File::open(dir)
        .and_then(|d| d.sync_all())
        .with_context(|| format!("syncing directory {}", dir.display()))
}

/// A Megatron dataset opened for reading: both files memory-mapped, fully validated at
/// [`open`](Self::open) so that reads afterwards only fail on token values that are not
/// `u32` ids.
#[derive(Debug)]
pub struct IndexedDataset {
    bin_path: PathBuf,
    idx: Mmap,
    bin: Mmap,
    dtype: DType,
    num_sequences: usize,
    num_doc_indices: usize,
    total_tokens: u64,
}

/// The fixed-size start of an `.idx` file.
struct Header {
    dtype: DType,
    sequences: u64,
    doc_indices: u64,
}

impl IndexedDataset {
    /// Opens the dataset at `prefix` and checks it: magic, version, an integer dtype, file
    /// sizes against the counts, the document index (starts at 0, never decreases, ends at
    /// the sequence count) and that the sequences lie back to back and fill the `.bin` exactly.
    /// Errors name the file and what is wrong.
    pub fn open(prefix: &Path) -> Result<Self> {
        let idx_path = idx_path(prefix);
        let bin_path = bin_path(prefix);
        let idx = map(&idx_path)?;
        let bin = map(&bin_path)?;
        let header = parse_header(&idx, &idx_path)?;
        let (num_sequences, num_doc_indices) = check_index_len(&idx, &header, &idx_path)?;
        let mut dataset = IndexedDataset {
            bin_path,
            idx,
            bin,
            dtype: header.dtype,
            num_sequences,
            num_doc_indices,
            total_tokens: 0,
        };
        dataset.check_document_indices(&idx_path)?;
        dataset.total_tokens = dataset.check_sequences(&idx_path)?;
        Ok(dataset)
    }

    /// The token dtype.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Number of sequences (Megatron's `len(dataset)`).
    pub fn num_sequences(&self) -> usize {
        self.num_sequences
    }

    /// Number of documents: entries in the document index minus one.
    pub fn num_documents(&self) -> usize {
        self.num_doc_indices - 1
    }

    /// The document index: `0`, then for each document the sequence index where it ends, so
    /// document `d` holds sequences `indices[d] .. indices[d + 1]`. Built on each call (the
    /// entries are not aligned in the file, so they cannot be borrowed).
    pub fn document_indices(&self) -> Vec<usize> {
        (0..self.num_doc_indices)
            .map(|i| self.doc_index(i))
            .collect()
    }

    /// Total tokens over all sequences.
    pub fn total_tokens(&self) -> u64 {
        self.total_tokens
    }

    /// Length in tokens of sequence `seq`. Panics if `seq` is out of range.
    pub fn sequence_len(&self, seq: usize) -> usize {
        assert!(
            seq < self.num_sequences,
            "sequence {seq} of {}",
            self.num_sequences
        );
        // Checked non-negative at open.
        self.raw_len(seq) as usize
    }

    /// All tokens of sequence `seq`. Fails only on a token that is not a `u32` id (a negative
    /// value); panics if `seq` is out of range.
    pub fn sequence(&self, seq: usize) -> Result<Vec<u32>> {
        let mut tokens = vec![0; self.sequence_len(seq)];
        self.read_tokens(seq, 0, &mut tokens)?;
        Ok(tokens)
    }

    /// Copies tokens `offset .. offset + out.len()` of sequence `seq` into `out`. Fails only
    /// on a token that is not a `u32` id; panics if the range is out of bounds.
    pub fn read_tokens(&self, seq: usize, offset: usize, out: &mut [u32]) -> Result<()> {
        let len = self.sequence_len(seq);
        assert!(
            offset <= len && out.len() <= len - offset,
            "tokens {offset}..{} out of range for sequence {seq} of length {len}",
            offset + out.len()
        );
        let size = self.dtype.size();
        let start = self.pointer(seq) as usize + offset * size;
        let bytes = &self.bin[start..start + out.len() * size];
        self.dtype.decode(bytes, out).map_err(|value| {
            anyhow!(
                "{}: sequence {seq} holds {value}, which is not a token id",
                self.bin_path.display()
            )
        })
    }

    /// The largest token id in the dataset (`None` when it holds no tokens), read through
    /// the whole `.bin` in blocks of 1 Mi tokens. Fails on a value that is not a `u32` id.
    pub fn max_token_id(&self) -> Result<Option<u32>> {
        let size = self.dtype.size();
        let mut buf = vec![0u32; 1 << 20];
        let mut max = None;
        for block in self.bin.chunks(buf.len() * size) {
            let out = &mut buf[..block.len() / size];
            self.dtype
                .decode(&block[..out.len() * size], out)
                .map_err(|value| {
                    anyhow!(
                        "{} holds {value}, which is not a token id",
                        self.bin_path.display()
                    )
                })?;
            max = max.max(out.iter().copied().max());
        }
        Ok(max)
    }

    /// Checks the document index: starts at 0, never decreases, ends at the sequence count
    /// (the same invariant Megatron asserts when it opens a dataset).
    fn check_document_indices(&self, idx_path: &Path) -> Result<()> {
        let first = self.raw_doc_index(0);
        ensure!(
            first == 0,
            "{}: document index starts at {first}, not 0",
            idx_path.display()
        );
        let mut previous = 0;
        for i in 1..self.num_doc_indices {
            let end = self.raw_doc_index(i);
            ensure!(
                end >= previous,
                "{}: document index entry {i} is {end}, less than the entry before it ({previous})",
                idx_path.display()
            );
            previous = end;
        }
        ensure!(
            previous == self.num_sequences as i64,
            "{}: document index ends at sequence {previous}, but there are {} sequences",
            idx_path.display(),
            self.num_sequences
        );
        Ok(())
    }

    /// Checks every length is non-negative and every pointer starts where the previous
    /// sequence ended (as every Megatron writer lays them out), and that the sequences fill
    /// the `.bin` exactly. Returns the total token count.
    fn check_sequences(&self, idx_path: &Path) -> Result<u64> {
        let size = self.dtype.size() as u64;
        let mut expected_pointer: u64 = 0;
        for seq in 0..self.num_sequences {
            let len = self.raw_len(seq);
            ensure!(
                len >= 0,
                "{}: sequence {seq} has length {len}",
                idx_path.display()
            );
            let pointer = self.raw_pointer(seq);
            ensure!(
                u64::try_from(pointer) == Ok(expected_pointer),
                "{}: sequence {seq} starts at byte {pointer} of the .bin, expected \
                 {expected_pointer} (right after the sequence before it)",
                idx_path.display()
            );
            expected_pointer += len as u64 * size;
        }
        self.check_bin_len(expected_pointer)?;
        Ok(expected_pointer / size)
    }

    /// The `.bin` must hold exactly the bytes the index describes: fewer means a truncated
    /// file, more means the two files do not belong together.
    fn check_bin_len(&self, expected: u64) -> Result<()> {
        let actual = self.bin.len() as u64;
        ensure!(
            actual >= expected,
            "{}: truncated: {actual} bytes, but the index describes {expected}",
            self.bin_path.display()
        );
        ensure!(
            actual == expected,
            "{}: {actual} bytes, but the index describes only {expected} (is the .idx from \
             another dataset?)",
            self.bin_path.display()
        );
        Ok(())
    }

    fn raw_len(&self, seq: usize) -> i32 {
        let at = HEADER_LEN + seq * 4;
        i32::from_le_bytes(self.idx[at..at + 4].try_into().unwrap())
    }

    fn raw_pointer(&self, seq: usize) -> i64 {
        let at = HEADER_LEN + self.num_sequences * 4 + seq * 8;
        le_i64(&self.idx, at)
    }

    fn raw_doc_index(&self, i: usize) -> i64 {
        let at = HEADER_LEN + self.num_sequences * BYTES_PER_SEQUENCE + i * BYTES_PER_DOC_INDEX;
        le_i64(&self.idx, at)
    }

    /// Byte offset of sequence `seq` in the `.bin` (checked non-negative at open).
    fn pointer(&self, seq: usize) -> u64 {
        self.raw_pointer(seq) as u64
    }

    /// Entry `i` of the document index (checked to lie in `0..=num_sequences` at open).
    fn doc_index(&self, i: usize) -> usize {
        self.raw_doc_index(i) as usize
    }
}

/// Megatron's data loader sees sequences, so each sequence is one document here; for zflow's
/// own datasets the two are the same.
impl TokenSource for IndexedDataset {
    fn num_docs(&self) -> usize {
        self.num_sequences
    }

    fn doc_len(&self, doc: usize) -> usize {
        self.sequence_len(doc)
    }

    fn read(&self, doc: usize, offset: usize, out: &mut [u32]) -> Result<()> {
        self.read_tokens(doc, offset, out)
    }
}

/// Memory-maps `path` read-only.
fn map(path: &Path) -> Result<Mmap> {
    let file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
    // SAFETY: the mapping is only sound while no one modifies or truncates the file. Datasets
    // are written once under a temporary name and then only read, as in Megatron, which maps
    // them the same way.
    unsafe { Mmap::map(&file) }.with_context(|| format!("memory-mapping {}", path.display()))
}

fn le_u64(bytes: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap())
}

fn le_i64(bytes: &[u8], at: usize) -> i64 {
    i64::from_le_bytes(bytes[at..at + 8].try_into().unwrap())
}

/// Reads and checks the fixed-size header.
fn parse_header(idx: &[u8], path: &Path) -> Result<Header> {
    let path = path.display();
    ensure!(
        idx.len() >= HEADER_LEN,
        "{path}: truncated: {} bytes, shorter than the {HEADER_LEN}-byte header",
        idx.len()
    );
    ensure!(
        &idx[..9] == MAGIC,
        "{path}: bad magic {:?}, not a Megatron MMIDIDX index",
        String::from_utf8_lossy(&idx[..9])
    );
    let version = le_u64(idx, 9);
    ensure!(
        version == VERSION,
        "{path}: unsupported version {version} (only {VERSION} is known)"
    );
    let code = idx[17];
    let dtype =
        DType::from_code(code).ok_or_else(|| anyhow!("{path}: unknown dtype code {code}"))?;
    ensure!(
        !dtype.is_float(),
        "{path}: dtype {dtype} (code {code}) cannot hold token ids"
    );
    Ok(Header {
        dtype,
        sequences: le_u64(idx, 18),
        doc_indices: le_u64(idx, 26),
    })
}

/// Checks the `.idx` is as long as its counts say; returns the counts as `usize`. Megatron's
/// multimodal datasets add one mode byte per sequence, which is accepted and ignored.
fn check_index_len(idx: &[u8], header: &Header, path: &Path) -> Result<(usize, usize)> {
    let path = path.display();
    ensure!(
        header.doc_indices >= 1,
        "{path}: the document index has no entries (it always starts with 0)"
    );
    let expected = (header.sequences as u128) * BYTES_PER_SEQUENCE as u128
        + (header.doc_indices as u128) * BYTES_PER_DOC_INDEX as u128
        + HEADER_LEN as u128;
    let actual = idx.len() as u128;
    let with_modes = expected + header.sequences as u128;
    ensure!(
        actual >= expected,
        "{path}: truncated: {actual} bytes, but {} sequences and {} document-index entries \
         need {expected}",
        header.sequences,
        header.doc_indices
    );
    ensure!(
        actual == expected || actual == with_modes,
        "{path}: {actual} bytes, more than the {expected} that {} sequences and {} \
         document-index entries need",
        header.sequences,
        header.doc_indices
    );
    // Both counts fit in usize: the file holding them is mapped in memory.
    Ok((header.sequences as usize, header.doc_indices as usize))
}

#[cfg(test)]
mod tests;
