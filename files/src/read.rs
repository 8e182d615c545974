//! Whole-file reads with a bound: a file that claims to be a small document (a `config.json`,
//! an index) is refused once it passes its bound, before it is held in memory, so a hostile or
//! mistaken path (`/dev/zero`, a weights file named as a config) costs at most the bound.

use std::fs;
use std::io::Read;
use std::path::Path;

use anyhow::{Context, Result, bail};

/// The bytes of the file at `path`, refused with an error naming it once they pass `max_bytes`.
pub fn bounded(path: &Path, max_bytes: u64) -> Result<Vec<u8>> {
    let file = fs::File::open(path).with_context(|| format!("reading {}", path.display()))?;
    let mut bytes = Vec::new();
    file.take(max_bytes.saturating_add(1))
        .read_to_end(&mut bytes)
        .with_context(|| format!("reading {}", path.display()))?;
    if bytes.len() as u64 > max_bytes {
        bail!(
            "{}: larger than {max_bytes} bytes, the most zflow reads of such a file",
            path.display()
        );
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_file_past_its_bound_is_refused_without_being_read_whole() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.json");
        std::fs::write(&path, b"0123456789").unwrap();
        assert_eq!(super::bounded(&path, 10).unwrap(), b"0123456789");
        let err = super::bounded(&path, 9).unwrap_err().to_string();
        assert!(err.contains("config.json: larger than 9 bytes"), "{err}");
        // An endless file ends at the bound.
        let err = super::bounded(std::path::Path::new("/dev/zero"), 1 << 20).unwrap_err();
        assert!(err.to_string().contains("larger than"), "{err}");
    }
}
