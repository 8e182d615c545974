//! Content hashes of files: size and BLAKE3, read as a stream so a file of any size costs one
//! buffer of memory.

use std::fs;
use std::path::Path;

use anyhow::{Context, Result};

/// Size in bytes and BLAKE3 (hex) of the file at `path`.
pub fn file(path: &Path) -> Result<(u64, String)> {
    let f = fs::File::open(path).with_context(|| format!("reading {}", path.display()))?;
    let mut hasher = blake3::Hasher::new();
    let size = std::io::copy(
        &mut std::io::BufReader::with_capacity(1 << 20, f),
        &mut hasher,
    )
    .with_context(|| format!("reading {}", path.display()))?;
    Ok((size, hasher.finalize().to_hex().to_string()))
}

#[cfg(test)]
mod tests {
    #[test]
    fn size_and_hash_match_the_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, b"zflow").unwrap();
        let (size, hash) = super::file(&path).unwrap();
        assert_eq!(size, 5);
        assert_eq!(hash, blake3::hash(b"zflow").to_hex().to_string());
        assert!(super::file(&dir.path().join("missing")).is_err());
    }
}
