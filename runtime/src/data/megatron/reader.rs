//! Reading a Megatron dataset: both files memory-mapped and checked at open, sequences read
//! by index.

use std::path::{Path, PathBuf};

use anyhow::{Result, anyhow, ensure};
use memmap2::Mmap;

use super::*;
use crate::data::TokenSource;

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
        let idx = zflow_files::map::read_only(&idx_path)?;
        let bin = zflow_files::map::read_only(&bin_path)?;
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

    fn num_tokens(&self) -> u64 {
        self.total_tokens
    }
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
