//! Jittered exponential backoff for reconnecting to a libvirt host.
//!
//! Each host draws its jitter from its own seeded `Xoshiro256PlusPlus` (docs/design.md §5.2: a
//! named, version-stable PRNG, never `thread_rng`), so a test or a replay sees the same waits,
//! while hosts with different seeds spread their reconnect attempts instead of stampeding a daemon
//! that just came back.

use std::time::Duration;

use rand_core::{RngCore, SeedableRng};
use rand_xoshiro::Xoshiro256PlusPlus;

/// "Equal jitter" backoff: the n-th wait is uniform in `[cap/2, cap]` with
/// `cap = min(max, min * 2^n)`.
#[derive(Debug)]
pub struct Backoff {
    rng: Xoshiro256PlusPlus,
    min: Duration,
    max: Duration,
    attempt: u32,
}

impl Backoff {
    /// A backoff between `min` and `max` (`max` is raised to `min` if lower).
    #[must_use]
    pub fn new(min: Duration, max: Duration, seed: u64) -> Self {
        Self {
            rng: Xoshiro256PlusPlus::seed_from_u64(seed),
            min,
            max: max.max(min),
            attempt: 0,
        }
    }

    /// The next wait.
    pub fn next_wait(&mut self) -> Duration {
        let factor = 1u32.checked_shl(self.attempt.min(31)).unwrap_or(u32::MAX);
        let cap = self.min.saturating_mul(factor).min(self.max);
        self.attempt = self.attempt.saturating_add(1);
        let half = cap / 2;
        let span = u64::try_from((cap - half).as_nanos()).unwrap_or(u64::MAX);
        let jitter = if span == 0 {
            0
        } else {
            self.rng.next_u64() % (span + 1)
        };
        half + Duration::from_nanos(jitter)
    }

    /// Starts over after a success.
    pub fn reset(&mut self) {
        self.attempt = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_grow_within_bounds_and_reset() {
        let (min, max) = (Duration::from_millis(100), Duration::from_secs(2));
        let mut backoff = Backoff::new(min, max, 7);
        let waits: Vec<Duration> = (0..8).map(|_| backoff.next_wait()).collect();
        for (n, wait) in waits.iter().enumerate() {
            let cap = (min * 2u32.pow(u32::try_from(n).unwrap())).min(max);
            assert!(
                *wait >= cap / 2 && *wait <= cap,
                "wait {n}: {wait:?} vs cap {cap:?}"
            );
        }
        assert!(waits[7] >= max / 2);
        backoff.reset();
        assert!(backoff.next_wait() <= min);
    }

    #[test]
    fn the_same_seed_gives_the_same_waits_and_another_differs() {
        let run = |seed| {
            let mut b = Backoff::new(Duration::from_millis(10), Duration::from_secs(60), seed);
            (0..10).map(|_| b.next_wait()).collect::<Vec<_>>()
        };
        assert_eq!(run(1), run(1));
        assert_ne!(run(1), run(2));
    }

    #[test]
    fn huge_attempt_counts_saturate_at_max() {
        let mut backoff = Backoff::new(Duration::from_secs(1), Duration::from_secs(30), 3);
        for _ in 0..200 {
            assert!(backoff.next_wait() <= Duration::from_secs(30));
        }
    }
}
