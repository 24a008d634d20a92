//! docs/conformance.md §3.4 — concurrency & idempotency (B401–B409): bursts of identical calls
//! fired together (all tasks released by one barrier) collapse to one transition and one op id,
//! zombie and live epochs race, and no unfenced call is ever FAILED_PRECONDITION.

use std::collections::BTreeSet;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bigfleet_libvirt_proto::v1alpha1 as pb;
use pb::MachineState as S;
use tokio::sync::Barrier;
use tonic::Code;

use crate::harness::*;

const FP: Code = Code::FailedPrecondition;
type Outcome = Result<pb::TransitionAck, tonic::Status>;

/// Runs `call(i, client_i)` for every client on its own task; all tasks wait on one barrier
/// so the calls start together. Returns the results in client order.
async fn fan_out<F, Fut, T>(clients: Vec<Client>, call: F) -> Vec<T>
where
    F: Fn(usize, Client) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = T> + Send + 'static,
    T: Send + 'static,
{
    let barrier = Arc::new(Barrier::new(clients.len()));
    let call = Arc::new(call);
    let tasks: Vec<_> = clients
        .into_iter()
        .enumerate()
        .map(|(i, client)| {
            let (barrier, call) = (Arc::clone(&barrier), Arc::clone(&call));
            tokio::spawn(async move {
                barrier.wait().await;
                call(i, client).await
            })
        })
        .collect();
    futures::future::join_all(tasks)
        .await
        .into_iter()
        .map(|r| r.expect("task panicked"))
        .collect()
}

/// `n` handles on one connection.
fn copies(c: &Client, n: usize) -> Vec<Client> {
    (0..n).map(|_| c.clone()).collect()
}

/// The "single op id" check: at least one success, no empty op id, exactly one distinct op
/// id among the successes. Returns it.
fn single_op_id(results: &[Outcome]) -> String {
    let oks: Vec<&pb::TransitionAck> = results.iter().filter_map(|r| r.as_ref().ok()).collect();
    assert!(!oks.is_empty(), "no call succeeded: {results:?}");
    assert!(
        oks.iter().all(|a| !a.operation_id.is_empty()),
        "an ack has an empty operation_id: {oks:?}"
    );
    let ids: BTreeSet<&str> = oks.iter().map(|a| a.operation_id.as_str()).collect();
    assert_eq!(
        ids.len(),
        1,
        "identical calls minted several op ids: {ids:?}"
    );
    ids.into_iter().next().unwrap().to_owned()
}

/// No unfenced call may ever be FAILED_PRECONDITION.
fn no_fp(results: &[Outcome]) {
    for (i, r) in results.iter().enumerate() {
        assert_ne!(
            code(r),
            FP,
            "unfenced call {i} got FAILED_PRECONDITION: {r:?}"
        );
    }
}

/// "Reached exactly once(X)": reach X (15 s), Get shows X, and the id appears exactly once
/// in List(states=[X]).
async fn reached_exactly_once(c: &mut Client, id: &str, want: S) -> pb::Machine {
    let m = reach(c, id, want, SETTLE).await;
    assert_eq!(state(&m), want);
    let listed = list(c, &[want], 0, b"").await.machines;
    let n = listed.iter().filter(|m| m.id == id).count();
    assert_eq!(n, 1, "{id} appears {n} times in List({want:?})");
    m
}

/// B401: 16 parallel identical unfenced Creates collapse to one transition: one op id, no
/// FAILED_PRECONDITION, and the machine is IDLE exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn b401_parallel_creates_collapse() {
    let server = core();
    let mut c = server.client().await;
    let id = pick(&server, &mut c).await;
    let target = id.clone();
    let results = fan_out(copies(&c, 16), move |_, mut c| {
        let id = target.clone();
        async move { create(&mut c, &id, None).await }
    })
    .await;
    single_op_id(&results);
    no_fp(&results);
    reached_exactly_once(&mut c, &id, S::Idle).await;
}

/// B402: 16 parallel identical Configures collapse to one transition, and the binding holds
/// the cluster and every sent key/value.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn b402_parallel_configures_collapse() {
    let server = core();
    let mut c = server.client().await;
    let id = walk_to_idle(&server, &mut c).await;
    let target = id.clone();
    let results = fan_out(copies(&c, 16), move |_, mut c| {
        let id = target.clone();
        async move {
            configure(
                &mut c,
                &id,
                "b402-cluster",
                &[("shard", "b402"), ("role", "primary")],
                None,
            )
            .await
        }
    })
    .await;
    single_op_id(&results);
    no_fp(&results);
    let m = reached_exactly_once(&mut c, &id, S::Configured).await;
    assert_eq!(m.cluster, "b402-cluster");
    for (k, v) in [("shard", "b402"), ("role", "primary")] {
        assert_eq!(
            m.shard_metadata.get(k).map(String::as_str),
            Some(v),
            "metadata {k}: {:?}",
            m.shard_metadata
        );
    }
}

/// B403: 16 parallel identical Drains collapse to one transition and clear the binding.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn b403_parallel_drains_collapse_and_clear() {
    let server = core();
    let mut c = server.client().await;
    let id = walk_to_configured(&server, &mut c, "b403-cluster", &[("k", "v")]).await;
    let target = id.clone();
    let results = fan_out(copies(&c, 16), move |_, mut c| {
        let id = target.clone();
        async move { drain(&mut c, &id, 0, None).await }
    })
    .await;
    single_op_id(&results);
    no_fp(&results);
    let m = reached_exactly_once(&mut c, &id, S::Idle).await;
    assert!(m.cluster.is_empty(), "cluster not cleared: {m:?}");
    assert!(m.shard_metadata.is_empty(), "metadata not cleared: {m:?}");
}

/// B404: a racing at-target Configure and a Drain on a CONFIGURED machine end in one
/// well-defined stable state (IDLE or CONFIGURED, held for 300 ms) with a binding that
/// matches it; any error is a non-fencing rejection.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn b404_configure_drain_race_ends_consistent() {
    let server = core();
    let mut c = server.client().await;
    let id = walk_to_configured(&server, &mut c, "b404-cluster", &[("k", "v")]).await;
    let target = id.clone();
    let results = fan_out(copies(&c, 2), move |i, mut c| {
        let id = target.clone();
        async move {
            if i == 0 {
                configure(&mut c, &id, "b404-cluster", &[("k", "v")], None).await
            } else {
                drain(&mut c, &id, 0, None).await
            }
        }
    })
    .await;
    no_fp(&results);

    let start = Instant::now();
    let settled = loop {
        if let Ok(m) = get(&mut c, &id).await {
            if matches!(
                state(&m),
                S::Speculative | S::Idle | S::Configured | S::Failed
            ) {
                break m;
            }
        }
        assert!(
            start.elapsed() < SETTLE,
            "{id} never settled after the race"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let rest = state(&settled);
    assert!(
        matches!(rest, S::Idle | S::Configured),
        "settled in {rest:?}: {settled:?}"
    );
    stays_in(&mut c, &id, rest, Duration::from_millis(300)).await;
    let m = get(&mut c, &id).await.expect("Get");
    match rest {
        S::Idle => assert_eq!(m.cluster, "", "IDLE with a cluster: {m:?}"),
        _ => assert_eq!(
            m.cluster, "b404-cluster",
            "CONFIGURED with the wrong cluster: {m:?}"
        ),
    }
}

/// B405: when 12 zombie tokens (epoch 1) race 12 live tokens (epoch 2), every zombie is
/// FAILED_PRECONDITION, live tokens are OK or FAILED_PRECONDITION (a higher live token may
/// land first) with at least one accepted, and afterwards epoch 1 is still refused while a
/// newer epoch-2 token is accepted.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn b405_live_epoch_beats_zombies() {
    let server = core();
    let mut c = server.client().await;
    let id = pick(&server, &mut c).await;
    let shard = unique_shard("b405");
    create(&mut c, &id, tok(&shard, 1, 1000))
        .await
        .expect("Create (1,1000) accepted");
    reach(&mut c, &id, S::Idle, SETTLE).await;

    let (target, fence) = (id.clone(), shard.clone());
    let results = fan_out(copies(&c, 24), move |i, mut c| {
        let (id, shard) = (target.clone(), fence.clone());
        let n = i64::try_from(i / 2).unwrap();
        let token = if i % 2 == 0 { (1, n) } else { (2, 100 + n) };
        async move {
            (
                token,
                create(&mut c, &id, tok(&shard, token.0, token.1)).await,
            )
        }
    })
    .await;
    let mut live_accepted = 0;
    for (token, result) in &results {
        if token.0 == 1 {
            assert_eq!(
                code(result),
                FP,
                "zombie {token:?} must be FAILED_PRECONDITION: {result:?}"
            );
        } else {
            let got = code(result);
            assert!(
                got == Code::Ok || got == FP,
                "live {token:?} must be OK or FAILED_PRECONDITION: {result:?}"
            );
            live_accepted += usize::from(got == Code::Ok);
        }
    }
    assert!(
        live_accepted >= 1,
        "no live token was accepted: {results:?}"
    );
    let zombie = create(&mut c, &id, tok(&shard, 1, 9)).await;
    assert_eq!(code(&zombie), FP, "(1,9) after the race: {zombie:?}");
    let live = create(&mut c, &id, tok(&shard, 2, 9999)).await;
    assert_eq!(code(&live), Code::Ok, "(2,9999) after the race: {live:?}");
}

/// B406: idempotency holds across two independent connections: 16 identical Configures
/// alternating between them collapse to one op id, and a further identical Configure on
/// each connection returns that same non-empty id.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn b406_idempotency_across_connections() {
    let server = core();
    let mut c1 = server.client().await;
    let mut c2 = server.client().await;
    let id = walk_to_idle(&server, &mut c1).await;
    let clients: Vec<Client> = (0..16)
        .map(|i| if i % 2 == 0 { c1.clone() } else { c2.clone() })
        .collect();
    let target = id.clone();
    let results = fan_out(clients, move |_, mut c| {
        let id = target.clone();
        async move { configure(&mut c, &id, "b406-cluster", &[("k", "v")], None).await }
    })
    .await;
    let op = single_op_id(&results);
    no_fp(&results);
    reached_exactly_once(&mut c1, &id, S::Configured).await;
    let a = configure(&mut c1, &id, "b406-cluster", &[("k", "v")], None)
        .await
        .expect("replay on connection 1");
    let b = configure(&mut c2, &id, "b406-cluster", &[("k", "v")], None)
        .await
        .expect("replay on connection 2");
    assert!(!a.operation_id.is_empty(), "empty op id on connection 1");
    assert_eq!(
        a.operation_id, b.operation_id,
        "the two connections got different op ids"
    );
    assert_eq!(
        a.operation_id, op,
        "the replay's op id differs from the burst's"
    );
}

/// B407: Creates on 8 different machines in parallel are independent: all accepted with
/// distinct non-empty op ids, and each machine reaches IDLE with no binding.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn b407_parallel_creates_on_different_machines() {
    let server = core();
    let mut c = server.client().await;
    let ids = pick_n(&server, &mut c, 8).await;
    let targets = ids.clone();
    let results = fan_out(copies(&c, 8), move |i, mut c| {
        let id = targets[i].clone();
        async move { create(&mut c, &id, None).await }
    })
    .await;
    let mut ops = BTreeSet::new();
    for (id, result) in ids.iter().zip(&results) {
        let ack = result
            .as_ref()
            .unwrap_or_else(|e| panic!("Create {id} failed: {e:?}"));
        assert!(!ack.operation_id.is_empty(), "empty op id for {id}");
        assert!(
            ops.insert(ack.operation_id.clone()),
            "op id {} shared by two machines",
            ack.operation_id
        );
    }
    for id in &ids {
        let m = reach(&mut c, id, S::Idle, Duration::from_secs(30)).await;
        assert!(
            m.cluster.is_empty() && m.shard_metadata.is_empty(),
            "binding bled into {id}: {m:?}"
        );
    }
}

/// B408: no ack in a burst of 16 identical Configures carries a torn snapshot: every
/// snapshot present is CONFIGURING or CONFIGURED, and a CONFIGURED one names the cluster.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn b408_burst_acks_carry_consistent_snapshots() {
    let server = core();
    let mut c = server.client().await;
    let id = walk_to_idle(&server, &mut c).await;
    let target = id.clone();
    let results = fan_out(copies(&c, 16), move |_, mut c| {
        let id = target.clone();
        async move { configure(&mut c, &id, "b408-cluster", &[("k", "v")], None).await }
    })
    .await;
    single_op_id(&results);
    for ack in results.iter().filter_map(|r| r.as_ref().ok()) {
        let Some(m) = &ack.machine else { continue };
        let s = state(m);
        assert!(
            matches!(s, S::Configuring | S::Configured),
            "torn snapshot in {s:?}: {m:?}"
        );
        if s == S::Configured {
            assert_eq!(
                m.cluster, "b408-cluster",
                "CONFIGURED snapshot without the cluster: {m:?}"
            );
        }
    }
    reached_exactly_once(&mut c, &id, S::Configured).await;
}

/// B409: 16 parallel identical Deletes collapse to one transition back to SPECULATIVE (the
/// core profile offers Delete).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn b409_parallel_deletes_collapse() {
    let server = core();
    let mut c = server.client().await;
    let id = walk_to_idle(&server, &mut c).await;
    let target = id.clone();
    let results = fan_out(copies(&c, 16), move |_, mut c| {
        let id = target.clone();
        async move { delete(&mut c, &id, None).await }
    })
    .await;
    assert!(
        results.iter().all(|r| code(r) != Code::Unimplemented),
        "the core profile must offer Delete: {results:?}"
    );
    single_op_id(&results);
    no_fp(&results);
    reached_exactly_once(&mut c, &id, S::Speculative).await;
}

crate::harness::backend::on_test_driver!(
    b401_parallel_creates_collapse,
    b402_parallel_configures_collapse,
    b403_parallel_drains_collapse_and_clear,
    b404_configure_drain_race_ends_consistent,
    b405_live_epoch_beats_zombies,
    b406_idempotency_across_connections,
    b407_parallel_creates_on_different_machines,
    b408_burst_acks_carry_consistent_snapshots,
    b409_parallel_deletes_collapse,
);

crate::harness::backend::on_real_libvirtd!(
    b401_parallel_creates_collapse,
    b402_parallel_configures_collapse,
    b403_parallel_drains_collapse_and_clear,
    b404_configure_drain_race_ends_consistent,
    b407_parallel_creates_on_different_machines,
    b409_parallel_deletes_collapse,
);
