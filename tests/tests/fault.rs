//! Timeouts & failure — the fault lane (docs/conformance.md §3.6 and §4, B701–B708), against the
//! fake's fault hooks with a 2 s transition timeout. Faults are selected over the wire only:
//! slots labelled `conformance.fault/create=error`, and the Configure cluster ids
//! `fault-error`, `fault-timeout`, `fault-slow-ok`, `fault-drain-error`,
//! `fault-readiness-block`. Every ack succeeds; faults show up later in the state.

use std::time::{Duration, Instant};

use bigfleet_libvirt_proto::v1alpha1 as pb;
use pb::MachineState as S;
use tonic::Code;

use crate::harness::*;

/// Healthy walks and most reach-FAILED deadlines: timeout 2 s + 5 s.
const SEVEN: Duration = Duration::from_secs(7);
/// How long a transition that runs into the fake's 2 s transition timeout (B703, B704) may
/// take to fail: at least five times its worst under `stress-ng --cpu 2` (2.021 s;
/// docs/testing.md, "Liveness bounds under load").
const TIMED_OUT_WITHIN: Duration = Duration::from_secs(12);
/// NeverReaches window after a failure.
const WINDOW: Duration = Duration::from_millis(300);
/// Our provider's wording for a transition that hit the 2 s deadline.
const TIMED_OUT: &str = "timed out after 2s";

/// The metadata the fault tests carry along (not a selector).
const FAULT_MD: [(&str, &str); 2] = [("conformance.fault/test", "1"), ("k", "v")];

/// Healthy walk to Idle: a non-fault slot, Create, IDLE within 7 s.
async fn healthy_idle(server: &Server, c: &mut Client) -> String {
    let id = pick(server, c).await;
    create(c, &id, None).await.expect("Create ack");
    reach(c, &id, S::Idle, SEVEN).await;
    id
}

/// Healthy walk to Idle, then Configure(cluster, fault md) whose ack must succeed.
async fn idle_then_configure(server: &Server, c: &mut Client, cluster: &str) -> String {
    let id = healthy_idle(server, c).await;
    configure(c, &id, cluster, &FAULT_MD, None)
        .await
        .expect("Configure ack must succeed");
    id
}

/// Reach FAILED and return the machine, asserting a non-empty last_error.
async fn failed(c: &mut Client, id: &str, within: Duration) -> pb::Machine {
    let m = reach(c, id, S::Failed, within).await;
    assert!(
        !m.last_error.is_empty(),
        "{id} is FAILED with an empty last_error"
    );
    m
}

/// B701: when the Configure actuator errors, the machine goes FAILED with a non-empty
/// last_error (keeping its binding, as the contract says) and never re-enters CONFIGURING.
#[tokio::test]
async fn b701_configure_actuator_error_fails_the_machine() {
    let server = fault();
    let mut c = server.client().await;
    let id = idle_then_configure(&server, &mut c, "fault-error").await;
    let m = failed(&mut c, &id, SEVEN).await;
    assert_eq!(
        m.cluster, "fault-error",
        "a failed Configure keeps its cluster"
    );
    assert_eq!(
        m.shard_metadata,
        md(&FAULT_MD),
        "a failed Configure keeps its metadata"
    );
    never_reaches(&mut c, &id, S::Configuring, WINDOW).await;
}

/// B702: when the Create actuator errors (a slot labelled `conformance.fault/create=error`),
/// the machine goes FAILED with a non-empty last_error and never re-enters CREATING.
#[tokio::test]
async fn b702_create_actuator_error_fails_the_machine() {
    let server = fault();
    let mut c = server.client().await;
    let spec = list(&mut c, &[S::Speculative], 0, b"").await;
    let id = spec
        .machines
        .iter()
        .find(|m| m.labels.get(FAULT_LABEL).is_some_and(|v| v == "error"))
        .map(|m| m.id.clone())
        .expect("the fault profile seeds slots labelled conformance.fault/create=error");
    create(&mut c, &id, None)
        .await
        .expect("Create ack must succeed");
    failed(&mut c, &id, SEVEN).await;
    never_reaches(&mut c, &id, S::Creating, WINDOW).await;
}

/// B703: a Configure that exceeds the 2 s transition timeout goes FAILED (not before the
/// deadline, not reverting to IDLE) with a non-empty, timeout-shaped last_error.
#[tokio::test]
async fn b703_transition_timeout_fails_without_reverting() {
    let server = fault();
    let mut c = server.client().await;
    let id = idle_then_configure(&server, &mut c, "fault-timeout").await;
    let accepted = Instant::now();
    let m = failed(&mut c, &id, TIMED_OUT_WITHIN).await;
    assert!(
        accepted.elapsed() >= Duration::from_millis(1800),
        "FAILED before the 2 s deadline"
    );
    assert!(
        m.last_error.contains(TIMED_OUT),
        "last_error {:?} lacks {TIMED_OUT:?}",
        m.last_error
    );
    stays_in(&mut c, &id, S::Failed, WINDOW).await;
}

/// B704: a late success (the actuator finishes at about 3 s, past the 2 s timeout) is
/// discarded: 4 s after the machine went FAILED it is still FAILED with a non-empty (here:
/// still timeout-shaped) last_error.
#[tokio::test]
async fn b704_late_success_after_failure_is_discarded() {
    let server = fault();
    let mut c = server.client().await;
    let id = idle_then_configure(&server, &mut c, "fault-slow-ok").await;
    reach(&mut c, &id, S::Failed, TIMED_OUT_WITHIN).await;
    let m = get(&mut c, &id).await.expect("Get");
    assert!(!m.last_error.is_empty(), "FAILED with an empty last_error");
    assert!(
        m.last_error.contains(TIMED_OUT),
        "last_error {:?} lacks {TIMED_OUT:?}",
        m.last_error
    );
    tokio::time::sleep(Duration::from_secs(4)).await;
    let m = get(&mut c, &id).await.expect("Get");
    assert_eq!(
        state(&m),
        S::Failed,
        "the late success resurrected the machine: {m:?}"
    );
    assert!(
        !m.last_error.is_empty(),
        "last_error cleared by the late success"
    );
    assert!(
        m.last_error.contains(TIMED_OUT),
        "last_error {:?} lacks {TIMED_OUT:?}",
        m.last_error
    );
}

/// B705: a FAILED machine refuses a new mutation with a non-fencing error (Configure as in
/// the suite, and the registry's "any target": Create, Drain, Delete too); its state and
/// last_error are unchanged.
#[tokio::test]
async fn b705_failed_machine_refuses_mutations_unchanged() {
    let server = fault();
    let mut c = server.client().await;
    let id = idle_then_configure(&server, &mut c, "fault-error").await;
    let l = failed(&mut c, &id, SEVEN).await.last_error;

    let again = configure(&mut c, &id, "recover-cluster", &FAULT_MD, None).await;
    assert!(
        again.is_err(),
        "Configure on FAILED was accepted: {again:?}"
    );
    assert_ne!(
        code(&again),
        Code::FailedPrecondition,
        "a non-fencing rejection must not be FP"
    );
    let m = get(&mut c, &id).await.expect("Get");
    assert_eq!(state(&m), S::Failed);
    assert_eq!(
        m.last_error, l,
        "last_error changed after the rejected Configure"
    );

    let others = [
        ("Create", create(&mut c, &id, None).await),
        ("Drain", drain(&mut c, &id, 0, None).await),
        ("Delete", delete(&mut c, &id, None).await),
    ];
    for (what, result) in others {
        assert!(result.is_err(), "{what} on FAILED was accepted: {result:?}");
        assert_ne!(
            code(&result),
            Code::FailedPrecondition,
            "{what} on FAILED returned FP"
        );
    }
    let m = get(&mut c, &id).await.expect("Get");
    assert_eq!(state(&m), S::Failed);
    assert_eq!(
        m.last_error, l,
        "last_error changed after the rejected mutations"
    );
}

/// B706: a Drain (grace 0) against a failing drain actuator ends FAILED with an error within
/// 7 s (the registry also accepts IDLE; this provider documents FAILED) and never goes back
/// to DRAINING.
#[tokio::test]
async fn b706_failing_drain_ends_failed_never_stuck_in_draining() {
    let server = fault();
    let mut c = server.client().await;
    let id = idle_then_configure(&server, &mut c, "fault-drain-error").await;
    reach(&mut c, &id, S::Configured, SEVEN).await;
    drain(&mut c, &id, 0, None)
        .await
        .expect("Drain ack must succeed");
    let start = Instant::now();
    let end = loop {
        let m = get(&mut c, &id).await.expect("Get");
        if state(&m) != S::Draining {
            break m;
        }
        assert!(
            start.elapsed() < SEVEN,
            "{id} still DRAINING after 7 s: {m:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    eprintln!(
        "b706: failing drain ended {:?} ({:?})",
        state(&end),
        end.last_error
    );
    // The registry also accepts Idle; this provider documents Draining -> Failed.
    assert_eq!(
        state(&end),
        S::Failed,
        "a failed Drain ends FAILED (docs/contract.md §2.2): {end:?}"
    );
    assert!(
        !end.last_error.is_empty(),
        "FAILED drain with an empty last_error"
    );
    never_reaches(&mut c, &id, S::Draining, WINDOW).await;
}

/// B707: a FAILED machine is readable: three Gets and List(FAILED) all show FAILED with the
/// same last_error.
#[tokio::test]
async fn b707_failed_machine_is_readable_with_a_stable_error() {
    let server = fault();
    let mut c = server.client().await;
    let id = idle_then_configure(&server, &mut c, "fault-error").await;
    let l = failed(&mut c, &id, SEVEN).await.last_error;
    for read in 1..=3 {
        let m = get(&mut c, &id).await.expect("Get");
        assert_eq!(state(&m), S::Failed, "read {read}");
        assert_eq!(m.last_error, l, "read {read}: last_error changed");
    }
    let listed = list(&mut c, &[S::Failed], 0, b"").await;
    let m = listed.machines.iter().find(|m| m.id == id);
    let m = m.unwrap_or_else(|| panic!("{id} missing from List(FAILED)"));
    assert_eq!(m.last_error, l, "List(FAILED) shows another last_error");
}

/// B708: a machine is not CONFIGURED until its node is Ready: with readiness blocked it is
/// never CONFIGURED for 1.5 s, then goes FAILED with a configure-timeout last_error.
#[tokio::test]
async fn b708_no_configured_without_node_readiness() {
    let server = fault();
    let mut c = server.client().await;
    let id = idle_then_configure(&server, &mut c, "fault-readiness-block").await;
    never_reaches(&mut c, &id, S::Configured, Duration::from_millis(1500)).await;
    let m = failed(&mut c, &id, SEVEN).await;
    let want = "configure transition timed out";
    assert!(
        m.last_error.contains(want),
        "last_error {:?} lacks {want:?}",
        m.last_error
    );
}
