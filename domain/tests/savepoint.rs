//! Savepoints: rewinding decisions that could not be made durable restores the core exactly
//! (records, fence marks, operation ids, counters, the since_revision index and in-flight
//! transitions), so the provider can keep serving the last durable state.

mod common;

use bigfleet_libvirt_domain::{
    Completion, CompletionOutcome, Core, Kind, Machine, MachineState, Savepoint,
};
use common::*;

/// Everything observable about a core: its snapshot and a delta from every cursor.
fn observed(core: &Core) -> (bigfleet_libvirt_domain::Snapshot, Vec<Vec<String>>) {
    let deltas = (0..=core.revision())
        .map(|cursor| listed(core, &since(cursor)).into_iter().collect())
        .collect();
    (normalized(core.snapshot()), deltas)
}

#[test]
fn rewinding_a_run_of_decisions_newest_first_restores_the_core() {
    let mut core = seeded(4);
    let ack = accept(&mut core, mutation(&id(0), Kind::Create, token("s", 1, 1)));
    settle(&mut core, &ack, success(Kind::Create));
    let before = observed(&core);
    let mut savepoints: Vec<Savepoint> = Vec::new();
    let mut run = |core: &mut Core, decide: &dyn Fn(&mut Core)| {
        let ((), savepoint) = core.with_savepoint(|c| decide(c));
        savepoints.push(savepoint);
    };
    // A fence advance on a rejected call, an accept (new op id, in-flight), a completion,
    // a fresh fence key, a reconcile that adds a record and refreshes another.
    run(&mut core, &|c| {
        let _ = c.mutate(mutation("ghost", Kind::Create, token("s", 5, 1)), T0);
    });
    run(&mut core, &|c| {
        let _ = c.mutate(configure(&id(0), "c-1", awkward_metadata()), T0);
    });
    let in_flight = core.operation(&mid(0), Kind::Configure).cloned();
    run(&mut core, &|c| {
        let completion = Completion {
            machine_id: mid(0),
            kind: Kind::Configure,
            operation_id: in_flight.clone().expect("configure accepted"),
            result: success(Kind::Configure),
        };
        let _ = c.complete(completion, T0);
    });
    run(&mut core, &|c| {
        let _ = c.mutate(mutation(&id(1), Kind::Create, token("t", 1, 1)), T0);
    });
    run(&mut core, &|c| {
        let mut refreshed: Machine = speculative(2);
        refreshed.price_per_hour = 0.75;
        let _ = c.reconcile(vec![speculative(9), refreshed]);
    });
    let after = observed(&core);
    assert_ne!(after, before, "the decisions changed the core");
    assert!(savepoints.iter().all(|s| !s.is_empty()));
    let mut redos: Vec<Savepoint> = savepoints
        .into_iter()
        .rev()
        .map(|savepoint| core.rewind(savepoint))
        .collect();
    assert_eq!(observed(&core), before);
    // The rewind is itself undoable: redoing oldest first puts every decision back.
    redos.reverse();
    for redo in redos {
        let _ = core.rewind(redo);
    }
    assert_eq!(observed(&core), after);
}

#[test]
fn a_rewound_completion_can_be_applied_again() {
    let mut core = seeded(2);
    let ack = accept(&mut core, plain(&id(0), Kind::Create));
    let (outcome, savepoint) = core.with_savepoint(|c| {
        c.complete(completion_for(&ack, success(Kind::Create)), T0)
            .0
    });
    assert!(matches!(outcome, CompletionOutcome::Applied(_)));
    assert_eq!(state(&core, &id(0)), MachineState::Idle);
    let _ = core.rewind(savepoint);
    assert_eq!(state(&core, &id(0)), MachineState::Creating);
    // The transition is in flight again, so its completion is not dropped as stale.
    let machine = settle(&mut core, &ack, success(Kind::Create));
    assert_eq!(machine.state, MachineState::Idle);
}

#[test]
fn a_rewound_accept_frees_its_fence_mark_and_operation_counter() {
    let mut core = seeded(2);
    let (decision, savepoint) =
        core.with_savepoint(|c| c.mutate(mutation(&id(0), Kind::Create, token("s", 3, 3)), T0));
    let first = decision.outcome.expect("accepted").operation_id;
    let _ = core.rewind(savepoint);
    assert_eq!(state(&core, &id(0)), MachineState::Speculative);
    assert_eq!(core.fence_mark(&key("s", &id(0))), None);
    assert_eq!(recorded(&core, &id(0), Kind::Create), None);
    // The same token passes again and mints the same operation id: nothing leaked.
    let again = accept(&mut core, mutation(&id(0), Kind::Create, token("s", 3, 3)));
    assert_eq!(again.operation_id, first);
}

#[test]
fn a_decision_that_changed_nothing_has_an_empty_savepoint() {
    let mut core = seeded(1);
    let (decision, savepoint) = core.with_savepoint(|c| c.mutate(plain("ghost", Kind::Create), T0));
    assert!(decision.changes.is_none());
    assert!(savepoint.is_empty());
}
