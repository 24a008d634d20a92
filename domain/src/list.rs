//! Get and List (docs/contract.md §8).
//!
//! A full list walks records in id order; a delta walks the (revision, id) index from the
//! cursor, so 100 changes among 100k machines cost 100 steps. Filters combine as
//! since-filter, then state filter, then the cap; the returned revision is always the head.
//!
//! Which records a capped call returns is not fixed by the contract, but callers rely on it
//! spreading: BigFleet's tooling picks a slot with `List(SPECULATIVE, max_results=1)` and
//! expects the next such pick to be a different machine. So a capped call, when given a
//! [`ListRotation`], starts just after where the previous capped call of its kind stopped
//! and wraps around once: back-to-back capped pages walk the whole matching set before any
//! record repeats. Uncapped calls ignore the rotation and never move it.

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

/// Where the previous capped List stopped, one position per kind of walk (full lists go by
/// id, deltas by (revision, id)). In memory only: a restart starts both walks again from
/// the beginning, which the contract allows (the subset a capped call returns is
/// unspecified).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ListRotation {
    full: Option<MachineId>,
    delta: Option<(i64, MachineId)>,
}

/// A List answer.
#[derive(Clone, Debug, PartialEq)]
pub struct ListPage {
    /// The machines, in id order (full list) or revision order (delta); a capped page
    /// walked with a [`ListRotation`] starts after the previous capped page and may wrap.
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

    /// The machines a List call returns, spreading capped calls over the matching set: a
    /// capped page starts after the record where the previous capped page of the same kind
    /// (full or delta) stopped, wraps around at most once, and moves `rotation` to its own
    /// last record. Uncapped calls are exactly [`Core::list`].
    #[must_use]
    pub fn list_rotating(&self, query: &ListQuery, rotation: &mut ListRotation) -> ListPage {
        let Some(cap) = query.max_results else {
            return self.list(query);
        };
        let wanted = |r: &&Record| {
            query
                .states
                .as_ref()
                .is_none_or(|s| s.contains(&r.machine.state))
        };
        let picked: Vec<&Record> = match query.since_revision {
            None => self.rotate_full(cap, &wanted, rotation),
            Some(cursor) => self.rotate_delta(cursor, cap, &wanted, rotation),
        };
        ListPage {
            machines: picked.iter().map(|r| Arc::clone(&r.machine)).collect(),
            revision: self.revision,
        }
    }

    /// A capped full list: up to `cap` wanted records in id order, starting after
    /// `rotation.full` and wrapping around once; moves `rotation.full` to the last one.
    fn rotate_full(
        &self,
        cap: usize,
        wanted: &impl Fn(&&Record) -> bool,
        rotation: &mut ListRotation,
    ) -> Vec<&Record> {
        let after = rotation.full.as_ref();
        let tail = after.map_or_else(
            || self.records.range::<MachineId, _>(..),
            |a| {
                self.records
                    .range::<MachineId, _>((Bound::Excluded(a), Bound::Unbounded))
            },
        );
        let head = after.map(|a| self.records.range::<MachineId, _>(..=a));
        let picked: Vec<&Record> = tail
            .chain(head.into_iter().flatten())
            .map(|(_, r)| r)
            .filter(wanted)
            .take(cap)
            .collect();
        if let Some(last) = picked.last() {
            rotation.full = Some(last.machine.id.clone());
        }
        picked
    }

    /// A capped delta from `cursor`: up to `cap` wanted records in (revision, id) order,
    /// starting after `rotation.delta` (when it lies in this delta) and wrapping around once;
    /// moves `rotation.delta` to the last one.
    fn rotate_delta(
        &self,
        cursor: i64,
        cap: usize,
        wanted: &impl Fn(&&Record) -> bool,
        rotation: &mut ListRotation,
    ) -> Vec<&Record> {
        let Some(next) = cursor.checked_add(1) else {
            return Vec::new();
        };
        let lowest = (next, MachineId::lowest());
        // A position below this delta's start says nothing about it: start fresh.
        let after = rotation.delta.as_ref().filter(|p| **p >= lowest);
        let tail = after.map_or_else(
            || {
                self.by_revision
                    .range((Bound::Included(&lowest), Bound::Unbounded))
            },
            |a| {
                self.by_revision
                    .range((Bound::Excluded(a), Bound::Unbounded))
            },
        );
        let head = after.map(|a| {
            self.by_revision
                .range((Bound::Included(&lowest), Bound::Included(a)))
        });
        let picked: Vec<(&(i64, MachineId), &Record)> = tail
            .chain(head.into_iter().flatten())
            .map(|key| (key, &self.records[&key.1]))
            .filter(|(_, r)| wanted(r))
            .take(cap)
            .collect();
        if let Some((key, _)) = picked.last() {
            rotation.delta = Some((*key).clone());
        }
        picked.into_iter().map(|(_, r)| r).collect()
    }
}
