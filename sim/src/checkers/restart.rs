//! Checks at every provider (re)start.
//!
//! Before the new process starts, the durable state it will load must still hold what
//! clients were told: restored into a throwaway core (the product's own `Core::restore`),
//! the last acknowledged token of every (shard, machine) must be rejected, every
//! acknowledged operation id must be on record, and the revision may not have gone back.
//! After it started, its state must equal the durable state, with every transition that
//! was in flight turned into Failed.

use bigfleet_libvirt_domain::{
    Core, FenceToken, ListQuery, MachineState, MutateError, MutateRequest, Mutation, Snapshot,
    Timestamp,
};

use super::{Invariant, op_number};
use crate::server::{SimProvider, config};
use crate::world::World;

/// Checks the durable state about to be loaded; returns it for [`after_start`].
pub fn before_start(world: &World) -> Snapshot {
    super::read_history(world);
    let snapshot = world.disk().snapshot();
    if snapshot.is_fresh() {
        return snapshot;
    }
    let mut core = match Core::restore(config(world).policy, snapshot.clone()) {
        Ok((core, _)) => core,
        Err(e) => {
            let detail = format!("the durable state does not restore: {e}");
            world.violation(Invariant::AckedSurvivesRestart, detail);
            return snapshot;
        }
    };
    let ledger = world.ledger().clone();
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
            world.violation(Invariant::AckedSurvivesRestart, detail);
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
            world.violation(Invariant::AckedSurvivesRestart, detail);
        }
    }
    if snapshot.revision < ledger.max_revision {
        let detail = format!(
            "after a restart the revision is {}, but {} was answered",
            snapshot.revision, ledger.max_revision
        );
        world.violation(Invariant::AckedSurvivesRestart, detail);
    }
    snapshot
}

/// Checks the started provider against the durable state it loaded (`before`).
pub fn after_start(world: &World, provider: &SimProvider, before: &Snapshot) {
    // What the new process committed while it started is followed before the clocks stop.
    super::read_history(world);
    super::deadlines::on_restart(world);
    let page = provider.peek(&ListQuery::default());
    let mut problems = Vec::new();
    {
        let disk = world.disk();
        for machine in &page.machines {
            if disk.machine(&machine.id).map(|d| d.as_ref()) != Some(machine.as_ref()) {
                problems.push((
                    Invariant::AckedSurvivesRestart,
                    format!(
                        "restarted provider's record of {} differs from the durable one",
                        machine.id
                    ),
                ));
            }
            let was = before.machines.iter().find(|m| m.id == machine.id);
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
        if disk.machines().count() != page.machines.len() {
            problems.push((
                Invariant::AckedSurvivesRestart,
                "restarted provider holds a different number of machines than the disk".to_owned(),
            ));
        }
    }
    for (invariant, detail) in problems {
        world.violation(invariant, detail);
    }
}
