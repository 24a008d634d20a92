//! The real-world adapters of the small ports: the system clock and the tokio spawner. This
//! is the one module allowed to read the wall clock.

// The sanctioned exception to the clippy.toml bans: the real clock, timers and spawner.
#![allow(clippy::disallowed_methods)]

use std::future::Future;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bigfleet_libvirt_domain::Timestamp;
use bigfleet_libvirt_ports::{Clock, Spawner};

/// Wall-clock time and tokio timers.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Timestamp {
        // The single sanctioned wall-clock read: everything else asks this port.
        let since_epoch = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or(Duration::ZERO);
        Timestamp(u64::try_from(since_epoch.as_nanos()).unwrap_or(u64::MAX))
    }

    fn sleep_until(&self, deadline: Timestamp) -> impl Future<Output = ()> + Send + 'static {
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

/// Measures elapsed wall time for metrics (never for decisions).
#[derive(Clone, Copy, Debug)]
pub struct Stopwatch(std::time::Instant);

impl Stopwatch {
    /// Starts measuring now.
    #[must_use]
    pub fn start() -> Self {
        Self(std::time::Instant::now())
    }

    /// Seconds since `start`.
    #[must_use]
    pub fn seconds(&self) -> f64 {
        self.0.elapsed().as_secs_f64()
    }
}
