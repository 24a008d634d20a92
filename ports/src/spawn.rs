//! The `Spawner` port: the one way the provider starts background work, so every task can
//! be found and counted, and so a simulator can run them on its own scheduler.

use std::future::Future;

/// Starts detached background tasks.
///
/// Contract: `spawn` MUST start running `task` to completion independently of the caller,
/// MUST NOT block, and MUST NOT run `task` inline before returning.
pub trait Spawner: Clone + Send + Sync + 'static {
    /// Runs `task` in the background; `name` labels it for diagnostics.
    fn spawn(&self, name: &'static str, task: impl Future<Output = ()> + Send + 'static);
}
