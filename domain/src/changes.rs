//! What a decision asks the store to persist, and what the store hands back at start-up.
//!
//! A [`ChangeSet`] is one decision: the store MUST commit it atomically. Machines are
//! written as whole records (upserts), so applying change sets in order reproduces the
//! in-memory state exactly.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::fence::{FenceKey, FenceMark};
use crate::machine::{Machine, MachineId};
use crate::operation::{Kind, OperationId};

/// The durable effect of one decision.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ChangeSet {
    /// Whole machine records to upsert.
    pub machines: Vec<Arc<Machine>>,
    /// Fence marks to set.
    pub fences: Vec<(FenceKey, FenceMark)>,
    /// Idempotency records to set, keyed by (machine, kind).
    pub operations: Vec<(MachineId, Kind, OperationId)>,
    /// The revision counter after the decision.
    pub revision: i64,
    /// The operation-id counter after the decision (the last value used).
    pub next_operation: u64,
}

impl ChangeSet {
    /// Whether the change set carries no record at all (counters alone do not count: they
    /// only move together with a record).
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.machines.is_empty() && self.fences.is_empty() && self.operations.is_empty()
    }

    /// Folds a later change set into this one; the result commits both atomically.
    pub fn absorb(&mut self, later: ChangeSet) {
        self.machines.extend(later.machines);
        self.fences.extend(later.fences);
        self.operations.extend(later.operations);
        self.revision = later.revision;
        self.next_operation = later.next_operation;
    }
}

/// Everything durable, as loaded at start-up.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Snapshot {
    /// Every machine record.
    pub machines: Vec<Machine>,
    /// Every fence mark.
    pub fences: Vec<(FenceKey, FenceMark)>,
    /// Every idempotency record.
    pub operations: Vec<(MachineId, Kind, OperationId)>,
    /// The revision counter.
    pub revision: i64,
    /// The last operation-id counter value used.
    pub next_operation: u64,
}

impl Snapshot {
    /// Whether this is a first boot: nothing was ever stored (docs/contract.md §10).
    #[must_use]
    pub fn is_fresh(&self) -> bool {
        self.machines.is_empty()
            && self.fences.is_empty()
            && self.operations.is_empty()
            && self.revision == 0
            && self.next_operation == 0
    }

    /// Applies a change set, as a store does on commit.
    pub fn apply(&mut self, changes: &ChangeSet) {
        for machine in &changes.machines {
            match self.machines.iter_mut().find(|m| m.id == machine.id) {
                Some(slot) => *slot = Machine::clone(machine),
                None => self.machines.push(Machine::clone(machine)),
            }
        }
        for (key, mark) in &changes.fences {
            match self.fences.iter_mut().find(|(k, _)| k == key) {
                Some(slot) => slot.1 = *mark,
                None => self.fences.push((key.clone(), *mark)),
            }
        }
        for (id, kind, op) in &changes.operations {
            match self
                .operations
                .iter_mut()
                .find(|(i, k, _)| i == id && k == kind)
            {
                Some(slot) => slot.2 = op.clone(),
                None => self.operations.push((id.clone(), *kind, op.clone())),
            }
        }
        self.revision = changes.revision;
        self.next_operation = changes.next_operation;
    }
}
