//! The timeline's wiring (`observe::timeline`): the provider's clock stamps it, the
//! provider's inventory is what it tracks, the end of every transition and every record a
//! reconcile pass changed go on it. The calls and the hypervisor phases are recorded by the
//! gRPC service and the instrumented hypervisor themselves.

use bigfleet_libvirt_domain::{ListQuery, MachineState};
use bigfleet_libvirt_observe::timeline::{Timeline, What, bounded, millis};
use std::sync::Arc;

use bigfleet_libvirt_ports::{
    Clock, Hypervisor, Observer, Provider, Spawner, StateStore, TransitionEvent,
};

/// Points `timeline` at the provider's clock and returns the observer that records the end
/// of every transition on it (passed to `Provider::start` by `assemble`).
pub(crate) fn observer<C: Clock>(clock: C, timeline: &Timeline) -> Observer {
    timeline.use_clock(move || clock.now());
    let timeline = timeline.clone();
    Arc::new(move |event: &TransitionEvent| ended(&timeline, event))
}

/// Tracks every machine of `provider`'s inventory on `timeline`.
pub(crate) fn track<H: Hypervisor, S: StateStore, C: Clock, E: Spawner>(
    provider: &Provider<H, S, C, E>,
    timeline: &Timeline,
) {
    let inventory = provider.peek(&ListQuery::default());
    timeline.track(inventory.machines.iter().map(|m| m.id.as_str()));
}

/// A finished transition's line. Told inside the transition's span, so it carries its trace.
fn ended(timeline: &Timeline, event: &TransitionEvent) {
    // A dropped result names no machine here; the worker's span and log line say it.
    if let Some(machine) = &event.machine {
        let failed = machine.state == MachineState::Failed;
        let what = What::Ended {
            kind: event.kind,
            state: machine.state,
            millis: millis(event.elapsed),
            error: failed.then(|| bounded(&machine.last_error)),
        };
        timeline.record(machine.id.as_str(), None, what);
    }
}

/// The lines of one reconcile pass: each record it added (now tracked) or refreshed. Called
/// by `serve`'s reconcile loop, which the simulation build does not have.
#[cfg(all(feature = "serve", not(madsim)))]
pub(crate) fn reconciled(timeline: &Timeline, report: &bigfleet_libvirt_domain::ReconcileReport) {
    timeline.track(report.added.iter().map(|id| id.as_str()));
    for (ids, added) in [(&report.added, true), (&report.refreshed, false)] {
        for id in ids {
            timeline.record(id.as_str(), None, What::Reconciled { added });
        }
    }
}

#[cfg(all(test, feature = "serve", not(madsim)))]
mod tests {
    use bigfleet_libvirt_domain::{MachineId, ReconcileReport, Timestamp};

    use super::*;

    #[test]
    fn a_reconcile_pass_tracks_what_it_added_and_records_both_changes() {
        let timeline = Timeline::default();
        timeline.use_clock(|| Timestamp(7));
        timeline.track(["known"]);
        let id = |s: &str| MachineId::new(s).unwrap();
        let report = ReconcileReport {
            added: vec![id("new")],
            refreshed: vec![id("known")],
            ..ReconcileReport::default()
        };
        reconciled(&timeline, &report);
        let change = |m: &str| {
            let events = timeline.events(m).expect("tracked");
            events.iter().map(|e| e.what.clone()).collect::<Vec<_>>()
        };
        assert_eq!(change("new"), [What::Reconciled { added: true }]);
        assert_eq!(change("known"), [What::Reconciled { added: false }]);
    }
}
