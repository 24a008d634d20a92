//! Checks at every provider (re)start, read from the history (the server records when a
//! process starts and, once started, the records it holds).
//!
//! Before the new process starts, the durable state it will load must still hold what
//! clients were told: restored into a throwaway core (the product's own `Core::restore`),
//! the last acknowledged token of every (shard, machine) must be rejected, every
//! acknowledged operation id must be on record, and the revision may not have gone back.
//! After it started, its state must equal the durable state, with every transition that
//! was in flight turned into Failed.

use std::sync::Arc;
use std::time::Duration;

use bigfleet_libvirt_domain::{
    Core, FenceToken, Machine, MachineState, MutateError, MutateRequest, Mutation, Timestamp,
};

use super::{Checkers, op_number};
use crate::server::config;
use crate::verdict::Invariant;

/// A process starts at `at`: checks the durable state it is about to load, and keeps it
/// for [`on_started`].
pub fn on_starting(checkers: &Checkers, at: Duration) {
    let snapshot = checkers.disk().disk.snapshot();
    checkers.disk().loaded = Some(snapshot.clone());
    if snapshot.is_fresh() {
        return;
    }
    let violation = |detail: String| {
        checkers.violation_at(Invariant::AckedSurvivesRestart, at, detail);
    };
    let mut core = match Core::restore(config(checkers.world()).policy, snapshot.clone()) {
        Ok((core, _)) => core,
        Err(e) => {
            violation(format!("the durable state does not restore: {e}"));
            return;
        }
    };
    let ledger = checkers.ledger().clone();
    for ((shard, machine), mark) in &ledger.acked_marks {
        let probe = Mutation {
            machine_id: machine.clone(),
            token: FenceToken {
                shard_id: shard.clone(),
                epoch: mark.epoch,
                sequence: mark.sequence,
            },
            request: MutateRequest::Create,
        };
        let outcome = match core.mutate(probe, Timestamp(0)).outcome {
            Err(MutateError::Fenced { .. }) => continue,
            Ok(ack) => format!("OK {} {}", ack.operation_id, ack.machine.state),
            Err(e) => e.to_string(),
        };
        {
            let (e, s) = (mark.epoch, mark.sequence);
            let detail = format!(
                "after a restart the acknowledged token ({e},{s}) of {shard} on {machine} \
                 passes the fence again: {outcome}"
            );
            violation(detail);
        }
    }
    for ((machine, kind), acked) in &ledger.acked_ops {
        let durable = snapshot
            .operations
            .iter()
            .find(|(id, k, _)| id.as_str() == machine && k == kind)
            .and_then(|(_, _, op)| op_number(op.as_str()));
        if durable < Some(*acked) {
            let detail = format!(
                "after a restart {kind} of {machine} records op number {durable:?}, but op-{acked} \
                 was acknowledged"
            );
            violation(detail);
        }
    }
    if snapshot.revision < ledger.max_revision {
        let detail = format!(
            "after a restart the revision is {}, but {} was answered",
            snapshot.revision, ledger.max_revision
        );
        violation(detail);
    }
}

/// The process started at `at`, holding `machines`: checks them against the durable state
/// it loaded (`on_starting`) and the disk now. What it committed while it started came
/// before in the history, so the deadline clocks stop only now.
pub fn on_started(checkers: &Checkers, at: Duration, machines: &[Arc<Machine>]) {
    super::deadlines::on_restart(checkers);
    let mut problems = Vec::new();
    {
        let seen = checkers.disk();
        let loaded = seen
            .loaded
            .as_ref()
            .map_or(&[][..], |s| s.machines.as_slice());
        let disk = &seen.disk;
        for machine in machines {
            if disk.machine(&machine.id).map(|d| d.as_ref()) != Some(machine.as_ref()) {
                problems.push((
                    Invariant::AckedSurvivesRestart,
                    format!(
                        "restarted provider's record of {} differs from the durable one",
                        machine.id
                    ),
                ));
            }
            let was = loaded.iter().find(|m| m.id == machine.id);
            let interrupted = was.is_some_and(|m| m.state.is_transitional());
            let failed_as_expected = machine.state == MachineState::Failed
                && machine
                    .last_error
                    .contains("interrupted by a provider restart");
            if interrupted && !failed_as_expected {
                problems.push((
                    Invariant::TransitionOutcome,
                    format!(
                        "interrupted transition of {} restored as {}",
                        machine.id, machine.state
                    ),
                ));
            }
        }
        if disk.machines().count() != machines.len() {
            problems.push((
                Invariant::AckedSurvivesRestart,
                "restarted provider holds a different number of machines than the disk".to_owned(),
            ));
        }
    }
    for (invariant, detail) in problems {
        checkers.violation_at(invariant, at, detail);
    }
}
