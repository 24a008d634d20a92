//! The real-world adapters of the small ports: the system clock and the tokio spawner. This
//! is the one module allowed to read the wall clock and the monotonic clock.

// The sanctioned exception to the clippy.toml bans: the real clock, timers and spawner.
#![allow(clippy::disallowed_methods)]

use std::future::Future;
use std::sync::OnceLock;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bigfleet_libvirt_domain::Timestamp;
use bigfleet_libvirt_ports::{Clock, Spawner};

/// The process clock: monotonic time, reported on the Unix-nanosecond scale.
///
/// The wall clock is read once per process, at the first [`Clock::now`]; from then on `now`
/// is that reading plus the monotonic time elapsed since (`std::time::Instant`, Linux's
/// `CLOCK_MONOTONIC`). So a `Timestamp` looks like Unix nanoseconds to a human, and equals the
/// host's wall clock unless the wall clock was stepped after the process started (an NTP
/// step, `date -s`, a VM restored with an old clock): then it stays apart from the wall clock
/// by the size of the step, until the process restarts. It never jumps, forward or back, so
/// a deadline (`now() + timeout`) means exactly that much real time from the moment it was
/// set, whatever happens to the wall clock meanwhile. While the host is suspended the
/// monotonic clock stops, and so do deadlines and the tokio timers behind
/// [`Clock::sleep_until`], alike.
///
/// Nothing reads these timestamps across a restart: deadlines live only in memory, and a
/// restart fails the transitions that were in flight (the state file holds no time).
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

/// The one wall-clock reading of the process and the monotonic instant it was taken at.
#[derive(Debug)]
struct Anchor {
    wall: Timestamp,
    at: Instant,
}

impl Anchor {
    fn get() -> &'static Anchor {
        static ANCHOR: OnceLock<Anchor> = OnceLock::new();
        ANCHOR.get_or_init(|| {
            let at = Instant::now();
            let since_epoch = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap_or(Duration::ZERO);
            let wall = Timestamp(u64::try_from(since_epoch.as_nanos()).unwrap_or(u64::MAX));
            Anchor { wall, at }
        })
    }
}

impl Clock for SystemClock {
    fn now(&self) -> Timestamp {
        let anchor = Anchor::get();
        // `Instant` never goes back, so neither does this.
        anchor.wall.saturating_add(anchor.at.elapsed())
    }

    fn sleep_until(&self, deadline: Timestamp) -> impl Future<Output = ()> + Send + 'static {
        // tokio's timer runs on the same monotonic clock as `now`, so waking up after `wait`
        // means `now()` has reached `deadline`.
        let wait = deadline.saturating_since(self.now());
        tokio::time::sleep(wait)
    }
}

/// Spawns onto the ambient tokio runtime.
#[derive(Clone, Copy, Debug, Default)]
pub struct TokioSpawner;

impl Spawner for TokioSpawner {
    fn spawn(&self, name: &'static str, task: impl Future<Output = ()> + Send + 'static) {
        tracing::trace!(task = name, "spawning background task");
        tokio::spawn(task);
    }
}

/// Measures elapsed time for metrics (never for decisions), on the monotonic clock.
#[derive(Clone, Copy, Debug)]
pub struct Stopwatch(Instant);

impl Stopwatch {
    /// Starts measuring now.
    #[must_use]
    pub fn start() -> Self {
        Self(Instant::now())
    }

    /// Seconds since `start`.
    #[must_use]
    pub fn seconds(&self) -> f64 {
        self.0.elapsed().as_secs_f64()
    }
}

#[cfg(test)]
#[path = "clock_tests.rs"]
mod tests;
