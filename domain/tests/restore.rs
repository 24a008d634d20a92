//! Restore (docs/contract.md §5, §10): interrupted transitions come back Failed, everything else is
//! reloaded verbatim, and the store contract (applying change sets reproduces the snapshot).

mod common;

use bigfleet_libvirt_domain::{
    ChangeSet, CompletionOutcome, Core, FenceMark, Kind, Machine, MachineState, MutateError,
    OperationId, SeedError, Snapshot, TransitionResult,
};
use common::*;

fn restore(snapshot: Snapshot) -> (Core, Option<ChangeSet>) {
    Core::restore(policy(), snapshot).expect("snapshot restores")
}

/// A store that has seen a bit of everything: fences, ops, a binding with awkward metadata.
fn busy_core() -> Core {
    let mut core = seeded(4);
    call(&mut core, mutation("ghost", Kind::Create, token("s", 4, 3)));
    let ack = accept(&mut core, mutation(&id(0), Kind::Create, token("s", 2, 2)));
    settle(&mut core, &ack, success(Kind::Create));
    let ack = accept(&mut core, configure(&id(0), "c-1", awkward_metadata()));
    settle(&mut core, &ack, success(Kind::Configure));
    drive(&mut core, &id(1), MachineState::Failed);
    core
}

#[test]
fn interrupted_transitions_come_back_failed() {
    use MachineState as S;
    let cases = [
        (0, S::Creating, "create"),
        (1, S::Configuring, "configure"),
        (2, S::Draining, "drain"),
        (3, S::Deleting, "delete"),
    ];
    let mut core = seeded(5);
    for (i, state, _) in cases {
        drive(&mut core, &id(i), state);
    }
    let stored = core.snapshot();
    let (core, changes) = restore(stored.clone());
    let changes = changes.expect("recovery is persisted");
    assert_eq!(changes.machines.len(), 4);
    assert_eq!(changes.revision, stored.revision + 4);
    for (i, _, kind) in cases {
        let machine = get(&core, &id(i));
        assert_eq!(machine.state, S::Failed);
        let text = format!("{kind} transition interrupted by a provider restart; needs re-drive");
        assert_eq!(machine.last_error, text);
    }
    assert_eq!(
        state(&core, &id(4)),
        S::Speculative,
        "stable records are untouched"
    );
}

#[test]
fn recovered_records_keep_their_binding_and_host() {
    let mut core = seeded(2);
    drive(&mut core, &id(0), MachineState::Draining);
    drive(&mut core, &id(1), MachineState::Deleting);
    let (core, _) = restore(core.snapshot());
    let drained = get(&core, &id(0));
    assert_eq!(
        (drained.cluster.as_str(), drained.shard_metadata.clone()),
        ("c-1", map(&[("k", "v")]))
    );
    assert_eq!(get(&core, &id(1)).host, Some(host(0)));
}

#[test]
fn everything_else_is_restored_exactly() {
    let core = busy_core();
    let stored = core.snapshot();
    let (restored, changes) = restore(stored.clone());
    assert!(changes.is_none());
    assert_eq!(normalized(restored.snapshot()), normalized(stored));
    assert_eq!(
        restored.fence_mark(&key("s", "ghost")),
        Some(FenceMark {
            epoch: 4,
            sequence: 3
        })
    );
    assert_eq!(get(&restored, &id(0)).shard_metadata, awkward_metadata());
    assert_eq!(restored.revision(), core.revision());
}

#[test]
fn restored_fences_still_reject_stale_tokens() {
    let (mut core, _) = restore(busy_core().snapshot());
    let err = reject(&mut core, mutation(&id(0), Kind::Drain, token("s", 2, 2)));
    assert!(matches!(err, MutateError::Fenced { .. }), "{err:?}");
    let err = reject(&mut core, mutation("ghost", Kind::Create, token("s", 4, 3)));
    assert!(matches!(err, MutateError::Fenced { .. }), "{err:?}");
}

#[test]
fn snapshot_survives_a_json_round_trip() {
    let stored = busy_core().snapshot();
    let json = serde_json::to_string(&stored).expect("serialises");
    let back: Snapshot = serde_json::from_str(&json).expect("deserialises");
    assert_eq!(back, stored);
    let (core, _) = restore(back);
    assert_eq!(get(&core, &id(0)).shard_metadata, awkward_metadata());
}

#[test]
fn pre_restart_dispatches_are_dropped_after_restore() {
    let mut core = seeded(1);
    let ack = drive(&mut core, &id(0), MachineState::Creating).expect("dispatched");
    let (mut core, _) = restore(core.snapshot());
    let before = core.snapshot();
    let (outcome, changes) = core.complete(completion_for(&ack, success(Kind::Create)), T0);
    assert_eq!((outcome, changes), (CompletionOutcome::Dropped, None));
    assert_eq!(core.snapshot(), before);
}

#[test]
fn restore_rejects_records_out_of_shape() {
    let bad = [
        Machine {
            state: MachineState::Idle,
            ..speculative(0)
        },
        Machine {
            host: Some(host(0)),
            ..speculative(0)
        },
        Machine {
            cluster: "c".to_owned(),
            ..speculative(0)
        },
        Machine {
            state: MachineState::Configured,
            ..idle(0)
        },
        Machine {
            state: MachineState::Failed,
            ..speculative(0)
        },
        Machine {
            last_error: "stale".to_owned(),
            ..idle(0)
        },
        Machine {
            shard_metadata: map(&[("k", "v")]),
            ..idle(0)
        },
    ];
    for machine in bad {
        let snapshot = Snapshot {
            machines: vec![machine.clone()],
            revision: 1,
            ..Snapshot::default()
        };
        let result = Core::restore(policy(), snapshot).map(|(c, _)| c.len());
        assert!(
            matches!(result, Err(SeedError::Corrupt(_))),
            "{machine:?}: {result:?}"
        );
    }
}

#[test]
fn freshness() {
    assert!(Snapshot::default().is_fresh());
    let (empty, _) = Core::seed(policy(), Vec::new()).expect("empty seed");
    assert!(empty.snapshot().is_fresh());
    let not_fresh = [
        seeded(1).snapshot(),
        Snapshot {
            revision: 1,
            ..Snapshot::default()
        },
        Snapshot {
            next_operation: 1,
            ..Snapshot::default()
        },
        Snapshot {
            fences: vec![(key("s", "m"), FenceMark::default())],
            ..Snapshot::default()
        },
        Snapshot {
            operations: vec![(mid(0), Kind::Create, op("op-1"))],
            ..Snapshot::default()
        },
    ];
    for snapshot in not_fresh {
        assert!(!snapshot.is_fresh(), "{snapshot:?}");
    }
}

fn op(text: &str) -> OperationId {
    OperationId::from_stored(text.to_owned())
}

#[test]
fn fence_only_store_restores_its_marks() {
    let mut core = seeded(0);
    let decision = call(&mut core, mutation("ghost", Kind::Drain, token("z", 1, 1)));
    let mut store = core.snapshot();
    store.apply(&decision.changes.expect("fence advance"));
    let (mut core, _) = restore(store);
    let err = reject(&mut core, mutation("ghost", Kind::Drain, token("z", 1, 1)));
    assert!(matches!(err, MutateError::Fenced { .. }));
}

#[test]
fn applying_every_change_set_in_order_reproduces_the_snapshot() {
    let (mut core, seed) = Core::seed(policy(), (0..3).map(speculative).collect()).expect("valid");
    let mut store = Snapshot::default();
    store.apply(&seed);
    let mut commit = |changes: Option<ChangeSet>| changes.into_iter().for_each(|c| store.apply(&c));
    commit(call(&mut core, mutation("ghost", Kind::Create, token("s", 1, 1))).changes);
    let decision = call(&mut core, mutation(&id(0), Kind::Create, token("s", 1, 1)));
    let ack = decision.outcome.expect("accepted");
    commit(decision.changes);
    commit(
        core.complete(completion_for(&ack, success(Kind::Create)), T0)
            .1,
    );
    commit(call(&mut core, mutation(&id(0), Kind::Create, token("s", 1, 2))).changes);
    commit(
        core.reconcile(vec![Machine {
            price_per_hour: 0.7,
            ..speculative(1)
        }])
        .changes,
    );
    commit(call(&mut core, plain(&id(2), Kind::Create)).changes);
    let stored = normalized(store.clone());
    let (core, recovery) = restore(store);
    let mut store = stored;
    store.apply(&recovery.expect("m-002 was Creating"));
    assert_eq!(normalized(store), normalized(core.snapshot()));
}

#[test]
fn equal_maps_of_restored_records_share_one_allocation_and_edits_stay_private() {
    // A store hands back each record with maps of its own (deserialised apart).
    let snapshot = Snapshot {
        machines: (0..3).map(speculative).collect(),
        ..Snapshot::default()
    };
    assert!(
        !snapshot.machines[0]
            .resources
            .shares(&snapshot.machines[1].resources)
    );
    let (mut core, _) = restore(snapshot);
    let (a, b) = (get(&core, &id(0)), get(&core, &id(1)));
    assert!(a.resources.shares(&b.resources));
    assert!(a.allocatable.shares(&b.allocatable));
    // A Create whose hypervisor reports other resources changes that record alone.
    let ack = accept(&mut core, mutation(&id(0), Kind::Create, token("s", 1, 1)));
    let result = TransitionResult::Created {
        host: host(0),
        resources: Some(map(&[("cpu", "64")])),
        allocatable: None,
    };
    settle(&mut core, &ack, result);
    assert_eq!(get(&core, &id(0)).resources, map(&[("cpu", "64")]));
    assert_eq!(get(&core, &id(1)).resources, speculative(1).resources);
    assert_eq!(get(&core, &id(2)).resources, speculative(2).resources);
}
