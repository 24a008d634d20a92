//! The system clock is monotonic: it moves with `Instant`, never with steps of the wall clock.
//! The wall clock is stepped for real in a child process of this test binary run under
//! libfaketime (`tests/tests/harness/faketime.rs`, included by path).

use std::process::Command;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bigfleet_libvirt_domain::Timestamp;
use bigfleet_libvirt_ports::Clock;

use super::SystemClock;

#[path = "../../../tests/tests/harness/faketime.rs"]
mod faketime;

use faketime::{FILE_VARIABLE, SteppedWallClock};

/// Names the wall-clock step, in seconds, that the child takes.
const STEP_VARIABLE: &str = "BIGFLEET_CLOCK_TEST_STEP_SECS";
/// The child test, by its full name.
const CHILD: &str = "clock::tests::child_under_a_stepped_wall_clock";
/// Far above any real gap between two adjacent readings, far below any step tested.
const SLACK: Duration = Duration::from_secs(60);

fn wall() -> Duration {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("the wall clock is after 1970")
}

#[test]
fn now_never_goes_back_and_advances_with_the_monotonic_clock() {
    let clock = SystemClock;
    let (first, started) = (clock.now(), Instant::now());
    let mut last = first;
    for _ in 0..10_000 {
        let now = clock.now();
        assert!(now >= last, "the clock went back from {last:?} to {now:?}");
        last = now;
    }
    std::thread::sleep(Duration::from_millis(20));
    let (advanced, elapsed) = (clock.now().saturating_since(first), started.elapsed());
    assert!(
        advanced >= Duration::from_millis(20) && advanced <= elapsed + SLACK,
        "the clock advanced {advanced:?} while {elapsed:?} passed"
    );
}

#[test]
fn now_starts_on_the_unix_scale() {
    let now = Duration::from_nanos(SystemClock.now().0);
    let wall = wall();
    assert!(
        now.abs_diff(wall) < SLACK,
        "the clock reads {now:?} after the epoch, the wall clock {wall:?}: a human could not \
         read it as a date"
    );
}

#[tokio::test]
async fn sleep_until_returns_once_now_has_reached_the_deadline() {
    let clock = SystemClock;
    let deadline = clock.now().saturating_add(Duration::from_millis(30));
    clock.sleep_until(deadline).await;
    assert!(clock.now() >= deadline);
    let past = Timestamp(clock.now().0 - 1_000_000_000);
    tokio::time::timeout(SLACK, clock.sleep_until(past))
        .await
        .expect("a deadline in the past completes at once");
}

/// Steps the wall clock by each amount under a child process and has the child check its
/// clock did not move with it (`child_under_a_stepped_wall_clock`).
#[test]
fn a_step_of_the_wall_clock_moves_nothing() {
    const DAY: i64 = 24 * 3600;
    for step in [3600, -3600, 30 * DAY] {
        let stepped = SteppedWallClock::new();
        let exe = std::env::current_exe().expect("the test binary's path");
        let mut child = Command::new(exe);
        child.args([
            "--exact",
            CHILD,
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ]);
        child.env(STEP_VARIABLE, step.to_string());
        stepped.apply(&mut child);
        let output = child
            .output()
            .expect("run the test binary under libfaketime");
        let stdout = String::from_utf8_lossy(&output.stdout);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            output.status.success() && stdout.contains("1 passed"),
            "with the wall clock stepped by {step:+} s, the child test failed or did not \
             run:\n{stdout}\n{stderr}"
        );
    }
}

#[tokio::test]
#[ignore = "the child of a_step_of_the_wall_clock_moves_nothing, which runs it under libfaketime"]
async fn child_under_a_stepped_wall_clock() {
    let step: i64 = std::env::var(STEP_VARIABLE)
        .unwrap_or_else(|_| {
            panic!("{STEP_VARIABLE} is unset: run a_step_of_the_wall_clock_moves_nothing")
        })
        .parse()
        .expect("a step in whole seconds");
    let file = std::env::var_os(FILE_VARIABLE).expect("run under SteppedWallClock::apply");
    let stepped = SteppedWallClock::at(std::path::Path::new(&file));
    let clock = SystemClock;

    let (before, wall_before) = (clock.now(), wall());
    let deadline = before.saturating_add(Duration::from_millis(200));
    stepped.set_offset_secs(step);
    let (after, wall_after) = (clock.now(), wall());

    // The step happened: the wall clock moved by it.
    let wall_moved = i128::try_from(wall_after.as_nanos()).unwrap()
        - i128::try_from(wall_before.as_nanos()).unwrap();
    let expected = i128::from(step) * 1_000_000_000;
    assert!(
        (wall_moved - expected).unsigned_abs() < SLACK.as_nanos(),
        "libfaketime did not step the wall clock by {step} s (it moved {wall_moved} ns)"
    );
    // The clock did not.
    assert!(
        after >= before && after.saturating_since(before) < SLACK,
        "the wall clock stepped by {step:+} s took the clock from {before:?} to {after:?}"
    );
    // A deadline set before the step passes after its own 200 ms, not a step later or earlier.
    let waited = tokio::time::timeout(SLACK, clock.sleep_until(deadline)).await;
    assert!(
        waited.is_ok(),
        "a 200 ms deadline set before a {step:+} s step did not pass within {SLACK:?}"
    );
    let now = clock.now();
    assert!(
        now >= deadline && now.saturating_since(deadline) < SLACK,
        "after sleeping until {deadline:?} the clock reads {now:?} (the wall clock stepped by \
         {step:+} s)"
    );
}
