//! A step of the host's wall clock changes nothing a caller sees (issue 37): the provider's
//! deadlines run on a monotonic clock (`infra/system/src/clock.rs`). The binary runs on the
//! fake backend under libfaketime (`harness/faketime.rs`), so only its wall clock moves; the
//! test steps it by +1 h, −1 h or +30 days while a batch of Creates, and then of Configures,
//! is in flight, and also while one Configure hangs until its deadline.
//!
//! - Every healthy transition reaches its target: a forward step must not make a transition
//!   look overdue (with deadlines on the wall clock, each went Failed "timed out" as it
//!   completed or as the sweep next looked).
//! - The hanging Configure still fails, as timed out after its own 10 s: a backward step must
//!   not push its deadline an hour away.

use std::collections::BTreeMap;
use std::process::Command;
use std::time::{Duration, Instant};

use bigfleet_libvirt_proto::v1alpha1 as pb;
use pb::MachineState as S;

use crate::harness::faketime::SteppedWallClock;
use crate::harness::*;

/// The transition deadline, far above the fake's latency: only a clock step can overrun it.
const TIMEOUT: &str = "--transition-timeout=10s";
/// Each backend call takes 2–3 s, so every transition is still in flight when the clock steps.
const DELAYS: [&str; 2] = ["--fake-delay-min=2s", "--fake-delay-max=3s"];
/// Machines per batch, and the one Configure that hangs (a fault hook of the fake).
const BATCH: usize = 24;
const HANG: &str = "fault-timeout";
/// How long a batch may take to settle, and the hang to fail: a transition ends by its 10 s
/// deadline (+ the sweep's 1 s grace). Seen with `stress-ng --cpu 2` on the 2-core machine:
/// 3.0 s for a batch, 10.0 s for the hang from its Configure. Five times the 11 s, rounded up.
const SETTLE: Duration = Duration::from_secs(60);

const HOUR: i64 = 3600;
const DAY: i64 = 24 * HOUR;

#[tokio::test]
async fn a_wall_clock_step_forward_by_an_hour_fails_no_transition() {
    ride_out(HOUR).await;
}

#[tokio::test]
async fn a_wall_clock_step_back_by_an_hour_delays_no_timeout() {
    ride_out(-HOUR).await;
}

#[tokio::test]
async fn a_wall_clock_step_forward_by_thirty_days_fails_no_transition() {
    ride_out(30 * DAY).await;
}

/// Creates a batch, steps the wall clock by `step` seconds mid-flight, waits for every
/// machine to be Idle; then Configures them (one into the hang), steps again by as much,
/// and waits for Configured (the hang: Failed, timed out after 10 s).
async fn ride_out(step: i64) {
    let wall = SteppedWallClock::new();
    let mut command = Command::new(binary());
    wall.apply(&mut command);
    let mut args = vec![
        "--use-fake-backend",
        "--provider=certify",
        "--seed-count=64",
        "--fake-fault-hooks",
        TIMEOUT,
    ];
    args.extend(DELAYS);
    let server = Server::start_command(command, &args);
    let mut c = server.client().await;
    let ids = pick_n(&server, &mut c, BATCH + 1).await;
    let (hang, batch) = ids.split_first().expect("a batch");

    for id in &ids {
        create(&mut c, id, None).await.expect("Create ack");
    }
    wall.set_offset_secs(step);
    assert_in_flight(&mut c, &ids, step, "Create").await;
    assert_all_reach(&mut c, &ids, S::Idle, step).await;

    for id in batch {
        configure(&mut c, id, "c1", &[], None)
            .await
            .expect("Configure ack");
    }
    configure(&mut c, hang, HANG, &[], None)
        .await
        .expect("Configure ack");
    wall.set_offset_secs(2 * step);
    assert_in_flight(&mut c, &ids, 2 * step, "Configure").await;
    assert_all_reach(&mut c, batch, S::Configured, 2 * step).await;
    let failed = reach(&mut c, hang, S::Failed, SETTLE).await;
    assert!(
        failed.last_error.contains("timed out after 10s"),
        "the hanging Configure failed, but not on its 10 s deadline (wall clock at {:+} s): {}",
        2 * step,
        failed.last_error
    );
}

/// The step landed while transitions were in flight, or the test proves nothing.
async fn assert_in_flight(c: &mut Client, ids: &[String], offset: i64, kind: &str) {
    let states = states_of(c, ids).await;
    let in_flight = states
        .values()
        .filter(|m| matches!(state(m), S::Creating | S::Configuring))
        .count();
    assert!(
        in_flight > 0,
        "every {kind} had ended before the wall clock stepped to {offset:+} s: nothing was \
         tested (states: {:?})",
        states.values().map(state).collect::<Vec<_>>()
    );
}

/// Waits until none of `ids` is transitional, then asserts each is in `want`, naming how
/// many went Failed and why.
async fn assert_all_reach(c: &mut Client, ids: &[String], want: S, offset: i64) {
    let start = Instant::now();
    let settled = loop {
        let states = states_of(c, ids).await;
        let moving = states
            .values()
            .filter(|m| matches!(state(m), S::Creating | S::Configuring))
            .count();
        if moving == 0 {
            break states;
        }
        assert!(
            start.elapsed() < SETTLE,
            "{moving} of {} machines still transitional {SETTLE:?} after the wall clock \
             stepped to {offset:+} s",
            ids.len()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let off: Vec<&pb::Machine> = settled.values().filter(|m| state(m) != want).collect();
    assert!(
        off.is_empty(),
        "{} of {} machines did not reach {want:?} with the wall clock stepped to {offset:+} s \
         mid-flight; the first: {} is {:?}, last_error {:?}",
        off.len(),
        ids.len(),
        off[0].id,
        state(off[0]),
        off[0].last_error
    );
}

/// The current records of `ids`, by id (one List).
async fn states_of(c: &mut Client, ids: &[String]) -> BTreeMap<String, pb::Machine> {
    let all = list_all(c).await.machines;
    let found: BTreeMap<String, pb::Machine> = all
        .into_iter()
        .filter(|m| ids.contains(&m.id))
        .map(|m| (m.id.clone(), m))
        .collect();
    assert_eq!(
        found.len(),
        ids.len(),
        "every machine of the batch is listed"
    );
    found
}
