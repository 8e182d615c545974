"""SplitMix64 and the seeded shuffles of zflow's mixture, bit for bit as ``runtime/src/rng.rs``,
``runtime/src/data/mixture/apportion.rs`` and ``runtime/src/data/mixture/permutation.rs``
compute them: a sample order is part of an experiment's identity, so both engines must draw
the same numbers.
"""

MASK64 = (1 << 64) - 1

# Domain tags of the mixture's streams (apportion.rs): block shuffles, document shuffles and
# window orders.
TAG_BLOCK = 1
TAG_DOCS = 2
TAG_WINDOWS = 3
ROUNDS = 4


class SplitMix64:
    """The generator: 64 bits of state (Steele, Lea & Flood 2014)."""

    def __init__(self, state: int) -> None:
        self.state = state & MASK64

    def next_u64(self) -> int:
        """The next 64 random bits."""
        self.state = (self.state + 0x9E3779B97F4A7C15) & MASK64
        z = self.state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
        return z ^ (z >> 31)

    def below(self, n: int) -> int:
        """A number in ``0..n`` by multiply-high (Lemire), as the Rust side draws it."""
        return (self.next_u64() * n) >> 64


def rng_for(parts: list[int]) -> SplitMix64:
    """A generator seeded from several numbers, each mixed in through one SplitMix64 step."""
    state = 0
    for part in parts:
        state = SplitMix64(state ^ part).next_u64()
    return SplitMix64(state)


def shuffle(items: list[int], rng: SplitMix64) -> None:
    """Fisher-Yates (Durstenfeld), from the back, in place."""
    for i in range(len(items) - 1, 0, -1):
        j = rng.below(i + 1)
        items[i], items[j] = items[j], items[i]


def epoch_order(seed: int, source: int, epoch: int, num_docs: int) -> list[int]:
    """The document order of epoch ``epoch`` of source ``source``."""
    order = list(range(num_docs))
    shuffle(order, rng_for([seed, TAG_DOCS, source, epoch]))
    return order


class WindowOrder:
    """The order of one epoch's windows of a source: a 4-round Feistel network on the smallest
    even number of bits covering ``n``, cycle-walked into ``0..n`` (why, in permutation.rs)."""

    def __init__(self, seed: int, source: int, epoch: int, n: int) -> None:
        rng = rng_for([seed, TAG_WINDOWS, source, epoch])
        self.keys = [rng.next_u64() for _ in range(ROUNDS)]
        self.n = n
        bits = max((n - 1).bit_length() if n > 0 else 0, 2)
        self.half_bits = (bits + 1) // 2

    def get(self, k: int) -> int:
        """The window read by the epoch's ``k``-th sample (``k < n``)."""
        half, mask = self.half_bits, (1 << self.half_bits) - 1
        x = k
        while True:
            left, right = x >> half, x & mask
            for key in self.keys:
                mixed = SplitMix64(key ^ right).next_u64() & mask
                left, right = right, left ^ mixed
            x = (left << half) | right
            if x < self.n:
                return x
