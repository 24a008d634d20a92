//! `SimClock` and `SimSpawner`: the Clock and Spawner ports on madsim's virtual time and
//! scheduler.
//!
//! The spawner starts tasks on the *current* madsim node. The provider only spawns from
//! its own tasks, so every transition and compensation runs on the provider node and dies
//! with it when the simulator kills that node, exactly as a process crash would end them.

use std::future::Future;
use std::time::{Duration, SystemTime};

use bigfleet_libvirt_domain::Timestamp;
use bigfleet_libvirt_ports::{Clock, Spawner};
use madsim::time::TimeHandle;

/// Virtual time: `now` is madsim's simulated wall clock, timers are madsim sleeps. madsim's
/// wall clock and its monotonic clock are one virtual timeline (a seeded base plus the
/// simulated time elapsed): it never steps, so this clock is monotonic as the port requires.
#[derive(Clone, Copy, Debug, Default)]
pub struct SimClock;

impl Clock for SimClock {
    fn now(&self) -> Timestamp {
        let since_epoch = TimeHandle::current()
            .now_time()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or(Duration::ZERO);
        Timestamp(u64::try_from(since_epoch.as_nanos()).unwrap_or(u64::MAX))
    }

    fn sleep_until(&self, deadline: Timestamp) -> impl Future<Output = ()> + Send + 'static {
        let wait = deadline.saturating_since(self.now());
        madsim::time::sleep(wait)
    }
}

/// Spawns onto the current madsim node.
#[derive(Clone, Copy, Debug, Default)]
pub struct SimSpawner;

impl Spawner for SimSpawner {
    fn spawn(&self, _name: &'static str, task: impl Future<Output = ()> + Send + 'static) {
        drop(madsim::task::spawn(task));
    }
}
