//! Small helpers shared by stage kinds.

use std::path::Path;

/// The last `n` lines of a log file, indented, for error messages.
pub fn log_tail(path: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().filter(|l| !l.starts_with("===")).collect();
    let start = lines.len().saturating_sub(n);
    let tail: Vec<String> = lines[start..].iter().map(|l| format!("    {l}")).collect();
    if tail.is_empty() { "    (the log is empty)".into() } else { tail.join("\n") }
}
