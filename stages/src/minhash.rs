//! Near-duplicate detection, as datatrove's and Dolma's near-dedup do it: a MinHash signature
//! over a document's word n-gram shingles, cut into LSH bands. Two documents whose shingle sets
//! have Jaccard similarity `s` share at least one band with probability `1 - (1 - s^rows)^bands`
//! (datatrove's defaults, 5-grams and 14 bands of 8 rows, put the even-odds point near s = 0.72).
//!
//! Sharing a band makes two documents candidates only: a pair is a near duplicate when the
//! fraction of equal MinHash values of their signatures, an unbiased estimate of their
//! Jaccard similarity, is at least `jaccard` (0.7 by default; 0 takes every candidate, as
//! datatrove does). Each ingest writes its documents' bands (sorted runs in `bands/`) and
//! signatures (`signatures.bin`), and the source's `dedup` stage joins the verified pairs into
//! clusters (connected components) and keeps the first document of each, in shard order.
//!
//! Hand-written rather than taken from a crate: which documents a recipe keeps must never change
//! with a dependency's upgrade, so the shingling, the hash of a shingle (blake3) and the
//! permutations (`(a x + b) mod (2^61 - 1)` with `a`, `b` from zflow's SplitMix64) are fixed here.

use serde::{Deserialize, Serialize};
use zflow_pipeline::ConfigError;
use zflow_runtime::rng::SplitMix64;

/// `near_dedup` settings of a source (`ingest`).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NearDedup {
    /// Words per shingle.
    #[serde(default = "default_ngram")]
    pub ngram: usize,
    /// LSH bands.
    #[serde(default = "default_bands")]
    pub bands: usize,
    /// MinHash values per band.
    #[serde(default = "default_rows")]
    pub rows: usize,
    /// The least estimated Jaccard similarity of a candidate pair that makes it a near
    /// duplicate.
    #[serde(default = "default_jaccard")]
    pub jaccard: f64,
}

fn default_jaccard() -> f64 {
    0.7
}

fn default_ngram() -> usize {
    5
}
fn default_bands() -> usize {
    14
}
fn default_rows() -> usize {
    8
}

impl Default for NearDedup {
    fn default() -> Self {
        NearDedup {
            ngram: default_ngram(),
            bands: default_bands(),
            rows: default_rows(),
            jaccard: default_jaccard(),
        }
    }
}

/// The Mersenne prime 2^61 - 1, the modulus of the permutations.
const P: u64 = (1 << 61) - 1;

/// `x mod P` for `x < 2^122` (the product of two numbers below P).
fn reduce(x: u128) -> u64 {
    let folded = (x & P as u128) + (x >> 61);
    let folded = (folded & P as u128) + (folded >> 61);
    let r = folded as u64;
    if r >= P { r - P } else { r }
}

/// A configured near-duplicate detector: the permutations and the band keys of a text.
pub struct MinHasher {
    settings: NearDedup,
    /// `(a, b)` of each of the `bands x rows` permutations.
    permutations: Vec<(u64, u64)>,
}

impl MinHasher {
    /// The detector for `settings` (checked by [`NearDedup::validate`]).
    pub fn new(settings: NearDedup) -> MinHasher {
        // A fixed seed: the same permutations in every run, store and version.
        let mut rng = SplitMix64(0x6d69_6e68_6173_6821);
        let permutations = (0..settings.bands * settings.rows)
            .map(|_| (1 + rng.below(P - 1), rng.below(P)))
            .collect();
        MinHasher {
            settings,
            permutations,
        }
    }

    /// Values in a signature (`bands * rows`).
    pub fn signature_len(&self) -> usize {
        self.permutations.len()
    }

    /// The text's MinHash signature (`bands * rows` values); empty for a text without words.
    pub fn signature(&self, text: &str) -> Vec<u64> {
        let lowered = text.to_lowercase();
        let words: Vec<&str> = lowered.split_whitespace().collect();
        if words.is_empty() {
            return Vec::new();
        }
        let n = self.settings.ngram.min(words.len());
        let mut mins = vec![u64::MAX; self.permutations.len()];
        let mut shingle = String::new();
        for window in words.windows(n) {
            shingle.clear();
            for (i, w) in window.iter().enumerate() {
                if i > 0 {
                    shingle.push(' ');
                }
                shingle.push_str(w);
            }
            let h = blake3::hash(shingle.as_bytes());
            let x = u64::from_le_bytes(h.as_bytes()[..8].try_into().expect("8 bytes")) % P;
            for (m, &(a, b)) in mins.iter_mut().zip(&self.permutations) {
                let v = reduce(a as u128 * x as u128 + b as u128);
                if v < *m {
                    *m = v;
                }
            }
        }
        mins
    }

    /// A signature's band keys, one per band (16 bytes of blake3 over the band's index and its
    /// MinHash values); none for an empty signature.
    pub fn bands_of(&self, signature: &[u64]) -> Vec<[u8; 16]> {
        signature
            .chunks_exact(self.settings.rows)
            .enumerate()
            .map(|(band, values)| {
                let mut h = blake3::Hasher::new();
                h.update(&(band as u32).to_le_bytes());
                for v in values {
                    h.update(&v.to_le_bytes());
                }
                h.finalize().as_bytes()[..16].try_into().expect("16 bytes")
            })
            .collect()
    }

    /// The text's band keys ([`MinHasher::bands_of`] its [`MinHasher::signature`]).
    pub fn band_keys(&self, text: &str) -> Vec<[u8; 16]> {
        self.bands_of(&self.signature(text))
    }
}

/// The fraction of equal values of two signatures: the estimated Jaccard similarity of the
/// documents' shingle sets (0 when either is empty).
pub fn similarity(a: &[u64], b: &[u64]) -> f64 {
    if a.is_empty() || a.len() != b.len() {
        return 0.0;
    }
    a.iter().zip(b).filter(|(x, y)| x == y).count() as f64 / a.len() as f64
}

impl NearDedup {
    /// Checks the settings; errors name the field below `near_dedup`.
    pub fn validate(&self) -> Result<(), ConfigError> {
        for (field, v, max) in [
            ("near_dedup.ngram", self.ngram, 64),
            ("near_dedup.bands", self.bands, 1024),
            ("near_dedup.rows", self.rows, 64),
        ] {
            if !(1..=max).contains(&v) {
                return Err(ConfigError::new(
                    field,
                    format!("must be from 1 to {max}, got {v}"),
                ));
            }
        }
        if !(0.0..=1.0).contains(&self.jaccard) {
            return Err(ConfigError::new(
                "near_dedup.jaccard",
                format!("a Jaccard similarity from 0 to 1, got {}", self.jaccard),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(n: usize, seed: u64) -> Vec<String> {
        let mut rng = SplitMix64(seed);
        (0..n).map(|_| format!("w{}", rng.below(5000))).collect()
    }

    fn shares_a_band(h: &MinHasher, a: &str, b: &str) -> bool {
        let (ka, kb) = (h.band_keys(a), h.band_keys(b));
        ka.iter().zip(&kb).any(|(x, y)| x == y)
    }

    #[test]
    fn near_copies_share_a_band_and_unrelated_texts_do_not() {
        let h = MinHasher::new(NearDedup::default());
        let mut caught = 0;
        for seed in 0..20 {
            let text = words(200, seed);
            let mut edited = text.clone();
            edited[100] = "changed".into();
            edited[150] = "also".into();
            // Jaccard ~0.91 over 5-grams: a shared band is all but certain.
            caught += usize::from(shares_a_band(&h, &text.join(" "), &edited.join(" ")));
            let other = words(200, 1000 + seed);
            assert!(!shares_a_band(&h, &text.join(" "), &other.join(" ")));
        }
        assert_eq!(caught, 20);
        // Case and spacing do not matter; a wordless text has no bands.
        assert_eq!(h.band_keys("A b  C d e f"), h.band_keys("a B c\nd e f"));
        assert!(h.band_keys(" \n").is_empty());
        assert_eq!(h.band_keys("x").len(), 14);
    }

    #[test]
    fn the_permutations_and_keys_are_fixed() {
        // Pinned, and equal to a Python re-implementation's (the standard library and the
        // blake3 package): a change would change what every near-dedup recipe keeps.
        let h = MinHasher::new(NearDedup::default());
        assert_eq!(h.permutations[0], (680496637593250852, 1759345588500020689));
        let key = h.band_keys("the quick brown fox jumps over the lazy dog")[0];
        assert_eq!(
            key,
            [
                166, 34, 240, 135, 80, 138, 129, 6, 70, 128, 252, 46, 79, 224, 255, 156
            ]
        );
        assert_eq!(reduce((P as u128) * 3 + 5), 5);
        assert_eq!(reduce(((P - 1) as u128) * ((P - 1) as u128)), 1);
    }
}
