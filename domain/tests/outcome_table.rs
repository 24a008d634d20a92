//! The outcome matrix of docs/contract.md §2.5 and §4: every state × every kind, with and without
//! prior operation records, rendered as a reviewed snapshot and checked against an oracle
//! transcribed from the contract table.

mod common;

use std::fmt::Write as _;

use bigfleet_libvirt_domain::{
    Core, Kind, Machine, MachineState, MutateError, Policy, Snapshot, TransitionResult,
};
use common::*;

type Build = fn() -> Core;

fn settled(core: &mut Core, kind: Kind, result: TransitionResult) {
    let ack = accept(core, plain(&id(0), kind));
    settle(core, &ack, result);
}

fn at(target: MachineState) -> Core {
    let mut core = seeded(1);
    drive(&mut core, &id(0), target);
    core
}

fn failed_in(target: MachineState) -> Core {
    let mut core = seeded(1);
    let ack = drive(&mut core, &id(0), target).expect("dispatched");
    settle(&mut core, &ack, TransitionResult::Failed("boom".to_owned()));
    core
}

fn restored(machine: Machine) -> Core {
    let snapshot = Snapshot {
        machines: vec![machine],
        revision: 1,
        ..Snapshot::default()
    };
    Core::restore(policy(), snapshot).expect("restores").0
}

fn scenarios() -> Vec<(&'static str, Build)> {
    use MachineState as S;
    vec![
        ("Speculative, seeded", || at(S::Speculative)),
        ("Speculative, after create+delete", || {
            let mut core = at(S::Idle);
            settled(&mut core, Kind::Delete, success(Kind::Delete));
            core
        }),
        ("Creating", || at(S::Creating)),
        ("Idle, seeded Idle", || seeded_with(policy(), vec![idle(0)])),
        ("Idle, after create", || at(S::Idle)),
        ("Idle, after create+configure+drain", || {
            let mut core = at(S::Configured);
            settled(&mut core, Kind::Drain, success(Kind::Drain));
            core
        }),
        ("Configuring", || at(S::Configuring)),
        ("Configured, after configure", || at(S::Configured)),
        ("Configured, restored without ops", || {
            let bound = map(&[("k", "v")]);
            restored(Machine {
                state: S::Configured,
                cluster: "c-1".into(),
                shard_metadata: bound,
                ..idle(0)
            })
        }),
        ("Draining", || at(S::Draining)),
        ("Deleting", || at(S::Deleting)),
        ("Failed, create failed", || failed_in(S::Creating)),
        ("Failed, configure failed", || failed_in(S::Configuring)),
        ("Failed, drain failed", || failed_in(S::Draining)),
        ("Failed, delete failed", || failed_in(S::Deleting)),
        ("Failed, create timed out", || {
            let mut core = seeded(1);
            settled(&mut core, Kind::Create, TransitionResult::TimedOut);
            core
        }),
        ("Failed, interrupted by restart", || {
            restored_after_restart(S::Configuring)
        }),
        ("Failed, restored without ops", || {
            restored(Machine {
                state: S::Failed,
                last_error: "old".into(),
                ..idle(0)
            })
        }),
    ]
}

fn restored_after_restart(target: MachineState) -> Core {
    let core = at(target);
    Core::restore(policy(), core.snapshot())
        .expect("restores")
        .0
}

fn error_name(error: &MutateError) -> &'static str {
    match error {
        MutateError::MissingMachineId => "MissingMachineId",
        MutateError::IdTooLong { .. } => "IdTooLong",
        MutateError::MissingClusterId => "MissingClusterId",
        MutateError::DeleteUnsupported => "DeleteUnsupported",
        MutateError::Fenced { .. } => "Fenced",
        MutateError::NotFound { .. } => "NotFound",
        MutateError::OutOfPosition { .. } => "OutOfPosition",
    }
}

/// Runs one call on a fresh copy of the scenario, checks the side effects every outcome class
/// implies, and renders the outcome.
fn cell(build: Build, kind: Kind) -> String {
    let mut core = build();
    let before = core.snapshot();
    let state = state(&core, &id(0));
    let record = recorded(&core, &id(0), kind);
    let decision = call(&mut core, plain(&id(0), kind));
    match decision.outcome {
        Ok(ack) if ack.dispatch.is_some() => {
            assert_eq!(ack.machine.state, kind.transitional());
            assert!(
                before
                    .operations
                    .iter()
                    .all(|(_, _, op)| *op != ack.operation_id)
            );
            assert_eq!(core.revision(), before.revision + 1, "an accept bumps once");
            format!("accept → {} ({})", ack.machine.state, ack.operation_id)
        }
        Ok(ack) => {
            assert_eq!(
                Some(ack.operation_id.to_string()),
                record,
                "reuses the record"
            );
            assert_eq!(decision.changes, None);
            assert_eq!(core.snapshot(), before, "an idempotent OK changes nothing");
            let age = if state.is_transitional() {
                "same"
            } else {
                "old"
            };
            format!("OK {age} {}", ack.operation_id)
        }
        Err(error) => {
            assert_eq!(decision.changes, None);
            assert_eq!(core.snapshot(), before, "a rejection changes nothing");
            error_name(&error).to_owned()
        }
    }
}

fn history(core: &Core) -> String {
    let ops: Vec<String> = Kind::ALL
        .into_iter()
        .filter_map(|k| recorded(core, &id(0), k).map(|op| format!("{k}={op}")))
        .collect();
    if ops.is_empty() {
        "-".to_owned()
    } else {
        ops.join(" ")
    }
}

#[test]
fn outcome_matrix_snapshot() {
    let mut table = String::from(
        "| scenario | state | ops on record | Create | Configure | Drain | Delete |\n",
    );
    table.push_str("|---|---|---|---|---|---|---|\n");
    for (name, build) in scenarios() {
        let core = build();
        let cells: Vec<String> = Kind::ALL.into_iter().map(|k| cell(build, k)).collect();
        let state = state(&core, &id(0));
        writeln!(
            table,
            "| {name} | {state} | {} | {} |",
            history(&core),
            cells.join(" | ")
        )
        .unwrap();
    }
    insta::assert_snapshot!("outcome_matrix", table);
}

/// The outcome class of a rendered cell: `accept`, `ok` or the error name.
fn class_of(cell: &str) -> &str {
    match cell.split(' ').next() {
        Some("accept") => "accept",
        Some("OK") => "ok",
        _ => cell,
    }
}

/// The docs/contract.md §2.5 table, transcribed independently of the core's `Kind` helpers.
fn expected(state: MachineState, kind: Kind, has_record: bool) -> &'static str {
    use Kind as K;
    use MachineState as S;
    match (state, kind) {
        (S::Speculative, K::Create)
        | (S::Idle, K::Configure | K::Delete)
        | (S::Configured, K::Drain) => "accept",
        (S::Creating, K::Create)
        | (S::Configuring, K::Configure)
        | (S::Draining, K::Drain)
        | (S::Deleting, K::Delete) => "ok",
        // At a stable target, reuse needs a record (e.g. none for a machine seeded Idle).
        (S::Speculative, K::Delete)
        | (S::Idle, K::Create | K::Drain)
        | (S::Configured, K::Configure)
            if has_record =>
        {
            "ok"
        }
        _ => "OutOfPosition",
    }
}

#[test]
fn outcome_matrix_matches_the_contract_table() {
    for (name, build) in scenarios() {
        let core = build();
        let state = state(&core, &id(0));
        for kind in Kind::ALL {
            let has_record = recorded(&core, &id(0), kind).is_some();
            let got = cell(build, kind);
            let class = class_of(&got);
            assert_eq!(
                class,
                expected(state, kind, has_record),
                "{name} × {kind}: {got}"
            );
        }
    }
}

#[test]
fn without_delete_capability_the_delete_column_is_unimplemented() {
    let policy = Policy {
        delete_supported: false,
        ..policy()
    };
    // Deleting is unreachable without the capability; every other state is driven to.
    let reachable = MachineState::ALL
        .into_iter()
        .filter(|s| *s != MachineState::Deleting);
    for state in reachable {
        let mut core = seeded_with(policy.clone(), vec![speculative(0)]);
        drive(&mut core, &id(0), state);
        let before = core.snapshot();
        let decision = call(&mut core, mutation(&id(0), Kind::Delete, token("s", 1, 1)));
        assert_eq!(
            decision.outcome,
            Err(MutateError::DeleteUnsupported),
            "{state}"
        );
        assert_eq!(decision.changes, None, "{state}");
        assert_eq!(core.snapshot(), before, "{state}");
    }
}

#[test]
fn a_passing_token_changes_only_the_mark_relative_to_unfenced() {
    for (name, build) in scenarios() {
        for kind in Kind::ALL {
            let unfenced_cell = cell(build, kind);
            let mut core = build();
            let decision = call(&mut core, mutation(&id(0), kind, token("s", 1, 1)));
            let fences = decision.changes.map(|c| c.fences).unwrap_or_default();
            assert_eq!(
                fences.len(),
                1,
                "{name} × {kind}: the mark advances on every outcome"
            );
            let class = match &decision.outcome {
                Ok(ack) if ack.dispatch.is_some() => "accept",
                Ok(_) => "ok",
                Err(error) => error_name(error),
            };
            assert_eq!(class, class_of(&unfenced_cell), "{name} × {kind}");
        }
    }
}
