//! The deadline check: no accepted transition stays transitional in the durable state past
//! its deadline plus the provider's sweep grace (`ports::SWEEP_GRACE`) while the process
//! that accepted it is serving, whatever its caller did (gave up before, during or after the
//! commit) and whatever its worker did.
//!
//! A transition is taken to start when its record became durable, which is no earlier than
//! the decision whose deadline it carries, so the bound is never tighter than the provider's
//! own. A restart ends the check for everything in flight: the new process fails those
//! records itself (the restart check holds it to that). [`SLACK`] covers what may delay the
//! sweep's commit without any wedge: a batch behind a slow fsync, and a store that failed
//! stop and waits for the supervisor to notice.

use std::sync::Arc;
use std::time::Duration;

use bigfleet_libvirt_domain::Machine;
use bigfleet_libvirt_ports::SWEEP_GRACE;

use super::Checkers;
use crate::time::elapsed;
use crate::verdict::Invariant;

/// How often the durable state is looked at.
const EVERY: Duration = Duration::from_millis(500);
/// Allowed on top of the deadline and the sweep's grace (see the module doc).
const SLACK: Duration = Duration::from_secs(10);

/// Follows one durable step of a machine, made durable at `at` (as the history tells it):
/// entering a transitional state starts its clock, leaving it stops it.
pub fn on_step(checkers: &Checkers, at: Duration, previous: Option<&Machine>, record: &Machine) {
    let mut ledger = checkers.ledger();
    if !record.state.is_transitional() {
        ledger.in_flight.remove(&record.id);
    } else if previous.is_none_or(|p| p.state != record.state) {
        ledger
            .in_flight
            .insert(record.id.clone(), (at, record.state));
    }
}

/// A restarted process restores whatever was in flight as Failed: nothing is left to time.
/// It serves from now on.
pub fn on_restart(checkers: &Checkers) {
    let mut ledger = checkers.ledger();
    ledger.in_flight.clear();
    ledger.serving = true;
}

/// The supervisor killed the process: nobody can move a record until the next one serves.
pub fn on_kill(checkers: &Checkers) {
    checkers.ledger().serving = false;
}

/// Looks at the durable state every [`EVERY`] for the rest of the run and reports each
/// transition still in flight past its bound, once.
pub async fn watch(checkers: Arc<Checkers>) {
    let timeout = checkers.world().plan.transition_timeout;
    let bound = timeout + SWEEP_GRACE + SLACK;
    loop {
        madsim::time::sleep(EVERY).await;
        // The durable steps since the last look start and stop the clocks first.
        checkers.read_history();
        if !checkers.ledger().serving {
            continue; // Down: nobody could move a record, and the restart will fail it.
        }
        let now = elapsed();
        let overdue: Vec<_> = {
            let mut ledger = checkers.ledger();
            let late: Vec<_> = ledger
                .in_flight
                .iter()
                .filter(|(_, (since, _))| now.saturating_sub(*since) > bound)
                .map(|(id, (since, state))| (id.clone(), *since, *state))
                .collect();
            for (id, ..) in &late {
                ledger.in_flight.remove(id);
            }
            late
        };
        for (id, since, state) in overdue {
            let detail = format!(
                "machine {id} has been {state} since {:.3}s ({:.3}s ago) with its provider \
                 serving, past its {}s deadline, the {}s sweep grace and {}s of slack",
                since.as_secs_f64(),
                (now - since).as_secs_f64(),
                timeout.as_secs(),
                SWEEP_GRACE.as_secs(),
                SLACK.as_secs(),
            );
            checkers.violation(Invariant::TransitionDeadline, detail);
        }
    }
}
