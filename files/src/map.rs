//! Read-only memory maps of files that are written once and never changed.

use std::fs;
use std::path::Path;

use anyhow::{Context, Result};
pub use memmap2::Mmap;

/// Maps the file at `path` read-only.
pub fn read_only(path: &Path) -> Result<Mmap> {
    let f = fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    // SAFETY: a read-only mapping. zflow's files are written to a temporary name and renamed
    // into place, never rewritten, so no one changes the bytes while they are mapped.
    unsafe { Mmap::map(&f) }.with_context(|| format!("memory-mapping {}", path.display()))
}
