//! Contract test suites every adapter runs (one suite, many adapters).

use bigfleet_libvirt_domain::{
    ChangeSet, Core, FenceToken, Machine, MachineId, MachineState, MutateRequest, Mutation, Policy,
    Snapshot, StringMap, Timestamp,
};

use crate::store::StateStore;

/// A Speculative machine for contract tests.
#[must_use]
pub fn speculative(id: &str) -> Machine {
    Machine {
        id: MachineId::new(id).expect("non-empty id"),
        state: MachineState::Speculative,
        host: None,
        instance_type: "kvm.small".to_owned(),
        zone: "zone-a".to_owned(),
        capacity_type: bigfleet_libvirt_domain::CapacityType::OnDemand,
        price_per_hour: 0.5,
        interruption_probability: 0.0,
        resources: StringMap::from([("cpu".to_owned(), "2".to_owned())]),
        allocatable: StringMap::new(),
        labels: StringMap::new(),
        last_error: String::new(),
        cluster: String::new(),
        shard_metadata: StringMap::new(),
        encoded: Default::default(),
    }
}

/// The `StateStore` contract: change sets committed in call order are what `load` returns
/// (the caller reopens the store between the two halves with `reopen`).
///
/// # Panics
/// When the store breaks its contract.
pub async fn state_store_contract<S, F, Fut>(store: S, reopen: F)
where
    S: StateStore,
    F: FnOnce(S) -> Fut,
    Fut: std::future::Future<Output = S>,
{
    let loaded = store.load().await.expect("load an empty store");
    assert!(loaded.is_fresh(), "a new store must load as a first boot");
    let machines = (0..5).map(|i| speculative(&format!("m-{i}"))).collect();
    let (mut core, seed) = Core::seed(Policy::default(), machines).expect("seed");
    let mut expected = Snapshot::default();
    let mut pending = vec![seed];
    let token = |seq| FenceToken {
        shard_id: "s".to_owned(),
        epoch: 1,
        sequence: seq,
    };
    for (i, request) in [MutateRequest::Create, MutateRequest::Delete]
        .into_iter()
        .enumerate()
    {
        let mutation = Mutation {
            machine_id: "m-1".to_owned(),
            token: token(i as i64 + 1),
            request,
        };
        pending.extend(core.mutate(mutation, Timestamp(1)).changes);
    }
    let ghost = Mutation {
        machine_id: "ghost".to_owned(),
        token: token(9),
        request: MutateRequest::Create,
    };
    pending.extend(core.mutate(ghost, Timestamp(2)).changes);
    // Enqueue every change set before awaiting any: the order of calls is the commit order.
    let futures: Vec<_> = pending
        .iter()
        .cloned()
        .map(|c: ChangeSet| store.commit(c))
        .collect();
    for f in futures {
        f.await.expect("commit");
    }
    for changes in &pending {
        expected.apply(changes);
    }
    let store = reopen(store).await;
    let mut loaded = store.load().await.expect("load after commits");
    normalise(&mut loaded);
    normalise(&mut expected);
    assert_eq!(
        loaded, expected,
        "load must equal the in-order application of every commit"
    );
    assert_eq!(loaded, {
        let mut s = core.snapshot();
        normalise(&mut s);
        s
    });
}

/// Sorts a snapshot's lists so two snapshots compare by content.
pub fn normalise(snapshot: &mut Snapshot) {
    snapshot.machines.sort_by(|a, b| a.id.cmp(&b.id));
    snapshot.fences.sort();
    snapshot.operations.sort();
}
