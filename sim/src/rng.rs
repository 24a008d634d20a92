//! The simulator's named PRNG: `Xoshiro256PlusPlus` (rand_xoshiro, a fixed algorithm, so a
//! seed keeps its meaning across dependency bumps; `StdRng` promises no such thing).
//!
//! Every fault and workload decision draws from one of these, each seeded from the madsim
//! seed and a stream name, so adding draws to one component does not shift another's.

use std::time::Duration;

use rand_core::{RngCore, SeedableRng};
use rand_xoshiro::Xoshiro256PlusPlus;
use sha2::{Digest, Sha256};

/// A rational probability `numerator / denominator` (swarm testing draws these per run).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ratio {
    /// Favourable outcomes.
    pub numerator: u64,
    /// All outcomes; never zero.
    pub denominator: u64,
}

impl Ratio {
    /// Never.
    pub const NEVER: Self = Self::new(0, 1);

    /// `numerator / denominator`.
    #[must_use]
    pub const fn new(numerator: u64, denominator: u64) -> Self {
        assert!(denominator > 0, "a ratio needs a denominator");
        Self {
            numerator,
            denominator,
        }
    }

    /// Whether this never fires.
    #[must_use]
    pub fn is_never(self) -> bool {
        self.numerator == 0
    }
}

impl std::fmt::Display for Ratio {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.is_never() {
            f.write_str("0")
        } else {
            write!(f, "{}/{}", self.numerator, self.denominator)
        }
    }
}

/// A seeded stream of decisions.
#[derive(Clone, Debug)]
pub struct SimRng(Xoshiro256PlusPlus);

impl SimRng {
    /// The stream `name` of run `seed`.
    #[must_use]
    pub fn stream(seed: u64, name: &str) -> Self {
        let mut hasher = Sha256::new();
        hasher.update(seed.to_le_bytes());
        hasher.update(name.as_bytes());
        let digest: [u8; 32] = hasher.finalize().into();
        Self(Xoshiro256PlusPlus::from_seed(digest))
    }

    /// A uniform `u64`.
    pub fn next_u64(&mut self) -> u64 {
        self.0.next_u64()
    }

    /// A uniform integer in `[low, high]`.
    pub fn between(&mut self, low: u64, high: u64) -> u64 {
        assert!(low <= high, "empty range {low}..={high}");
        let span = high - low;
        if span == u64::MAX {
            return self.next_u64();
        }
        low + self.next_u64() % (span + 1)
    }

    /// A uniform index below `len` (which must be positive).
    pub fn index(&mut self, len: usize) -> usize {
        let high = u64::try_from(len - 1).expect("usize fits u64");
        usize::try_from(self.between(0, high)).expect("index fits usize")
    }

    /// Whether an event of probability `ratio` happens.
    pub fn chance(&mut self, ratio: Ratio) -> bool {
        !ratio.is_never() && self.next_u64() % ratio.denominator < ratio.numerator
    }

    /// A uniform duration in `[low, high]`, at millisecond resolution below a second and
    /// microsecond resolution otherwise.
    pub fn duration(&mut self, low: Duration, high: Duration) -> Duration {
        let (low, high) = (micros(low), micros(high));
        Duration::from_micros(self.between(low, high))
    }

    /// One element of a non-empty slice.
    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.index(items.len())]
    }

    /// Swarm testing: a fault class is switched off in about half the runs; otherwise its
    /// rate is one of `rates`.
    pub fn swarm_rate(&mut self, rates: &[Ratio]) -> Ratio {
        if self.chance(Ratio::new(1, 2)) {
            Ratio::NEVER
        } else {
            *self.pick(rates)
        }
    }
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}
