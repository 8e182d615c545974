//! Reading the documents an `ingest` stage wrote (`documents.parquet`: id, source, text).

use std::path::Path;

use anyhow::{Context, Result};
use arrow::array::{Array, StringArray};
use parquet::arrow::arrow_reader::{ParquetRecordBatchReader, ParquetRecordBatchReaderBuilder};

/// Streams the `text` column in batches of up to `batch` documents, in file order, holding
/// one batch in memory at a time.
pub fn stream(path: &Path, batch: usize) -> Result<impl Iterator<Item = Result<Vec<String>>>> {
    let file = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let reader: ParquetRecordBatchReader = ParquetRecordBatchReaderBuilder::try_new(file)
        .with_context(|| format!("{} is not a Parquet file", path.display()))?
        .with_batch_size(batch)
        .build()?;
    let shown = path.display().to_string();
    Ok(reader.map(move |b| {
        let b = b?;
        let col = b
            .column_by_name("text")
            .with_context(|| format!("{shown} has no `text` column"))?;
        let texts = col
            .as_any()
            .downcast_ref::<StringArray>()
            .with_context(|| format!("{shown}: `text` is not a string column"))?;
        Ok((0..texts.len())
            .map(|i| texts.value(i).to_string())
            .collect())
    }))
}

/// The first documents of the file, up to `max_bytes` of text (at least one document).
pub fn sample(path: &Path, max_bytes: u64) -> Result<Vec<String>> {
    let mut out = Vec::new();
    let mut bytes = 0u64;
    for batch in stream(path, 1024)? {
        for text in batch? {
            if bytes >= max_bytes && !out.is_empty() {
                return Ok(out);
            }
            bytes += text.len() as u64;
            out.push(text);
        }
    }
    Ok(out)
}

/// Number of documents in the file (from the Parquet footer).
pub fn count(path: &Path) -> Result<u64> {
    let file = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let meta = ParquetRecordBatchReaderBuilder::try_new(file)?
        .metadata()
        .clone();
    Ok(meta.file_metadata().num_rows() as u64)
}
