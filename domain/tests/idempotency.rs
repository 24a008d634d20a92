//! Idempotency (docs/contract.md §4, certification B214): op ids from one global counter, reuse
//! only in the kind's transitional state or stable target, request payload not part of the key.

mod common;

use bigfleet_libvirt_domain::{Core, Kind, MachineState, MutateError, Policy, TransitionResult};
use common::*;

#[test]
fn op_ids_come_from_one_global_counter() {
    let mut core = seeded(3);
    let ids: Vec<String> = (0..3)
        .map(|i| {
            accept(&mut core, plain(&id(i), Kind::Create))
                .operation_id
                .to_string()
        })
        .collect();
    assert_eq!(ids, ["op-1", "op-2", "op-3"]);
}

#[test]
fn custom_prefix_is_used_for_minting() {
    let policy = Policy {
        operation_prefix: "lv".to_owned(),
        ..policy()
    };
    let mut core = seeded_with(policy, vec![speculative(0)]);
    assert_eq!(
        accept(&mut core, plain(&id(0), Kind::Create))
            .operation_id
            .as_str(),
        "lv-1"
    );
}

#[test]
fn b214_five_distinct_ids_across_a_cycle_and_replay_reuses_the_last() {
    let mut core = seeded(1);
    let m = id(0);
    let mut ids = Vec::new();
    let cycle = [
        (plain(&m, Kind::Create), Kind::Create),
        (
            configure(&m, "conf-b214", map(&[("k", "1")])),
            Kind::Configure,
        ),
        (plain(&m, Kind::Drain), Kind::Drain),
        (
            configure(&m, "conf-b214-b", map(&[("k", "2")])),
            Kind::Configure,
        ),
        (plain(&m, Kind::Drain), Kind::Drain),
    ];
    for (mutation, kind) in cycle {
        let ack = accept(&mut core, mutation);
        settle(&mut core, &ack, success(kind));
        ids.push(ack.operation_id.to_string());
    }
    assert_eq!(ids, ["op-1", "op-2", "op-3", "op-4", "op-5"]);
    assert_eq!(op_of(&mut core, plain(&m, Kind::Drain)), "op-5");
}

#[test]
fn identical_retries_collapse_into_one_transition() {
    let mut core = seeded(1);
    let first = accept(&mut core, plain(&id(0), Kind::Create));
    let rev = core.revision();
    for _ in 0..5 {
        let decision = call(&mut core, plain(&id(0), Kind::Create));
        let ack = decision.outcome.expect("idempotent");
        assert_eq!(ack.operation_id, first.operation_id);
        assert!(ack.dispatch.is_none(), "a retry must not re-dispatch");
        assert_eq!(decision.changes, None);
    }
    assert_eq!(core.revision(), rev);
}

#[test]
fn reconfigure_with_another_binding_changes_nothing() {
    for settled in [false, true] {
        let mut core = seeded(1);
        drive(&mut core, &id(0), MachineState::Idle);
        let first = accept(&mut core, configure(&id(0), "c-one", map(&[("a", "1")])));
        if settled {
            settle(&mut core, &first, success(Kind::Configure));
        }
        let before = core.snapshot();
        let decision = call(&mut core, configure(&id(0), "c-two", map(&[("b", "2")])));
        let ack = decision.outcome.expect("idempotent re-Configure");
        assert_eq!(ack.operation_id, first.operation_id, "settled={settled}");
        assert_eq!(ack.machine.cluster, "c-one");
        assert_eq!(ack.machine.shard_metadata, map(&[("a", "1")]));
        assert_eq!(decision.changes, None);
        assert_eq!(core.snapshot(), before);
    }
}

#[test]
fn create_delete_create_mints_a_new_create_id() {
    let mut core = seeded(1);
    let m = id(0);
    let create = accept(&mut core, plain(&m, Kind::Create));
    settle(&mut core, &create, success(Kind::Create));
    let delete = accept(&mut core, plain(&m, Kind::Delete));
    settle(&mut core, &delete, success(Kind::Delete));
    assert_eq!(
        op_of(&mut core, plain(&m, Kind::Delete)),
        delete.operation_id.as_str()
    );
    let again = accept(&mut core, plain(&m, Kind::Create));
    assert_eq!(again.operation_id.as_str(), "op-3");
    assert_ne!(again.operation_id, create.operation_id);
    assert_eq!(
        recorded(&core, &m, Kind::Create).as_deref(),
        Some("op-3"),
        "record overwritten"
    );
}

#[test]
fn configure_from_idle_is_always_a_fresh_id() {
    let mut core = seeded(1);
    let m = id(0);
    drive(&mut core, &m, MachineState::Configured);
    let drain = accept(&mut core, plain(&m, Kind::Drain));
    settle(&mut core, &drain, success(Kind::Drain));
    let old = recorded(&core, &m, Kind::Configure).expect("configured once");
    let again = accept(&mut core, plain(&m, Kind::Configure));
    assert_ne!(again.operation_id.as_str(), old);
}

#[test]
fn at_target_quirk_returns_an_earlier_cycles_create_id() {
    let mut core = seeded(1);
    let m = id(0);
    let create = drive(&mut core, &m, MachineState::Idle).expect("created");
    let configure = accept(&mut core, plain(&m, Kind::Configure));
    settle(&mut core, &configure, success(Kind::Configure));
    let drain = accept(&mut core, plain(&m, Kind::Drain));
    settle(&mut core, &drain, success(Kind::Drain));
    assert_eq!(
        op_of(&mut core, plain(&m, Kind::Create)),
        create.operation_id.as_str()
    );
    assert_eq!(
        op_of(&mut core, plain(&m, Kind::Drain)),
        drain.operation_id.as_str()
    );
}

fn fail_kind(core: &mut Core, m: &str, kind: Kind) {
    let target = match kind {
        Kind::Create => MachineState::Creating,
        Kind::Configure => MachineState::Configuring,
        Kind::Drain => MachineState::Draining,
        Kind::Delete => MachineState::Deleting,
    };
    let ack = drive(core, m, target).expect("dispatched");
    settle(
        core,
        &ack,
        TransitionResult::Failed(format!("{kind} broke")),
    );
}

#[test]
fn retrying_the_operation_that_failed_is_out_of_position() {
    for kind in Kind::ALL {
        let mut core = seeded(1);
        fail_kind(&mut core, &id(0), kind);
        let before = core.snapshot();
        let decision = call(&mut core, plain(&id(0), kind));
        let expected = MutateError::OutOfPosition {
            machine_id: id(0),
            kind,
            state: MachineState::Failed,
        };
        assert_eq!(decision.outcome, Err(expected), "{kind}");
        assert_eq!(decision.changes, None);
        assert_eq!(core.snapshot(), before);
    }
}

#[test]
fn rejections_never_consume_an_op_id() {
    let mut core = seeded(2);
    reject(&mut core, plain(&id(0), Kind::Drain));
    reject(&mut core, plain("ghost", Kind::Create));
    reject(&mut core, plain(&id(0), Kind::Configure));
    assert_eq!(
        accept(&mut core, plain(&id(1), Kind::Create))
            .operation_id
            .as_str(),
        "op-1"
    );
}

#[test]
fn counters_and_records_survive_restore() {
    let mut core = seeded(2);
    let create = drive(&mut core, &id(0), MachineState::Idle).expect("created");
    let (mut core, changes) = Core::restore(policy(), core.snapshot()).expect("restores");
    assert!(changes.is_none(), "nothing was transitional");
    assert_eq!(
        op_of(&mut core, plain(&id(0), Kind::Create)),
        create.operation_id.as_str()
    );
    let next = accept(&mut core, plain(&id(1), Kind::Create));
    assert_eq!(
        next.operation_id.as_str(),
        "op-2",
        "no id reuse after a restart"
    );
}

#[test]
fn counter_survives_restore_even_when_the_minting_machine_was_interrupted() {
    let mut core = seeded(2);
    drive(&mut core, &id(0), MachineState::Creating);
    drive(&mut core, &id(1), MachineState::Creating);
    let (core, _) = Core::restore(policy(), core.snapshot()).expect("restores");
    let (mut core, _) = Core::restore(policy(), core.snapshot()).expect("restores twice");
    let reconciled = core.reconcile(vec![speculative(2)]);
    assert_eq!(reconciled.added, vec![mid(2)]);
    assert_eq!(
        accept(&mut core, plain(&id(2), Kind::Create))
            .operation_id
            .as_str(),
        "op-3"
    );
}
