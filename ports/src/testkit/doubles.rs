//! Test doubles of the ports for the crate's own unit tests, one per port where the tests'
//! needs allow: two clocks ([`StoppedClock`], [`TokioClock`]) and a spawner
//! ([`TestSpawner`]). Each starts as the plainest double of its port (everything answers at
//! once and succeeds); its builder methods turn on the behaviour a test needs.
//!
//! They run on tokio (its timer and its spawn), which the crate has only as a dev-
//! dependency, so they are compiled for the unit tests only, not under the `testkit`
//! feature.

use std::future::Future;
use std::time::Duration;

use bigfleet_libvirt_domain::Timestamp;

use crate::{Clock, Spawner};

/// How the timers of a [`StoppedClock`] fire.
#[derive(Clone, Copy)]
enum Timers {
    /// Every timer fires at once.
    AtOnce,
    /// A wait of up to a minute ends after one yield; a longer one never does.
    ShortOnly,
}

/// A clock stopped at t=1s. [`StoppedClock::instant`]: its timers fire at once, so backoff
/// and deadlines cost nothing. [`StoppedClock::short_waits_only`]: short waits (retry
/// backoff) end after one yield, long ones (over a minute: transition deadlines) never do.
#[derive(Clone, Copy)]
pub struct StoppedClock {
    timers: Timers,
}

impl StoppedClock {
    /// A stopped clock whose timers fire at once.
    pub fn instant() -> Self {
        Self {
            timers: Timers::AtOnce,
        }
    }

    /// A stopped clock whose short waits end after one yield and whose long ones never do.
    pub fn short_waits_only() -> Self {
        Self {
            timers: Timers::ShortOnly,
        }
    }
}

impl Clock for StoppedClock {
    fn now(&self) -> Timestamp {
        Timestamp(1_000_000_000)
    }

    fn sleep_until(&self, deadline: Timestamp) -> impl Future<Output = ()> + Send + 'static {
        let long = deadline.saturating_since(self.now()) > Duration::from_secs(60);
        let timers = self.timers;
        async move {
            if let Timers::ShortOnly = timers {
                if long {
                    std::future::pending::<()>().await;
                }
                tokio::task::yield_now().await;
            }
        }
    }
}

/// The provider's clock on tokio's clock (paused, in the tests that use it), starting at
/// zero when it is made. It has no knobs.
#[derive(Clone)]
pub struct TokioClock {
    base: tokio::time::Instant,
}

impl TokioClock {
    /// A clock whose zero is now.
    pub fn starting_now() -> Self {
        Self {
            base: tokio::time::Instant::now(),
        }
    }
}

impl Clock for TokioClock {
    fn now(&self) -> Timestamp {
        let elapsed = self.base.elapsed().as_nanos();
        Timestamp(u64::try_from(elapsed).unwrap_or(u64::MAX))
    }

    // The tests' own Clock adapter: the one place they may wait on tokio's timer.
    #[allow(clippy::disallowed_methods)]
    fn sleep_until(&self, deadline: Timestamp) -> impl Future<Output = ()> + Send + 'static {
        tokio::time::sleep_until(self.base + Duration::from_nanos(deadline.0))
    }
}

/// Spawns every task on tokio; [`TestSpawner::losing_transitions`] drops every transition
/// worker unstarted instead (a worker that never runs), while the provider's other tasks
/// run.
#[derive(Clone, Default)]
pub struct TestSpawner {
    lose_transitions: bool,
}

impl TestSpawner {
    /// A spawner that drops every transition worker unstarted.
    pub fn losing_transitions() -> Self {
        Self {
            lose_transitions: true,
        }
    }
}

impl Spawner for TestSpawner {
    // The tests' own Spawner adapter: the one place they may call tokio::spawn.
    #[allow(clippy::disallowed_methods)]
    fn spawn(&self, name: &'static str, task: impl Future<Output = ()> + Send + 'static) {
        if self.lose_transitions && name == "transition" {
            return;
        }
        drop(tokio::task::spawn(task));
    }
}
