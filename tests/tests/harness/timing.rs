//! How long the tests' liveness waits took, printed beside their bounds, so a run under load
//! (`stress-ng --cpu 2` beside the suite) shows how much headroom each bound has. Bounds are
//! set at least 5x above the worst value seen under that load (issue 38); the figures
//! themselves are not asserted.

use std::time::Duration;

/// Prints one `timing:` line: the test (its thread's name), what was waited for, how long it
/// took, and the bound it had to meet.
pub fn seen(what: &str, took: Duration, bound: Duration) {
    let thread = std::thread::current();
    let test = thread.name().unwrap_or("?");
    println!("timing: {test}: {what}: {took:.3?} of {bound:?}");
}
