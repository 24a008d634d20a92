//! Checks on every durable step, read from the history (the store fake records each commit
//! there): each record a commit makes durable is compared with the machine's previous
//! durable record. Only the contract's twelve edges may appear, Failed
//! never changes, a binding is set only when a Configure is accepted and kept unchanged
//! until a Drain completes, and every record keeps the shape its state implies.

use std::sync::Arc;
use std::time::Duration;

use bigfleet_libvirt_domain::{Machine, MachineState};

use super::{Checkers, binding_problem, bound_state};
use crate::verdict::Invariant;

/// The contract's legal edges (docs/contract.md §2.2).
fn legal(from: MachineState, to: MachineState) -> bool {
    use MachineState::{
        Configured, Configuring, Creating, Deleting, Draining, Failed, Idle, Speculative,
    };
    matches!(
        (from, to),
        (Speculative, Creating)
            | (Creating, Idle | Failed)
            | (Idle, Configuring | Deleting)
            | (Configuring, Configured | Failed)
            | (Configured, Draining)
            | (Draining, Idle | Failed)
            | (Deleting, Speculative | Failed)
    )
}

fn binding(m: &Machine) -> (&str, &bigfleet_libvirt_domain::StringMap) {
    (&m.cluster, &m.shard_metadata)
}

/// Checks the records one commit made durable at `at` (previous record, new record), as
/// the history tells them.
pub fn on_commit(
    checkers: &Checkers,
    at: Duration,
    steps: &[(Option<Arc<Machine>>, Arc<Machine>)],
) {
    let violation = |invariant: Invariant, detail: String| {
        checkers.violation_at(invariant, at, detail);
    };
    for (previous, record) in steps {
        super::deadlines::on_step(checkers, at, previous.as_deref(), record);
        if let Some(problem) = binding_problem(record) {
            violation(Invariant::Binding, format!("durable record: {problem}"));
        }
        let Some(previous) = previous else {
            if !matches!(record.state, MachineState::Speculative | MachineState::Idle) {
                let detail = format!(
                    "machine {} first became durable as {}",
                    record.id, record.state
                );
                violation(Invariant::TransitionOutcome, detail);
            }
            continue;
        };
        check_step(&violation, previous, record);
    }
}

fn check_step(violation: &impl Fn(Invariant, String), previous: &Machine, record: &Machine) {
    let (from, to) = (previous.state, record.state);
    let id = &record.id;
    if from == to {
        if from == MachineState::Failed && previous.last_error != record.last_error {
            let detail = format!("Failed machine {id} changed its last_error");
            violation(Invariant::TransitionOutcome, detail);
        }
        if binding(previous) != binding(record)
            && (bound_state(from) || from == MachineState::Failed)
        {
            let detail = format!("machine {id} changed its binding while {from}");
            violation(Invariant::Binding, detail);
        }
        return;
    }
    if !legal(from, to) {
        let detail = format!("machine {id} went {from} -> {to}, which is no legal edge");
        violation(Invariant::TransitionOutcome, detail);
        return;
    }
    let keeps_binding = matches!(
        (from, to),
        (
            MachineState::Configuring,
            MachineState::Configured | MachineState::Failed
        ) | (MachineState::Configured, MachineState::Draining)
            | (MachineState::Draining, MachineState::Failed)
    );
    if keeps_binding && binding(previous) != binding(record) {
        let detail = format!("machine {id} changed its binding on {from} -> {to}");
        violation(Invariant::Binding, detail);
    }
    if to == MachineState::Failed && previous.host != record.host {
        let detail = format!("machine {id} changed its host on {from} -> Failed");
        violation(Invariant::TransitionOutcome, detail);
    }
}
