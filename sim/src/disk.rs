//! What survives a crash of the provider: the durable records, fence marks, operation ids
//! and counters, as the simulated store made them durable. The world holds the one disk of
//! a run (`fakes::store` applies each change set when its fsync completes); the checkers
//! follow a copy of it, applying the change sets the history records in the same order, so
//! they judge each event against the disk as it was then.

use std::collections::BTreeMap;
use std::sync::Arc;

use bigfleet_libvirt_domain::{
    ChangeSet, FenceKey, FenceMark, Kind, Machine, MachineId, OperationId, Snapshot,
};

/// What survives a crash.
#[derive(Debug, Default)]
pub struct Disk {
    machines: BTreeMap<MachineId, Arc<Machine>>,
    fences: BTreeMap<FenceKey, FenceMark>,
    operations: BTreeMap<(MachineId, Kind), OperationId>,
    revision: i64,
    next_operation: u64,
}

impl Disk {
    /// Everything durable, as `load` returns it.
    #[must_use]
    pub fn snapshot(&self) -> Snapshot {
        Snapshot {
            machines: self.machines.values().map(|m| Machine::clone(m)).collect(),
            fences: self.fences.iter().map(|(k, m)| (k.clone(), *m)).collect(),
            operations: self
                .operations
                .iter()
                .map(|((id, kind), op)| (id.clone(), *kind, op.clone()))
                .collect(),
            revision: self.revision,
            next_operation: self.next_operation,
        }
    }

    /// The durable record of `id`.
    #[must_use]
    pub fn machine(&self, id: &MachineId) -> Option<&Arc<Machine>> {
        self.machines.get(id)
    }

    /// The durable revision counter.
    #[must_use]
    pub fn revision(&self) -> i64 {
        self.revision
    }

    /// The durable operation recorded for (machine, kind).
    #[must_use]
    pub fn operation(&self, id: &MachineId, kind: Kind) -> Option<&OperationId> {
        self.operations.get(&(id.clone(), kind))
    }

    /// The current durable record of every machine.
    pub fn machines(&self) -> impl Iterator<Item = &Arc<Machine>> {
        self.machines.values()
    }

    /// Applies one change set; returns each machine's previous and new record.
    pub fn apply(&mut self, changes: &ChangeSet) -> Vec<(Option<Arc<Machine>>, Arc<Machine>)> {
        let mut steps = Vec::with_capacity(changes.machines.len());
        for machine in &changes.machines {
            let previous = self
                .machines
                .insert(machine.id.clone(), Arc::clone(machine));
            steps.push((previous, Arc::clone(machine)));
        }
        for (key, mark) in &changes.fences {
            self.fences.insert(key.clone(), *mark);
        }
        for (id, kind, op) in &changes.operations {
            self.operations.insert((id.clone(), *kind), op.clone());
        }
        self.revision = changes.revision;
        self.next_operation = changes.next_operation;
        steps
    }
}
