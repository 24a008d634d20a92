//! The drift watch's findings on the machines' timelines (`observe::timeline`): the same
//! changes `watch::log_changes` logs, one `drift` event each, so "what happened to machine
//! X" also answers "its domain was destroyed outside the provider at ...".

use std::collections::BTreeSet;

use bigfleet_libvirt_observe::timeline::{Drift, Timeline, What};

/// Drift of one zone: machine ids.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Found {
    pub(crate) vanished: BTreeSet<String>,
    pub(crate) stopped: BTreeSet<String>,
}

/// Records what changed from `before` to `now`: newly vanished, newly stopped, and back in
/// line (neither any more).
pub(crate) fn record(timeline: &Timeline, before: &Found, now: &Found) {
    let newly = |was: &BTreeSet<String>, is: &BTreeSet<String>, drift: Drift| {
        for id in is.difference(was) {
            timeline.record(id, None, What::Drift(drift));
        }
    };
    newly(&before.vanished, &now.vanished, Drift::Vanished);
    newly(&before.stopped, &now.stopped, Drift::Stopped);
    let was: BTreeSet<&String> = before.vanished.union(&before.stopped).collect();
    let is: BTreeSet<&String> = now.vanished.union(&now.stopped).collect();
    for id in was.difference(&is) {
        timeline.record(id, None, What::Drift(Drift::BackInLine));
    }
}
