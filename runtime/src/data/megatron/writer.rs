//! Writing a Megatron dataset: documents streamed to `<prefix>.bin`, the index written at
//! the end, both under temporary names and renamed into place.

use std::fs::{self, File};
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, anyhow, bail, ensure};

use super::*;
use zflow_files::atomic;

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
        atomic::rename(&self.bin_tmp, &self.bin_path)?;
        atomic::rename(&self.idx_tmp, &self.idx_path)?;
        atomic::sync_parent(&self.idx_path)
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
