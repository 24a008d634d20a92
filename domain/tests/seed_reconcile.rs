//! Seeding and reconcile (docs/contract.md §7, §9): field-shape validation, duplicates, adoption of
//! unknown records and the narrow set of substrate facts a reconcile may refresh.

mod common;

use bigfleet_libvirt_domain::{
    CapacityType, Core, HostRef, InvalidMachine, Kind, Machine, MachineState, Policy, SeedError,
    StringMap, TransitionResult, validate_instance,
};
use common::*;

fn with(edit: impl FnOnce(&mut Machine)) -> Machine {
    let mut machine = speculative(0);
    edit(&mut machine);
    machine
}

fn seed_error(machine: Machine) -> InvalidMachine {
    match Core::seed(policy(), vec![speculative(1), machine]) {
        Err(SeedError::Invalid(invalid)) => invalid,
        other => panic!("seed must fail, got {:?}", other.map(|(c, _)| c.len())),
    }
}

#[test]
fn seed_rejects_every_field_shape_rule() {
    use InvalidMachine as I;
    let host = || Some(host(0));
    let id = || id(0);
    let cases: Vec<(Machine, InvalidMachine)> = vec![
        (
            with(|m| m.instance_type.clear()),
            I::MissingInstanceType { id: id() },
        ),
        (
            with(|m| m.capacity_type = CapacityType::Unspecified),
            I::MissingCapacityType { id: id() },
        ),
        (with(|m| m.zone.clear()), I::MissingZone { id: id() }),
        (
            with(|m| m.price_per_hour = -0.01),
            I::BadPrice {
                id: id(),
                price: -0.01,
            },
        ),
        (
            with(|m| m.price_per_hour = f64::INFINITY),
            I::BadPrice {
                id: id(),
                price: f64::INFINITY,
            },
        ),
        (
            with(|m| m.price_per_hour = f64::NEG_INFINITY),
            I::BadPrice {
                id: id(),
                price: f64::NEG_INFINITY,
            },
        ),
        (
            with(|m| m.interruption_probability = 1.01),
            I::BadProbability {
                id: id(),
                probability: 1.01,
            },
        ),
        (
            with(|m| m.interruption_probability = -0.1),
            I::BadProbability {
                id: id(),
                probability: -0.1,
            },
        ),
        (
            with(|m| m.capacity_type = CapacityType::Spot),
            I::SpotWithoutProbability { id: id() },
        ),
        (
            with(|m| m.state = MachineState::Idle),
            I::BadState {
                id: id(),
                state: MachineState::Idle,
                host: "without a host",
            },
        ),
        (
            with(|m| m.host = host()),
            I::BadState {
                id: id(),
                state: MachineState::Speculative,
                host: "with a host",
            },
        ),
        (
            with(|m| (m.state, m.host) = (MachineState::Configured, host())),
            I::BadState {
                id: id(),
                state: MachineState::Configured,
                host: "with a host",
            },
        ),
        (
            with(|m| m.state = MachineState::Creating),
            I::BadState {
                id: id(),
                state: MachineState::Creating,
                host: "without a host",
            },
        ),
        (
            with(|m| (m.state, m.host) = (MachineState::Failed, host())),
            I::BadState {
                id: id(),
                state: MachineState::Failed,
                host: "with a host",
            },
        ),
    ];
    for (machine, expected) in cases {
        assert_eq!(seed_error(machine), expected);
    }
}

#[test]
fn nan_price_and_probability_are_rejected() {
    let price = seed_error(with(|m| m.price_per_hour = f64::NAN));
    assert!(matches!(price, InvalidMachine::BadPrice { price, .. } if price.is_nan()));
    let p = seed_error(with(|m| m.interruption_probability = f64::NAN));
    assert!(
        matches!(p, InvalidMachine::BadProbability { probability, .. } if probability.is_nan())
    );
}

#[test]
fn valid_variants_pass_validation() {
    let spot = with(|m| (m.capacity_type, m.interruption_probability) = (CapacityType::Spot, 0.05));
    let bare = with(|m| (m.capacity_type, m.price_per_hour) = (CapacityType::BareMetal, 0.0));
    let empty_host = with(|m| m.host = Some(HostRef::default()));
    let provider_only = Machine {
        host: Some(HostRef {
            provider: "p".to_owned(),
            reference: String::new(),
        }),
        ..idle(0)
    };
    for machine in [
        speculative(0),
        idle(0),
        spot,
        bare,
        empty_host,
        provider_only,
    ] {
        assert_eq!(validate_instance(&machine, true), Ok(()), "{machine:?}");
    }
}

#[test]
fn zone_is_required_only_when_the_policy_says_so() {
    let zoneless = with(|m| m.zone.clear());
    assert!(validate_instance(&zoneless, true).is_err());
    assert_eq!(validate_instance(&zoneless, false), Ok(()));
    let policy = Policy {
        require_zone: false,
        ..policy()
    };
    assert!(Core::seed(policy, vec![zoneless]).is_ok());
}

#[test]
fn seed_rejects_duplicates() {
    let result = Core::seed(policy(), vec![speculative(0), speculative(1), idle(0)]);
    let err = result.map(|(c, _)| c.len()).expect_err("duplicate");
    assert_eq!(
        err,
        SeedError::Invalid(InvalidMachine::Duplicate { id: id(0) })
    );
}

#[test]
fn seed_emits_every_record_and_the_counters() {
    let (core, changes) = Core::seed(policy(), vec![speculative(0), idle(1)]).expect("valid");
    assert_eq!(changes.machines.len(), 2);
    assert_eq!((changes.revision, changes.next_operation), (2, 0));
    assert!(changes.fences.is_empty() && changes.operations.is_empty());
    assert_eq!(state(&core, &id(1)), MachineState::Idle);
    let (empty, nothing) = Core::seed(policy(), Vec::new()).expect("empty seed is fine");
    assert!(empty.is_empty() && nothing.is_empty() && empty.revision() == 0);
}

#[test]
fn reconcile_adopts_unknown_records_with_their_hint() {
    let mut core = seeded(1);
    let rev = core.revision();
    let report = core.reconcile(vec![speculative(0), idle(4), speculative(5)]);
    assert_eq!(report.added, vec![mid(4), mid(5)]);
    assert!(report.refreshed.is_empty() && report.skipped.is_empty());
    let changes = report.changes.expect("added records are persisted");
    assert_eq!(changes.machines.len(), 2);
    assert_eq!(core.revision(), rev + 2);
    assert_eq!(state(&core, &id(4)), MachineState::Idle);
    assert_eq!(get(&core, &id(4)).host, Some(host(4)));
}

fn substrate_drift(i: usize) -> Machine {
    Machine {
        host: Some(HostRef {
            provider: "elsewhere".to_owned(),
            reference: "z-b/other".to_owned(),
        }),
        instance_type: "kvm.huge".to_owned(),
        zone: "z-b".to_owned(),
        capacity_type: CapacityType::Spot,
        price_per_hour: 0.9,
        interruption_probability: 0.2,
        resources: map(&[("cpu", "16")]).into(),
        allocatable: map(&[("cpu", "32")]).into(),
        labels: map(&[("rack", "r7")]).into(),
        ..idle(i)
    }
}

#[test]
fn reconcile_refreshes_only_substrate_facts_of_known_records() {
    let mut core = seeded(1);
    drive(&mut core, &id(0), MachineState::Idle);
    let ack = accept(&mut core, configure(&id(0), "c-9", awkward_metadata()));
    settle(&mut core, &ack, success(Kind::Configure));
    let before = get(&core, &id(0));
    let drift = substrate_drift(0);
    let report = core.reconcile(vec![drift.clone()]);
    assert_eq!(report.refreshed, vec![mid(0)]);
    let expected = Machine {
        price_per_hour: drift.price_per_hour,
        interruption_probability: drift.interruption_probability,
        resources: drift.resources,
        allocatable: drift.allocatable,
        labels: drift.labels,
        ..before
    };
    assert_eq!(get(&core, &id(0)), expected);
}

#[test]
fn reconcile_never_revives_a_failed_machine() {
    let mut core = seeded(1);
    let ack = accept(&mut core, plain(&id(0), Kind::Create));
    settle(&mut core, &ack, TransitionResult::Failed("gone".to_owned()));
    let report = core.reconcile(vec![substrate_drift(0)]);
    assert_eq!(report.refreshed, vec![mid(0)]);
    let machine = get(&core, &id(0));
    assert_eq!(
        (machine.state, machine.last_error.as_str()),
        (MachineState::Failed, "gone")
    );
    assert_eq!(machine.host, None);
}

#[test]
fn reconcile_skips_invalid_records_and_keeps_going() {
    let mut core = seeded(1);
    let bad = Machine {
        instance_type: String::new(),
        ..speculative(7)
    };
    let mut fine = speculative(0);
    fine.price_per_hour = 0.6;
    let report = core.reconcile(vec![
        bad,
        fine,
        Machine {
            zone: String::new(),
            ..speculative(8)
        },
    ]);
    assert_eq!(
        report.skipped,
        vec![
            InvalidMachine::MissingInstanceType { id: id(7) },
            InvalidMachine::MissingZone { id: id(8) },
        ]
    );
    assert_eq!(report.refreshed, vec![mid(0)]);
    assert!(core.get(&id(7)).is_none() && core.get(&id(8)).is_none());
}

#[test]
fn reconcile_with_no_changes_is_silent() {
    let mut core = seeded(3);
    drive(&mut core, &id(1), MachineState::Configured);
    let rev = core.revision();
    let before = core.snapshot();
    let described = vec![speculative(0), idle(1), speculative(2)];
    let report = core.reconcile(described);
    assert_eq!(report, Default::default());
    assert_eq!(core.revision(), rev);
    assert_eq!(core.snapshot(), before);
    assert!(
        core.reconcile(Vec::new()).changes.is_none(),
        "absent records are never removed"
    );
    assert_eq!(core.len(), 3);
}

#[test]
fn reconcile_leaves_in_flight_transitions_completable() {
    let mut core = seeded(1);
    let ack = drive(&mut core, &id(0), MachineState::Creating).expect("dispatched");
    let report = core.reconcile(vec![substrate_drift(0)]);
    assert_eq!(report.refreshed, vec![mid(0)]);
    assert_eq!(state(&core, &id(0)), MachineState::Creating);
    let machine = settle(&mut core, &ack, success(Kind::Create));
    assert_eq!(
        (machine.state, machine.price_per_hour),
        (MachineState::Idle, 0.9)
    );
}

#[test]
fn duplicate_in_one_reconcile_refreshes_the_adopted_record() {
    let mut core = seeded(0);
    let report = core.reconcile(vec![speculative(3), substrate_drift(3)]);
    assert_eq!(
        (report.added, report.refreshed),
        (vec![mid(3)], vec![mid(3)])
    );
    let machine = get(&core, &id(3));
    assert_eq!(
        (machine.state, machine.price_per_hour),
        (MachineState::Speculative, 0.9)
    );
}

#[test]
fn each_refreshable_fact_alone_triggers_a_refresh() {
    let edits: [fn(&mut Machine); 5] = [
        |m| m.price_per_hour = 0.25,
        |m| m.interruption_probability = 0.5,
        |m| m.resources = map(&[("cpu", "1")]).into(),
        |m| m.allocatable = StringMap::new().into(),
        |m| m.labels = map(&[("rack", "r1")]).into(),
    ];
    for (n, edit) in edits.into_iter().enumerate() {
        let mut core = seeded(1);
        let rev = core.revision();
        let report = core.reconcile(vec![with(edit)]);
        assert_eq!(report.refreshed, vec![mid(0)], "edit {n}");
        assert_eq!(get(&core, &id(0)), with(edit), "edit {n}");
        assert_eq!(core.revision(), rev + 1, "edit {n}");
    }
}

#[test]
fn identity_and_lifecycle_drift_alone_is_no_change() {
    let edits: [fn(&mut Machine); 5] = [
        |m| m.instance_type = "kvm.huge".to_owned(),
        |m| m.zone = "z-b".to_owned(),
        |m| m.capacity_type = CapacityType::Reserved,
        |m| (m.state, m.host) = (MachineState::Idle, Some(host(3))),
        |m| m.host = Some(HostRef::default()),
    ];
    for (n, edit) in edits.into_iter().enumerate() {
        let mut core = seeded(1);
        let before = core.snapshot();
        let report = core.reconcile(vec![with(edit)]);
        assert_eq!(report, Default::default(), "edit {n}");
        assert_eq!(core.snapshot(), before, "edit {n}");
    }
}
