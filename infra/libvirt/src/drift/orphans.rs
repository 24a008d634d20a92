//! Orphans: domains tagged with this provider label that no slot or record explains, and
//! volumes named after one of our domains that has no domain. Typical causes are a Create
//! that finished after its deadline, a crash mid-Create, or an offering that shrank.
//!
//! Every describe reports what it finds (log and the `substrate_drift` gauge). An orphan
//! becomes collectable only after it has been seen continuously for the grace period, so
//! the moment between a Create's define and its reply, or a Delete's undefine and its
//! volume cleanup, is never mistaken for a leak. Collection is off unless `--gc-orphans` is
//! given: the default is a dry run that says what would be collected.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use bigfleet_libvirt_domain::Timestamp;

/// Something of ours that nothing accounts for.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Orphan {
    /// A domain tagged with our label but a machine id no slot or record has.
    Domain {
        /// The zone.
        zone: String,
        /// The domain name.
        name: String,
        /// The machine id its tag records.
        machine_id: String,
    },
    /// A volume named after one of our domains, which does not exist.
    Volume {
        /// The zone.
        zone: String,
        /// The volume name.
        name: String,
    },
}

impl Orphan {
    /// The zone it sits in.
    #[must_use]
    pub fn zone(&self) -> &str {
        match self {
            Orphan::Domain { zone, .. } | Orphan::Volume { zone, .. } => zone,
        }
    }

    /// The metric `kind` label.
    #[must_use]
    pub fn kind(&self) -> &'static str {
        match self {
            Orphan::Domain { .. } => "orphan_domain",
            Orphan::Volume { .. } => "orphan_volume",
        }
    }
}

/// When each orphan was first seen.
#[derive(Debug, Default)]
pub struct OrphanBook {
    first_seen: BTreeMap<Orphan, Timestamp>,
    announced: BTreeSet<Orphan>,
}

/// What one observation concluded.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Verdict {
    /// Orphans seen for the first time.
    pub new: Vec<Orphan>,
    /// Orphans past the grace period.
    pub due: Vec<Orphan>,
    /// Of `due`, those not reported as due before (so a dry run logs each once).
    pub newly_due: Vec<Orphan>,
}

impl OrphanBook {
    /// Records what the scans of `zones` found at `now`. An orphan in a scanned zone that
    /// is no longer found is forgotten (its grace restarts if it comes back); orphans in
    /// zones that were not scanned keep their clock.
    pub fn observe(
        &mut self,
        now: Timestamp,
        zones: &BTreeSet<String>,
        found: &[Orphan],
        grace: Duration,
    ) -> Verdict {
        let current: BTreeSet<&Orphan> = found.iter().collect();
        self.first_seen
            .retain(|o, _| !zones.contains(o.zone()) || current.contains(o));
        self.announced
            .retain(|o| !zones.contains(o.zone()) || current.contains(o));
        let mut verdict = Verdict::default();
        for orphan in found {
            let since = *self.first_seen.entry(orphan.clone()).or_insert_with(|| {
                verdict.new.push(orphan.clone());
                now
            });
            if now.saturating_since(since) >= grace {
                verdict.due.push(orphan.clone());
                if self.announced.insert(orphan.clone()) {
                    verdict.newly_due.push(orphan.clone());
                }
            }
        }
        verdict
    }

    /// Forgets a collected orphan.
    pub fn collected(&mut self, orphan: &Orphan) {
        self.first_seen.remove(orphan);
        self.announced.remove(orphan);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn volume(zone: &str, name: &str) -> Orphan {
        Orphan::Volume {
            zone: zone.into(),
            name: name.into(),
        }
    }

    #[test]
    fn orphans_become_due_after_the_grace_and_are_announced_once() {
        let mut book = OrphanBook::default();
        let zones = BTreeSet::from(["a".to_owned()]);
        let grace = Duration::from_secs(60);
        let v = volume("a", "bigfleet-x-overlay.qcow2");
        let first = book.observe(Timestamp(0), &zones, std::slice::from_ref(&v), grace);
        assert_eq!(first.new, std::slice::from_ref(&v));
        assert!(first.due.is_empty());
        let t = |s: u64| Timestamp(s * 1_000_000_000);
        let later = book.observe(t(59), &zones, std::slice::from_ref(&v), grace);
        assert!(later.new.is_empty() && later.due.is_empty());
        let due = book.observe(t(60), &zones, std::slice::from_ref(&v), grace);
        assert_eq!((due.due.len(), due.newly_due.len()), (1, 1));
        let again = book.observe(t(61), &zones, std::slice::from_ref(&v), grace);
        assert_eq!((again.due.len(), again.newly_due.len()), (1, 0));
    }

    #[test]
    fn a_disappearing_orphan_restarts_its_grace_but_unscanned_zones_keep_theirs() {
        let mut book = OrphanBook::default();
        let grace = Duration::from_secs(10);
        let (a, b) = (volume("a", "va"), volume("b", "vb"));
        let both = BTreeSet::from(["a".to_owned(), "b".to_owned()]);
        book.observe(Timestamp(0), &both, &[a.clone(), b.clone()], grace);
        // Zone b is unreachable for a while; a's orphan was cleaned up by hand.
        let only_a = BTreeSet::from(["a".to_owned()]);
        book.observe(Timestamp(5), &only_a, &[], grace);
        let t = Timestamp(10_000_000_000);
        let verdict = book.observe(t, &both, &[a.clone(), b.clone()], grace);
        assert_eq!(verdict.new, [a]);
        assert_eq!(verdict.due, [b]);
    }
}
