//! The `Clock` port: the only source of time for the provider.
//!
//! Deadlines are absolute [`Timestamp`]s held in state, never durations measured from a
//! remembered instant, so a simulated clock can replace the system one without the core
//! noticing.

use std::future::Future;

use bigfleet_libvirt_domain::Timestamp;

/// A source of the current time and of timers.
///
/// Contract:
/// - `now` MUST be monotonic non-decreasing within one process.
/// - `sleep_until(t)` MUST complete no earlier than the moment `now()` reaches `t`, and
///   MUST complete promptly when `t` is already in the past.
/// - Implementations MUST NOT block the calling thread.
pub trait Clock: Clone + Send + Sync + 'static {
    /// The current time.
    fn now(&self) -> Timestamp;

    /// Completes once `deadline` has passed.
    fn sleep_until(&self, deadline: Timestamp) -> impl Future<Output = ()> + Send + 'static;
}
