//! The lanes through the adapter on the test driver: calls held on their blocking thread by
//! a gate stand in for slow libvirt calls (a Create storm, agents that never answer), and
//! a counter wrapped around every call checks the host budget.

// The tests wait in real time for blocking threads and run the held calls as tasks.
#![allow(clippy::disallowed_methods)]

use std::collections::BTreeSet;
use std::sync::{Condvar, Mutex};

use super::*;
use crate::host::connection::Host;
use crate::host::lanes::{Budget, Lane};

/// Holds calls on their threads until opened; counts what is running.
#[derive(Default)]
struct Gate {
    state: Mutex<(bool, usize, usize)>,
    changed: Condvar,
}

impl Gate {
    fn enter(&self) {
        let mut state = self.state.lock().unwrap();
        state.1 += 1;
        state.2 = state.2.max(state.1);
        self.changed.notify_all();
        while !state.0 {
            state = self.changed.wait(state).unwrap();
        }
        state.1 -= 1;
    }

    fn open(&self) {
        self.state.lock().unwrap().0 = true;
        self.changed.notify_all();
    }

    fn running(&self) -> usize {
        self.state.lock().unwrap().1
    }

    fn peak(&self) -> usize {
        self.state.lock().unwrap().2
    }
}

/// Opens its gate when dropped, so a failing test does not leave threads held (the
/// runtime waits for them at shutdown).
struct OpenOnDrop(Arc<Gate>);

impl Drop for OpenOnDrop {
    fn drop(&mut self) {
        self.0.open();
    }
}

/// Starts `count` calls of `lane` that wait at `gate`.
fn held(
    host: &Arc<Host>,
    gate: &Arc<Gate>,
    lane: Lane,
    count: usize,
) -> Vec<tokio::task::JoinHandle<()>> {
    (0..count)
        .map(|_| {
            let (host, gate) = (Arc::clone(host), Arc::clone(gate));
            tokio::spawn(async move {
                host.call(lane, move |_| {
                    gate.enter();
                    Ok(())
                })
                .await
                .unwrap();
            })
        })
        .collect()
}

/// Waits (real time, at most 10 s) until `n` held calls run.
async fn until_running(gate: &Gate, n: usize) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while gate.running() < n {
        assert!(
            std::time::Instant::now() < deadline,
            "{} running",
            gate.running()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

async fn within<T>(what: &str, f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(10), f)
        .await
        .unwrap_or_else(|_| panic!("{what} did not finish within 10 s"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delete_and_a_describe_overtake_sixteen_queued_creates() {
    let rig = rig().await;
    let host = Arc::clone(&rig.hv.inner.hosts[ZONE]);
    let machine = create(&rig.hv, &rig.slots[0]).await.unwrap();
    let gate = Arc::new(Gate::default());
    let _open = OpenOnDrop(Arc::clone(&gate));
    // At the default budget, all but the teardown and read reservations run Creates.
    let creating = Budget::default().host - 3;
    let storm = held(&host, &gate, Lane::Create, 16 + creating);
    until_running(&gate, creating).await;
    within("queueing", async {
        while host.lanes().queued()[1] < 16 {
            tokio::task::yield_now().await;
        }
    })
    .await;
    // Both finish while every Create still holds its slot or waits for one.
    let described = within("describe", rig.hv.describe()).await.unwrap();
    assert_eq!(described.len(), rig.slots.len());
    within("delete", delete(&rig.hv, &machine)).await.unwrap();
    assert_eq!(gate.running(), creating);
    assert_eq!(host.lanes().queued()[1], 16);
    gate.open();
    for call in storm {
        call.await.unwrap();
    }
    assert!(
        gate.peak() <= Budget::default().host,
        "peak {}",
        gate.peak()
    );
    assert_eq!(host.lanes().in_flight(), [0; 4]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_that_never_answer_leave_creates_their_slots() {
    let rig = rig().await;
    let host = Arc::clone(&rig.hv.inner.hosts[ZONE]);
    let gate = Arc::new(Gate::default());
    let _open = OpenOnDrop(Arc::clone(&gate));
    // Eight guests whose agent commands run into their timeout.
    let stuck = held(&host, &gate, Lane::Agent, 8);
    until_running(&gate, 1).await;
    // Two Creates run their whole define/start sequence meanwhile.
    for slot in &rig.slots[..2] {
        within("create", create(&rig.hv, slot)).await.unwrap();
    }
    assert_eq!(gate.running(), 1, "the agent share is one slot");
    assert_eq!(host.lanes().queued()[3], 7);
    gate.open();
    for call in stuck {
        call.await.unwrap();
    }
    assert_eq!(gate.peak(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_budget_flag_bounds_calls_in_flight() {
    let rig = rig_with(
        &Fixture::default(),
        slots("libvirt", ZONE, "kvm.small", 1),
        |c| {
            c.options.budget = Budget::new(6, 2).unwrap();
        },
    )
    .await;
    let host = Arc::clone(&rig.hv.inner.hosts[ZONE]);
    let gate = Arc::new(Gate::default());
    let _open = OpenOnDrop(Arc::clone(&gate));
    let mut calls = held(&host, &gate, Lane::Teardown, 10);
    calls.extend(held(&host, &gate, Lane::Read, 10));
    until_running(&gate, 6).await;
    // Settle: nothing more starts while all six hold their slots.
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(gate.running(), 6);
    gate.open();
    for call in calls {
        call.await.unwrap();
    }
    assert_eq!(gate.peak(), 6);
    let text = rig.hv.inner.metrics.lanes.render();
    assert!(
        text.contains("bigfleet_libvirt_host_budget{zone=\"rack1\"} 6"),
        "{text}"
    );
}

/// A host of three connections on the shared `test:///default` (the adapter gives a
/// test-driver URI one connection, because a node file's host is per connection; the
/// default host is shared, so three connections see one host).
fn three_connection_host(budget: Budget) -> Arc<Host> {
    let policy = HostPolicy {
        probe_interval: Duration::from_millis(200),
        backoff_min: Duration::from_millis(10),
        backoff_max: Duration::from_millis(100),
        watch_interval: Duration::ZERO,
        ..HostPolicy::default()
    };
    let at = HostConnection {
        zone: "spread".to_owned(),
        uri: "test:///default".to_owned(),
    };
    Host::new(
        &at,
        policy,
        budget,
        3,
        crate::metrics::lanes::LaneMetrics::default(),
        LibvirtMetrics::unexposed(),
        crate::host::gate::Checks::default(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_spread_over_the_hosts_connections_and_a_loss_redials_them_all() {
    let host = three_connection_host(Budget::new(6, 1).unwrap());
    let supervisor = tokio::spawn(crate::host::connection::supervise(
        Arc::downgrade(&host),
        SystemClock,
        1,
    ));
    within("the first dial", host.healthy()).await;
    let (first, _) = host.sessions();
    assert_eq!(first.len(), 3);
    let gate = Arc::new(Gate::default());
    let _open = OpenOnDrop(Arc::clone(&gate));
    let used = Arc::new(Mutex::new(BTreeSet::new()));
    let calls: Vec<_> = (0..6)
        .map(|n| {
            let (host, gate, used) = (Arc::clone(&host), Arc::clone(&gate), Arc::clone(&used));
            let lane = if n % 2 == 0 {
                Lane::Teardown
            } else {
                Lane::Read
            };
            tokio::spawn(async move {
                host.call(lane, move |session| {
                    let address = std::ptr::from_ref(session) as usize;
                    used.lock().unwrap().insert(address);
                    gate.enter();
                    Ok(())
                })
                .await
                .unwrap();
            })
        })
        .collect();
    until_running(&gate, 6).await;
    // Six calls over three connections: two on each, none on one connection alone.
    assert_eq!(host.sessions().1, [2, 2, 2]);
    gate.open();
    for call in calls {
        call.await.unwrap();
    }
    assert_eq!(
        used.lock().unwrap().len(),
        3,
        "every connection carried calls"
    );
    assert_eq!(host.sessions().1, [0, 0, 0]);
    // A lost connection takes its siblings with it: all three are dialled again together
    // (the supervisor may have redialled before this looks: wait for the new generation).
    host.sever();
    let second = within("the redial", async {
        loop {
            let (sessions, _) = host.sessions();
            if sessions
                .first()
                .is_some_and(|s| s.generation > first[0].generation)
            {
                break sessions;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    assert_eq!(second.len(), 3);
    assert!(
        second
            .iter()
            .all(|s| s.generation == first[0].generation + 1),
        "one new generation for all connections"
    );
    supervisor.abort();
}
