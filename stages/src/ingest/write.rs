//! `documents.parquet`: the kept documents, written as they come.

use std::path::Path;
use std::sync::Arc;

use anyhow::Result;
use arrow::array::{ArrayRef, RecordBatch, StringArray, UInt64Array};
use arrow::datatypes::{DataType, Field, Schema};
use parquet::arrow::ArrowWriter;

/// `documents.parquet`, written in row groups of [`DocWriter::CHUNK`] documents as they come.
pub(super) struct DocWriter {
    writer: ArrowWriter<std::fs::File>,
    schema: Arc<Schema>,
    source: String,
    next_id: u64,
    pending: Vec<String>,
}

impl DocWriter {
    const CHUNK: usize = 8192;

    pub(super) fn create(out: &Path, source: &str) -> Result<DocWriter> {
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::UInt64, false),
            Field::new("source", DataType::Utf8, false),
            Field::new("text", DataType::Utf8, false),
        ]));
        let props = parquet::file::properties::WriterProperties::builder()
            .set_compression(parquet::basic::Compression::SNAPPY)
            .build();
        let file = std::fs::File::create(out.join("documents.parquet"))?;
        let writer = ArrowWriter::try_new(file, schema.clone(), Some(props))?;
        Ok(DocWriter {
            writer,
            schema,
            source: source.to_string(),
            next_id: 0,
            pending: Vec::new(),
        })
    }

    pub(super) fn push(&mut self, text: String) -> Result<()> {
        self.pending.push(text);
        if self.pending.len() >= Self::CHUNK {
            self.flush()?;
        }
        Ok(())
    }

    fn flush(&mut self) -> Result<()> {
        if self.pending.is_empty() {
            return Ok(());
        }
        let n = self.pending.len();
        let ids = UInt64Array::from_iter_values(self.next_id..self.next_id + n as u64);
        let sources = StringArray::from(vec![self.source.as_str(); n]);
        let texts = StringArray::from_iter_values(self.pending.iter());
        let cols: Vec<ArrayRef> = vec![Arc::new(ids), Arc::new(sources), Arc::new(texts)];
        self.writer
            .write(&RecordBatch::try_new(self.schema.clone(), cols)?)?;
        // Row groups of exactly CHUNK documents, whatever the file boundaries: deterministic bytes.
        self.writer.flush()?;
        self.next_id += n as u64;
        self.pending.clear();
        Ok(())
    }

    pub(super) fn finish(mut self) -> Result<()> {
        self.flush()?;
        self.writer.close()?;
        Ok(())
    }
}
