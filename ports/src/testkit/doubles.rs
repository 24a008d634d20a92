//! Test doubles of the ports for the crate's own unit tests, one per port where the tests'
//! needs allow: a spawner ([`TestSpawner`]). Each starts as the plainest double of its port
//! (everything answers at once and succeeds); its builder methods turn on the behaviour a
//! test needs.
//!
//! They run on tokio (its spawn), which the crate has only as a dev-dependency, so they are
//! compiled for the unit tests only, not under the `testkit` feature.

use std::future::Future;

use crate::Spawner;

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
