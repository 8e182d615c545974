//! The order of a source's windows inside one epoch: a keyed bijection on `0..n`, so that
//! consecutive samples of a source come from unrelated places in its token stream (a long
//! document no longer fills a whole global batch), with O(1) lookup and no stored table.
//!
//! It is a 4-round Feistel network (Luby and Rackoff: 4 rounds with random round functions
//! give a strong pseudo-random permutation) on the smallest even number of bits that covers
//! `n`, cycle-walked back into `0..n` (Black and Rogaway, "Ciphers with arbitrary finite
//! domains", 2002): applying the network again to a value outside the range until one falls
//! inside keeps the map a bijection, and takes fewer than 4 steps on average since the
//! network's domain is below `4n`. Megatron's GPT dataset gets the same effect from a shuffle of
//! every sample (`shuffle_idx`), which needs the whole table in memory to draw; this needs 48
//! bytes, so the mix stage streams the phase however long it is.
//!
//! Only the mix stage computes it: the read plan ([`super::read_plan`]) stores each sample's
//! window position, and every reader maps that instead.

use super::apportion::{TAG_WINDOWS, rng_for};
use crate::rng::SplitMix64;

/// Rounds of the Feistel network.
const ROUNDS: usize = 4;

/// The window order of one epoch of one source: [`WindowOrder::get`] maps the `k`-th sample
/// of the epoch to the window it reads.
#[derive(Clone, Debug)]
pub struct WindowOrder {
    /// Windows in the epoch (the map is a bijection on `0..n`).
    n: u64,
    /// Bits of each half of the network's input.
    half_bits: u32,
    /// One key per round.
    keys: [u64; ROUNDS],
}

impl WindowOrder {
    /// The order of epoch `epoch` of source `source` in a mixture seeded with `seed`, over `n`
    /// windows (`n >= 1`; the mixture's sample numbers stay below 2^48).
    pub fn new(seed: u64, source: usize, epoch: u64, n: u64) -> WindowOrder {
        let mut rng = rng_for(&[seed, TAG_WINDOWS, source as u64, epoch]);
        let keys = std::array::from_fn(|_| rng.next_u64());
        // Bits to hold n - 1, at least 2, rounded up to even so that both halves match.
        let bits = (u64::BITS - n.saturating_sub(1).leading_zeros()).max(2);
        WindowOrder {
            n,
            half_bits: bits.div_ceil(2),
            keys,
        }
    }

    /// The window read by the epoch's `k`-th sample (`k < n`).
    pub fn get(&self, k: u64) -> u64 {
        debug_assert!(k < self.n, "window {k} of {}", self.n);
        let mut x = k;
        loop {
            x = self.network(x);
            if x < self.n {
                return x;
            }
        }
    }

    /// One pass through the Feistel network on `2 * half_bits` bits.
    fn network(&self, x: u64) -> u64 {
        let mask = (1u64 << self.half_bits) - 1;
        let (mut left, mut right) = (x >> self.half_bits, x & mask);
        for &key in &self.keys {
            let mixed = SplitMix64(key ^ right).next_u64() & mask;
            (left, right) = (right, left ^ mixed);
        }
        (left << self.half_bits) | right
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_size_gets_a_bijection_that_depends_on_the_seed_source_and_epoch() {
        for n in [1u64, 2, 3, 4, 5, 17, 64, 100, 1000, 4099] {
            let order = WindowOrder::new(7, 1, 0, n);
            let mut seen: Vec<u64> = (0..n).map(|k| order.get(k)).collect();
            seen.sort_unstable();
            assert_eq!(seen, (0..n).collect::<Vec<_>>(), "n = {n}");
        }
        let first = |seed, source, epoch| -> Vec<u64> {
            let order = WindowOrder::new(seed, source, epoch, 1000);
            (0..16).map(|k| order.get(k)).collect()
        };
        assert_eq!(first(7, 1, 0), first(7, 1, 0));
        assert_ne!(first(7, 1, 0), first(8, 1, 0));
        assert_ne!(first(7, 1, 0), first(7, 2, 0));
        assert_ne!(first(7, 1, 0), first(7, 1, 1));
    }

    #[test]
    fn neighbouring_samples_read_distant_windows() {
        let n = 100_000;
        let order = WindowOrder::new(42, 0, 0, n);
        let near = (0..n - 1)
            .filter(|&k| order.get(k).abs_diff(order.get(k + 1)) < 16)
            .count();
        // A random permutation puts about 2 * 16 / n of the neighbours that close: 32 here.
        assert!(
            near < 100,
            "{near} of {n} neighbours read windows within 16 of each other"
        );
    }
}
