//! The `Clock` port: the only source of time for the provider.
//!
//! Deadlines are absolute [`Timestamp`]s held in memory, never durations measured from a
//! remembered instant, so a simulated clock can replace the system one without the core
//! noticing. The clock is monotonic, not the wall clock: a deadline set as `now() + timeout`
//! passes after `timeout` of real time, whatever happens to the host's wall clock meanwhile
//! (an NTP step, a VM restored with an old clock). Its readings are on the Unix-nanosecond
//! scale so that a human can read them, and are meaningful within one process only: no
//! timestamp is persisted, and a restart fails the transitions that were in flight.

use std::future::Future;

use bigfleet_libvirt_domain::Timestamp;

/// A source of the current time and of timers.
///
/// Contract:
/// - `now` MUST be monotonic non-decreasing within one process, and MUST NOT follow steps of
///   the wall clock: between two readings it advances by the time a monotonic clock measured.
///   It is on the Unix-nanosecond scale (the system clock starts it at the wall clock's
///   reading when the process first asks), so it reads as a date, but it is not the wall
///   clock.
/// - `sleep_until(t)` MUST complete no earlier than the moment `now()` reaches `t`, and
///   MUST complete promptly when `t` is already in the past.
/// - Implementations MUST NOT block the calling thread.
pub trait Clock: Clone + Send + Sync + 'static {
    /// The current time on this process's monotonic clock.
    fn now(&self) -> Timestamp;

    /// Completes once `now()` has reached `deadline` (measured on the same monotonic clock).
    fn sleep_until(&self, deadline: Timestamp) -> impl Future<Output = ()> + Send + 'static;
}
