//! The machines the adapter tracks per host, shared with the drift watch: which machines the
//! provider's records place on which zone, which have a Delete in flight (the watch
//! leaves those alone, their domain going away is expected), and which slots are dead
//! (their record is Failed, so describe holds no room for them).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Mutex, MutexGuard};

/// Machine id → zone for every machine on a host, and the ids with a Delete in flight.
#[derive(Debug, Default)]
pub(crate) struct Tracked {
    known: Mutex<BTreeMap<String, String>>,
    busy: Mutex<BTreeSet<String>>,
    dead: Mutex<BTreeSet<String>>,
}

impl Tracked {
    /// Machines the provider's records say run on a host: id → zone.
    pub(crate) fn known(&self) -> MutexGuard<'_, BTreeMap<String, String>> {
        self.known
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Machine ids with a Delete in flight.
    pub(crate) fn busy(&self) -> MutexGuard<'_, BTreeSet<String>> {
        self.busy
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Slots whose record is Failed: terminal, so nothing will Create them again.
    pub(crate) fn dead(&self) -> MutexGuard<'_, BTreeSet<String>> {
        self.dead
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Machine ids tracked on `zone` with no Delete in flight.
    pub(crate) fn watched(&self, zone: &str) -> BTreeSet<String> {
        let busy = self.busy().clone();
        self.known()
            .iter()
            .filter(|(id, z)| z.as_str() == zone && !busy.contains(id.as_str()))
            .map(|(id, _)| id.clone())
            .collect()
    }
}

/// A machine id marked busy (a Delete in flight) for as long as this lives.
pub(crate) struct Busy<'a> {
    tracked: &'a Tracked,
    id: String,
}

impl<'a> Busy<'a> {
    pub(crate) fn mark(tracked: &'a Tracked, id: &str) -> Self {
        tracked.busy().insert(id.to_owned());
        Self {
            tracked,
            id: id.to_owned(),
        }
    }
}

impl Drop for Busy<'_> {
    fn drop(&mut self) {
        self.tracked.busy().remove(&self.id);
    }
}
