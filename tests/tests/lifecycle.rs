//! Lifecycle & state machine (docs/conformance.md §3.1): B101, B103–B109 against the core profile.

use std::time::{Duration, Instant};

use bigfleet_libvirt_proto::v1alpha1 as pb;
use pb::MachineState as S;
use tonic::Code;

use crate::harness::*;

/// The B108 stability window.
const STABILITY: Duration = Duration::from_millis(300);

/// The four transitional states.
const TRANSITIONAL: [S; 4] = [S::Creating, S::Configuring, S::Draining, S::Deleting];

/// IDLE with no binding and no error.
fn assert_clean_idle(m: &pb::Machine) {
    assert_eq!(state(m), S::Idle, "not IDLE: {m:?}");
    assert_eq!(m.cluster, "", "cluster left behind: {m:?}");
    assert!(m.shard_metadata.is_empty(), "metadata left behind: {m:?}");
    assert_eq!(m.last_error, "", "last_error set: {m:?}");
}

/// Fails if `trace` shows a transitional state other than `allowed`.
fn assert_only_transitional(trace: &[S], allowed: S) {
    let stray: Vec<&S> = trace
        .iter()
        .filter(|s| TRANSITIONAL.contains(s) && **s != allowed)
        .collect();
    assert!(
        stray.is_empty(),
        "only {allowed:?} may be visible; trace {trace:?}"
    );
}

/// B101: four Idle → Configured → Idle cycles; every return to IDLE is clean (no cluster,
/// no metadata, no last_error), and every CONFIGURED carries a cluster.
#[tokio::test]
async fn b101_repeated_cycles_return_to_a_clean_idle() {
    let server = core();
    let mut c = server.client().await;
    let id = walk_to_idle(&server, &mut c).await;
    assert_clean_idle(&get(&mut c, &id).await.expect("Get"));
    let metadata = [("bigfleet.lucy.sh/cycle", "round"), ("k", "v")];
    for round in 0..4 {
        configure(&mut c, &id, "conf-b101", &metadata, None)
            .await
            .expect("Configure");
        let m = reach(&mut c, &id, S::Configured, SETTLE).await;
        assert!(
            !m.cluster.is_empty(),
            "round {round}: CONFIGURED without cluster: {m:?}"
        );
        drain(&mut c, &id, 5, None).await.expect("Drain");
        reach(&mut c, &id, S::Idle, SETTLE).await;
        let fresh = get(&mut c, &id).await.expect("Get");
        assert_clean_idle(&fresh);
    }
}

/// B103: during Configure the only transitional state ever visible is CONFIGURING, and the
/// machine ends CONFIGURED.
#[tokio::test]
async fn b103_configure_shows_only_configuring() {
    let server = core();
    let mut c = server.client().await;
    let id = walk_to_idle(&server, &mut c).await;
    configure(&mut c, &id, "conf-b103", &[("a", "1")], None)
        .await
        .expect("Configure");
    let trace = trace_until(&mut c, &id, S::Configured, SETTLE).await;
    assert_only_transitional(&trace, S::Configuring);
    reach(&mut c, &id, S::Configured, SETTLE).await;
}

/// B104: during Drain the only transitional state ever visible is DRAINING, and the machine
/// ends IDLE.
#[tokio::test]
async fn b104_drain_shows_only_draining() {
    let server = core();
    let mut c = server.client().await;
    let id = walk_to_configured(&server, &mut c, "conf-b104", &[("a", "1")]).await;
    drain(&mut c, &id, 5, None).await.expect("Drain");
    let trace = trace_until(&mut c, &id, S::Idle, SETTLE).await;
    assert_only_transitional(&trace, S::Draining);
    reach(&mut c, &id, S::Idle, SETTLE).await;
}

/// The legal consecutive pairs of a de-duplicated Create → Configure → Drain trace.
const LEGAL_STEPS: [(S, S); 9] = [
    (S::Speculative, S::Creating),
    (S::Speculative, S::Idle),
    (S::Creating, S::Idle),
    (S::Idle, S::Configuring),
    (S::Idle, S::Configured),
    (S::Configuring, S::Configured),
    (S::Configured, S::Draining),
    (S::Configured, S::Idle),
    (S::Draining, S::Idle),
];

/// B105: the de-duplicated trace of Create → Configure → Drain starts at SPECULATIVE and
/// uses only legal adjacent steps, never skipping a stable state.
#[tokio::test]
async fn b105_trace_uses_only_legal_steps() {
    let server = core();
    let mut c = server.client().await;
    let id = pick(&server, &mut c).await;
    let first = get(&mut c, &id).await.expect("Get");
    assert_eq!(state(&first), S::Speculative);
    let mut trace = vec![S::Speculative];
    create(&mut c, &id, None).await.expect("Create");
    trace.extend(trace_until(&mut c, &id, S::Idle, SETTLE).await);
    configure(&mut c, &id, "conf-b105", &[("x", "y")], None)
        .await
        .expect("Configure");
    trace.extend(trace_until(&mut c, &id, S::Configured, SETTLE).await);
    drain(&mut c, &id, 5, None).await.expect("Drain");
    trace.extend(trace_until(&mut c, &id, S::Idle, SETTLE).await);
    trace.dedup();
    assert_eq!(trace[0], S::Speculative, "trace {trace:?}");
    for pair in trace.windows(2) {
        let step = (pair[0], pair[1]);
        assert!(
            LEGAL_STEPS.contains(&step),
            "illegal step {step:?} in trace {trace:?}"
        );
    }
    assert_eq!(trace.last(), Some(&S::Idle), "trace {trace:?}");
}

/// B106: cluster is empty at IDLE, set in every CONFIGURING snapshot, equal to the
/// requested id at CONFIGURED, and empty again once the Drain settles.
#[tokio::test]
async fn b106_cluster_binding_follows_the_state() {
    let server = core();
    let mut c = server.client().await;
    let id = walk_to_idle(&server, &mut c).await;
    assert_eq!(get(&mut c, &id).await.expect("Get").cluster, "");
    configure(&mut c, &id, "conf-b106", &[("a", "1")], None)
        .await
        .expect("Configure");
    let start = Instant::now();
    loop {
        if let Ok(m) = get(&mut c, &id).await {
            match state(&m) {
                S::Configured => break,
                S::Configuring => assert!(!m.cluster.is_empty(), "CONFIGURING unbound: {m:?}"),
                _ => {}
            }
        }
        assert!(start.elapsed() < SETTLE, "{id} never reached CONFIGURED");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let m = reach(&mut c, &id, S::Configured, SETTLE).await;
    assert_eq!(m.cluster, "conf-b106");
    drain(&mut c, &id, 5, None).await.expect("Drain");
    let m = reach(&mut c, &id, S::Idle, SETTLE).await;
    assert_eq!(m.cluster, "", "cluster survived the Drain: {m:?}");
}

/// B107: host is absent at SPECULATIVE and present at every IDLE and CONFIGURED rest; each
/// settled read is a stable state.
#[tokio::test]
async fn b107_host_presence_follows_the_state() {
    let server = core();
    let mut c = server.client().await;
    let id = pick(&server, &mut c).await;
    let m = get(&mut c, &id).await.expect("Get");
    assert_eq!(state(&m), S::Speculative);
    assert!(!TRANSITIONAL.contains(&state(&m)) && state(&m) != S::Unspecified);
    assert!(!host_set(&m), "SPECULATIVE with a host: {m:?}");
    create(&mut c, &id, None).await.expect("Create");
    let m = reach(&mut c, &id, S::Idle, SETTLE).await;
    assert!(host_set(&m), "IDLE without a host: {m:?}");
    configure(&mut c, &id, "conf-b107", &[], None)
        .await
        .expect("Configure");
    let m = reach(&mut c, &id, S::Configured, SETTLE).await;
    assert!(host_set(&m), "CONFIGURED without a host: {m:?}");
    drain(&mut c, &id, 5, None).await.expect("Drain");
    let m = reach(&mut c, &id, S::Idle, SETTLE).await;
    assert!(host_set(&m), "IDLE after Drain without a host: {m:?}");
}

/// StaysIn `at` for 300 ms, then NeverReaches each transitional state for 300 ms in turn.
async fn assert_settled(c: &mut Client, id: &str, at: S) {
    stays_in(c, id, at, STABILITY).await;
    for transitional in TRANSITIONAL {
        never_reaches(c, id, transitional, STABILITY).await;
    }
}

/// B108: a settled machine never moves on its own, neither at CONFIGURED nor at IDLE.
#[tokio::test]
async fn b108_settled_machines_do_not_move() {
    let server = core();
    let mut c = server.client().await;
    let id = walk_to_configured(&server, &mut c, "conf-b108", &[("k", "v")]).await;
    assert_settled(&mut c, &id, S::Configured).await;
    drain(&mut c, &id, 5, None).await.expect("Drain");
    reach(&mut c, &id, S::Idle, SETTLE).await;
    assert_settled(&mut c, &id, S::Idle).await;
}

/// The capability probe (docs/conformance.md §1.2): walk one machine to IDLE and Delete it; true
/// when Delete is implemented (the machine then returns to SPECULATIVE within 15 s).
async fn probe_delete(server: &Server, c: &mut Client) -> bool {
    let id = walk_to_idle(server, c).await;
    let result = delete(c, &id, None).await;
    if code(&result) == Code::Unimplemented {
        return false;
    }
    result.expect("the probe Delete must succeed when implemented");
    reach(c, &id, S::Speculative, SETTLE).await;
    true
}

/// B109: during Delete only DELETING may be visible; the machine ends SPECULATIVE with no
/// host. The core profile implements Delete, so the probe must report it.
#[tokio::test]
async fn b109_delete_shows_only_deleting_and_clears_the_host() {
    let server = core();
    let mut c = server.client().await;
    assert!(
        probe_delete(&server, &mut c).await,
        "the core profile must implement Delete"
    );
    let id = walk_to_idle(&server, &mut c).await;
    delete(&mut c, &id, None).await.expect("Delete");
    let trace = trace_until(&mut c, &id, S::Speculative, SETTLE).await;
    assert_only_transitional(&trace, S::Deleting);
    let m = reach(&mut c, &id, S::Speculative, SETTLE).await;
    assert!(!host_set(&m), "SPECULATIVE after Delete with a host: {m:?}");
}

crate::harness::backend::on_test_driver!(
    b101_repeated_cycles_return_to_a_clean_idle,
    b103_configure_shows_only_configuring,
    b104_drain_shows_only_draining,
    b105_trace_uses_only_legal_steps,
    b106_cluster_binding_follows_the_state,
    b107_host_presence_follows_the_state,
    b108_settled_machines_do_not_move,
    b109_delete_shows_only_deleting_and_clears_the_host,
);

crate::harness::backend::on_real_libvirtd!(
    b101_repeated_cycles_return_to_a_clean_idle,
    b103_configure_shows_only_configuring,
    b104_drain_shows_only_draining,
    b105_trace_uses_only_legal_steps,
    b106_cluster_binding_follows_the_state,
    b107_host_presence_follows_the_state,
    b108_settled_machines_do_not_move,
    b109_delete_shows_only_deleting_and_clears_the_host,
);
