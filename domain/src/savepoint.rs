//! Taking a decision back: a [`Savepoint`] holds what one decision overwrote (records, fence
//! marks, idempotency records and the two counters, as they were just before it), so the
//! caller can restore the core exactly when the decision could not be made durable.
//!
//! The core is mutated in place before its change set is committed; if the commit fails,
//! the in-memory state must not keep serving a decision nobody acknowledged. Rewinding the
//! savepoints of every decision that did not become durable, newest first, gives back the
//! last durable state, in-flight transitions and the List index included.

use std::collections::BTreeMap;

use crate::changes::ChangeSet;
use crate::core::{Core, Record};
use crate::fence::{FenceKey, FenceMark};
use crate::machine::MachineId;
use crate::operation::{Kind, OperationId};

/// The prior values of everything one decision changed.
#[derive(Clone, Debug, Default)]
pub struct Savepoint {
    records: BTreeMap<MachineId, Option<Record>>,
    fences: BTreeMap<FenceKey, Option<FenceMark>>,
    operations: BTreeMap<(MachineId, Kind), Option<OperationId>>,
    revision: i64,
    next_operation: u64,
}

impl Savepoint {
    /// Whether the decision changed no record, mark or idempotency record.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.records.is_empty() && self.fences.is_empty() && self.operations.is_empty()
    }
}

impl Core {
    /// Runs one decision and returns, with its result, the savepoint that takes it back.
    pub fn with_savepoint<T>(&mut self, decide: impl FnOnce(&mut Self) -> T) -> (T, Savepoint) {
        let previous = self.journal.replace(Savepoint {
            revision: self.revision,
            next_operation: self.next_operation,
            ..Savepoint::default()
        });
        debug_assert!(previous.is_none(), "savepoints do not nest");
        let result = decide(self);
        let savepoint = self.journal.take().unwrap_or_default();
        (result, savepoint)
    }

    /// A change set that changes nothing: no record, only the current counters. Committing
    /// it tells whether the store takes writes, without deciding anything.
    #[must_use]
    pub fn probe(&self) -> ChangeSet {
        let mut changes = ChangeSet::default();
        self.stamp(&mut changes);
        changes
    }

    /// Takes one decision back, and returns the savepoint that redoes it. Rewinding the
    /// savepoints of a run of decisions newest first restores the state from before the
    /// oldest of them; rewinding the returned ones oldest first puts the run back.
    pub fn rewind(&mut self, savepoint: Savepoint) -> Savepoint {
        let Savepoint {
            records,
            fences,
            operations,
            revision,
            next_operation,
        } = savepoint;
        let mut redo = Savepoint {
            revision: self.revision,
            next_operation: self.next_operation,
            ..Savepoint::default()
        };
        for (id, prior) in records {
            let current = self.records.remove(&id);
            if let Some(current) = &current {
                self.by_revision.remove(&(current.modified, id.clone()));
            }
            if let Some(prior) = prior {
                self.by_revision.insert((prior.modified, id.clone()));
                self.records.insert(id.clone(), prior);
            }
            redo.records.insert(id, current);
        }
        for (key, prior) in fences {
            let current = match prior {
                Some(mark) => self.fences.insert(key.clone(), mark),
                None => self.fences.remove(&key),
            };
            redo.fences.insert(key, current);
        }
        for (key, prior) in operations {
            let current = match prior {
                Some(op) => self.operations.insert(key.clone(), op),
                None => self.operations.remove(&key),
            };
            redo.operations.insert(key, current);
        }
        self.revision = revision;
        self.next_operation = next_operation;
        redo
    }

    /// Notes a record's value before its first change in the current savepoint.
    pub(crate) fn remember_record(&mut self, id: &MachineId) {
        if let Some(journal) = self.journal.as_mut() {
            journal
                .records
                .entry(id.clone())
                .or_insert_with(|| self.records.get(id).cloned());
        }
    }

    /// Notes a fence mark's value before its first change in the current savepoint.
    pub(crate) fn remember_fence(&mut self, key: &FenceKey) {
        if let Some(journal) = self.journal.as_mut() {
            journal
                .fences
                .entry(key.clone())
                .or_insert_with(|| self.fences.get(key).copied());
        }
    }

    /// Notes an idempotency record's value before its first change in the current savepoint.
    pub(crate) fn remember_operation(&mut self, id: &MachineId, kind: Kind) {
        if let Some(journal) = self.journal.as_mut() {
            let key = (id.clone(), kind);
            let prior = self.operations.get(&key).cloned();
            journal.operations.entry(key).or_insert(prior);
        }
    }
}
