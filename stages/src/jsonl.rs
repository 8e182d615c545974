//! An append-only JSON-lines file mirrored in memory: the train stage's `metrics.jsonl` and
//! `events.jsonl`, which survive failed attempts and crashes of `zflow run`.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::Result;
use serde::Serialize;
use serde::de::DeserializeOwned;

/// The records of one JSON-lines file.
pub(crate) struct JsonLines<T> {
    path: PathBuf,
    /// Every record, in file order.
    pub records: Vec<T>,
}

impl<T: Serialize + DeserializeOwned> JsonLines<T> {
    /// Reads `path` (missing = empty). A torn last line (a crash mid-write) is dropped.
    pub fn open(path: &Path) -> JsonLines<T> {
        let records = match std::fs::read_to_string(path) {
            Ok(text) => text
                .lines()
                .filter_map(|l| serde_json::from_str(l).ok())
                .collect(),
            Err(_) => Vec::new(),
        };
        JsonLines {
            path: path.to_path_buf(),
            records,
        }
    }

    /// Appends `record` to the file and the list.
    pub fn push(&mut self, record: T) -> Result<()> {
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.path)?;
        writeln!(f, "{}", serde_json::to_string(&record)?)?;
        self.records.push(record);
        Ok(())
    }

    /// Rewrites the file from the list (after records were dropped or changed), atomically.
    pub fn rewrite(&self) -> Result<()> {
        let mut text = String::new();
        for r in &self.records {
            text.push_str(&serde_json::to_string(r)?);
            text.push('\n');
        }
        zflow_files::atomic::write(&self.path, text.as_bytes())
    }
}
