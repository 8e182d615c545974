//! Shards of a source: which files of a fetched folder one shard's stages read.
//!
//! A file belongs to shard `blake3(path) mod count`, where `path` is its path relative to the
//! fetched folder (`/`-separated, as the store's manifests name it). The assignment depends on
//! nothing but the path and the count: adding a file to a source changes only the shard it lands
//! in, and each shard stage's identity hashes only its own files
//! ([`zflow_pipeline::Stage::reads_only`]), so every other shard stays cached.

use serde::{Deserialize, Serialize};

/// One shard of a source split `count` ways.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Shard {
    /// This shard, `0 .. count`.
    pub index: usize,
    /// How many shards the source has.
    pub count: usize,
}

impl Shard {
    /// The shard (of `count`) that the file at relative path `path` belongs to.
    pub fn of(path: &str, count: usize) -> usize {
        let hash = blake3::hash(path.as_bytes());
        let first: [u8; 8] = hash.as_bytes()[..8].try_into().expect("8 bytes");
        (u64::from_le_bytes(first) % count as u64) as usize
    }

    /// Shard `index`'s label among `count` (in its stages' names and its drop list's): the
    /// index zero-padded to the width of `count - 1`, so that labels sort in shard order.
    pub fn label(index: usize, count: usize) -> String {
        let width = (count.max(2) - 1).to_string().len();
        format!("{index:0width$}")
    }

    /// Whether the file at relative path `path` is in this shard.
    pub fn holds(&self, path: &str) -> bool {
        Shard::of(path, self.count) == self.index
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_keeps_its_shard_whatever_other_files_there_are_and_shards_share_the_files() {
        let paths: Vec<String> = (0..400)
            .map(|i| format!("data/part-{i:05}.jsonl"))
            .collect();
        let mut sizes = [0usize; 8];
        for p in &paths {
            let s = Shard::of(p, 8);
            sizes[s] += 1;
            assert!(Shard { index: s, count: 8 }.holds(p));
            assert!(
                !Shard {
                    index: (s + 1) % 8,
                    count: 8
                }
                .holds(p)
            );
        }
        // 400 files in 8 shards: 50 each on average; a hash spreads them roughly evenly.
        assert!(sizes.iter().all(|&n| (25..=75).contains(&n)), "{sizes:?}");
        // Fixed by the path alone (a change would re-shard every sharded source).
        assert_eq!(
            Shard::of("data/part-00000.jsonl", 8),
            Shard::of("data/part-00000.jsonl", 8)
        );
        assert_eq!(Shard::of("a.txt", 1), 0);
    }
}
