"""SplitMix64, bit for bit as ``runtime/src/rng.rs`` draws it (the trainer's fault injection
draws its noise with it). The mixture's shuffles are not here: the mix stage computes them once
and writes their result as the read plan (``zflow_torch.mixture``).
"""

MASK64 = (1 << 64) - 1


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
