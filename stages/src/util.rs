//! Small helpers shared by stage kinds.

use std::path::Path;
use std::sync::Arc;

use arrow::array::{ArrayRef, RecordBatch};
use arrow::datatypes::{Field, Schema};

/// The last `n` lines of a log file, indented, for error messages.
pub fn log_tail(path: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().filter(|l| !l.starts_with("===")).collect();
    let start = lines.len().saturating_sub(n);
    let tail: Vec<String> = lines[start..].iter().map(|l| format!("    {l}")).collect();
    if tail.is_empty() {
        "    (the log is empty)".into()
    } else {
        tail.join("\n")
    }
}

/// Writes one record batch of `cols` (named and typed by `fields`) as a Parquet file: the small
/// report tables stages leave for `zflow query`.
pub fn write_parquet(path: &Path, fields: Vec<Field>, cols: Vec<ArrayRef>) -> anyhow::Result<()> {
    let schema = Arc::new(Schema::new(fields));
    let mut w =
        parquet::arrow::ArrowWriter::try_new(std::fs::File::create(path)?, schema.clone(), None)?;
    w.write(&RecordBatch::try_new(schema, cols)?)?;
    w.close()?;
    Ok(())
}

/// The identity of a folder of definitions a stage reads (task files, baselines): the store's
/// content hash over the files under `dir` whose names end in `.ext`.
pub fn definitions_fingerprint(dir: &Path, ext: &str) -> anyhow::Result<String> {
    let suffix = format!(".{ext}");
    let files: Vec<_> = zflow_pipeline::store::hash_tree(dir)?
        .into_iter()
        .filter(|f| f.path.ends_with(&suffix))
        .collect();
    // The folder's name, not its path: a moved checkout keeps its identities.
    let name = dir.file_name().unwrap_or_default().to_string_lossy();
    Ok(format!(
        "{name} {} files {}",
        files.len(),
        zflow_pipeline::store::content_hash(&files)
    ))
}
