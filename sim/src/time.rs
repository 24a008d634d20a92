//! Simulated time since the run started, madsim's virtual clock: what every trace line,
//! history event and fault window is stamped with.

use std::time::Duration;

use madsim::time::TimeHandle;

/// Simulated time since the run started.
#[must_use]
pub fn elapsed() -> Duration {
    TimeHandle::current().elapsed()
}
