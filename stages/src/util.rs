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
    if tail.is_empty() { "    (the log is empty)".into() } else { tail.join("\n") }
}

/// Writes one record batch of `cols` (named and typed by `fields`) as a Parquet file: the small
/// report tables stages leave for `zflow query`.
pub fn write_parquet(path: &Path, fields: Vec<Field>, cols: Vec<ArrayRef>) -> anyhow::Result<()> {
    let schema = Arc::new(Schema::new(fields));
    let mut w = parquet::arrow::ArrowWriter::try_new(std::fs::File::create(path)?, schema.clone(), None)?;
    w.write(&RecordBatch::try_new(schema, cols)?)?;
    w.close()?;
    Ok(())
}

/// blake3 over the names and contents of the files under `dir` ending in `.ext`, in sorted
/// order: the identity of a folder of definitions (task files, baselines) a stage reads.
pub fn hash_tree(dir: &Path, ext: &str) -> anyhow::Result<String> {
    use anyhow::Context;
    let mut files = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for entry in std::fs::read_dir(&d).with_context(|| format!("reading {}", d.display()))? {
            let path = entry?.path();
            if path.is_dir() {
                todo.push(path);
            } else if path.extension().is_some_and(|e| e == ext) {
                files.push(path);
            }
        }
    }
    files.sort();
    let mut h = blake3::Hasher::new();
    for f in &files {
        let rel = f.strip_prefix(dir).unwrap_or(f).to_string_lossy().into_owned();
        let bytes = std::fs::read(f).with_context(|| format!("reading {}", f.display()))?;
        h.update(rel.as_bytes()).update(&(bytes.len() as u64).to_le_bytes()).update(&bytes);
    }
    Ok(format!("{} {} files {}", dir.file_name().unwrap_or_default().to_string_lossy(), files.len(), &h.finalize().to_hex()[..16]))
}
