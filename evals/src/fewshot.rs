//! Few-shot example choice.
//!
//! Each document gets its own generator, seeded from (task seed, document index), so a
//! document's examples do not depend on `--limit`, on which documents were already scored, or
//! on evaluation order. (lm-eval advances one Python `random.Random(1234)` across documents, so
//! its exact draws cannot be reproduced outside Python; the guarantees that matter, a fixed seed
//! and the document never being its own example, are kept.) The generator is the runtime's
//! hand-written SplitMix64 (the one that orders training data), so no crate upgrade can change
//! which examples a task uses.

use zflow_runtime::rng::SplitMix64;

use crate::task::FewshotSampler;

/// Indices of `n` examples from a pool of `pool` documents for document `doc`, never `exclude`
/// (the document itself when the pool is its own split). Fewer when the pool is too small.
pub fn choose(
    sampler: FewshotSampler,
    n: usize,
    pool: usize,
    seed: u64,
    doc: usize,
    exclude: Option<usize>,
) -> Vec<usize> {
    let available = pool - usize::from(exclude.is_some_and(|e| e < pool));
    let n = n.min(available);
    match sampler {
        FewshotSampler::FirstN => (0..pool).filter(|&i| Some(i) != exclude).take(n).collect(),
        FewshotSampler::Random => {
            // Partial Fisher-Yates over a virtual identity permutation: O(n) memory via a map of
            // the swapped slots, so huge pools cost nothing.
            let mut rng = SplitMix64(seed ^ (doc as u64).wrapping_mul(0xD1B5_4A32_D192_ED03));
            let mut swapped = std::collections::HashMap::new();
            let mut out = Vec::with_capacity(n);
            let mut i = 0;
            while out.len() < n {
                let j = i + rng.below((pool - i) as u64) as usize;
                let vj = *swapped.get(&j).unwrap_or(&j);
                let vi = *swapped.get(&i).unwrap_or(&i);
                swapped.insert(j, vi);
                i += 1;
                if Some(vj) != exclude {
                    out.push(vj);
                }
            }
            out
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splitmix_reference_values() {
        // First outputs for seed 1234567 from the reference C implementation.
        let mut r = SplitMix64(1234567);
        assert_eq!(r.next_u64(), 6457827717110365317);
        assert_eq!(r.next_u64(), 3203168211198807973);
    }

    #[test]
    fn random_choice_is_stable_distinct_and_excludes_the_doc() {
        let a = choose(FewshotSampler::Random, 5, 100, 1234, 7, Some(7));
        assert_eq!(a, choose(FewshotSampler::Random, 5, 100, 1234, 7, Some(7)));
        assert_eq!(a.len(), 5);
        assert!(!a.contains(&7));
        let mut s = a.clone();
        s.sort();
        s.dedup();
        assert_eq!(s.len(), 5);
        assert_ne!(a, choose(FewshotSampler::Random, 5, 100, 1234, 8, Some(8)));
        assert_ne!(a, choose(FewshotSampler::Random, 5, 100, 99, 7, Some(7)));
        // A pool smaller than asked: everything but the document.
        let mut all = choose(FewshotSampler::Random, 10, 4, 1, 2, Some(2));
        all.sort();
        assert_eq!(all, vec![0, 1, 3]);
    }

    #[test]
    fn first_n_skips_the_doc() {
        assert_eq!(
            choose(FewshotSampler::FirstN, 3, 10, 0, 1, Some(1)),
            vec![0, 2, 3]
        );
        assert_eq!(
            choose(FewshotSampler::FirstN, 5, 5, 0, 0, None),
            vec![0, 1, 2, 3, 4]
        );
    }
}
