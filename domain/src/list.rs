//! Get and List (contract §8).
//!
//! A full list walks records in id order; a delta walks the (revision, id) index from the
//! cursor, so 100 changes among 100k machines cost 100 steps. Filters combine as
//! since-filter, then state filter, then the cap; the returned revision is always the head.

use std::collections::BTreeSet;
use std::ops::Bound;
use std::sync::Arc;

use crate::core::{Core, Record};
use crate::machine::{Machine, MachineId, MachineState};

/// A List request in domain terms.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ListQuery {
    /// `None` lists every state; `Some(set)` only those (an empty set matches nothing, which
    /// is how unknown or unspecified wire states end up).
    pub states: Option<BTreeSet<MachineState>>,
    /// At most this many machines; `None` for no cap.
    pub max_results: Option<usize>,
    /// Only machines modified strictly after this revision; `None` for a full list.
    pub since_revision: Option<i64>,
}

/// A List answer.
#[derive(Clone, Debug, PartialEq)]
pub struct ListPage {
    /// The machines, in id order (full list) or revision order (delta).
    pub machines: Vec<Arc<Machine>>,
    /// The head revision.
    pub revision: i64,
}

impl Core {
    /// One machine by id.
    #[must_use]
    pub fn get(&self, id: &str) -> Option<Arc<Machine>> {
        let id = MachineId::new(id).ok()?;
        self.records.get(&id).map(|r| Arc::clone(&r.machine))
    }

    /// The machines a List call returns.
    #[must_use]
    pub fn list(&self, query: &ListQuery) -> ListPage {
        let wanted = |r: &&Record| {
            query
                .states
                .as_ref()
                .is_none_or(|s| s.contains(&r.machine.state))
        };
        let cap = query.max_results.unwrap_or(usize::MAX);
        let machines = match query.since_revision {
            None => self
                .records
                .values()
                .filter(wanted)
                .take(cap)
                .map(|r| Arc::clone(&r.machine))
                .collect(),
            Some(cursor) => {
                let start = match cursor.checked_add(1) {
                    Some(next) => Bound::Included((next, MachineId::lowest())),
                    None => {
                        return ListPage {
                            machines: Vec::new(),
                            revision: self.revision,
                        };
                    }
                };
                self.by_revision
                    .range((start, Bound::Unbounded))
                    .map(|(_, id)| &self.records[id])
                    .filter(wanted)
                    .take(cap)
                    .map(|r| Arc::clone(&r.machine))
                    .collect()
            }
        };
        ListPage {
            machines,
            revision: self.revision,
        }
    }
}
