//! What an `ingest` stage reports: documents and bytes read, kept and dropped per rule, in
//! `stats.json` ([`IngestStats`]; a sharded source's `dedup` stage reads each shard's) and in
//! `stats.parquet` (`source`, `rule`, `documents`, `bytes`: `read`, `kept`, `dropped:<rule>`,
//! `edited:<filter>`, `overlaps:<eval task>`).

use std::path::Path;
use std::sync::Arc;

use anyhow::Result;
use arrow::array::{RecordBatch, StringArray, UInt64Array};
use arrow::datatypes::{DataType, Field, Schema};
use parquet::arrow::ArrowWriter;
use serde::{Deserialize, Serialize};

/// Counts of documents and bytes per rule.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct IngestStats {
    /// Documents read.
    pub docs_in: u64,
    /// Bytes of text read.
    pub bytes_in: u64,
    /// Documents written.
    pub docs_out: u64,
    /// Bytes written.
    pub bytes_out: u64,
    /// (rule, documents dropped, bytes dropped), in the order rules apply.
    pub dropped: Vec<(String, u64, u64)>,
    /// (filter, documents edited, their bytes before the edit, edits): C4's removed lines and
    /// the PII filter's redacted addresses.
    #[serde(default)]
    pub edited: Vec<(String, u64, u64, u64)>,
    /// (eval task, documents sharing an n-gram with its test documents, of those removed),
    /// with `decontaminate` ([`crate::decontaminate`]).
    #[serde(default)]
    pub contamination: Vec<(String, u64, u64)>,
}

/// Writes `stats.parquet` and `stats.json` of `source` into `out`.
pub fn write(out: &Path, source: &str, stats: &IngestStats) -> Result<()> {
    let stat_schema = Arc::new(Schema::new(vec![
        Field::new("source", DataType::Utf8, false),
        Field::new("rule", DataType::Utf8, false),
        Field::new("documents", DataType::UInt64, false),
        Field::new("bytes", DataType::UInt64, false),
    ]));
    let mut rows: Vec<(String, u64, u64)> = vec![
        ("read".into(), stats.docs_in, stats.bytes_in),
        ("kept".into(), stats.docs_out, stats.bytes_out),
    ];
    rows.extend(
        stats
            .dropped
            .iter()
            .map(|(r, d, b)| (format!("dropped:{r}"), *d, *b)),
    );
    rows.extend(
        stats
            .contamination
            .iter()
            .map(|(t, overlapping, _)| (format!("overlaps:{t}"), *overlapping, 0)),
    );
    rows.extend(
        stats
            .edited
            .iter()
            .map(|(r, d, b, _)| (format!("edited:{r}"), *d, *b)),
    );
    let batch = RecordBatch::try_new(
        stat_schema.clone(),
        vec![
            Arc::new(StringArray::from(vec![source; rows.len()])),
            Arc::new(StringArray::from_iter_values(
                rows.iter().map(|r| r.0.as_str()),
            )),
            Arc::new(UInt64Array::from_iter_values(rows.iter().map(|r| r.1))),
            Arc::new(UInt64Array::from_iter_values(rows.iter().map(|r| r.2))),
        ],
    )?;
    let mut w = ArrowWriter::try_new(
        std::fs::File::create(out.join("stats.parquet"))?,
        stat_schema,
        None,
    )?;
    w.write(&batch)?;
    w.close()?;
    std::fs::write(out.join("stats.json"), serde_json::to_vec_pretty(stats)?)?;
    Ok(())
}
