//! The in-memory `StateStore`: committed state lives as long as the process (or as long as
//! a test keeps the store handle, which is how tests exercise the restart path in-process).
//! Records are kept behind `Arc`s, so a commit costs a map insert, not a deep copy.

use std::collections::BTreeMap;
use std::future::{Future, ready};
use std::sync::{Arc, Mutex};

use bigfleet_libvirt_domain::{
    ChangeSet, FenceKey, FenceMark, Kind, Machine, MachineId, OperationId, Snapshot,
};
use bigfleet_libvirt_ports::{StateStore, StoreError};

#[derive(Debug, Default)]
struct Tables {
    machines: BTreeMap<MachineId, Arc<Machine>>,
    fences: BTreeMap<FenceKey, FenceMark>,
    operations: BTreeMap<(MachineId, Kind), OperationId>,
    revision: i64,
    next_operation: u64,
}

/// Keeps committed state in memory; clones share the same tables.
#[derive(Clone, Debug, Default)]
pub struct MemoryStateStore {
    tables: Arc<Mutex<Tables>>,
}

impl MemoryStateStore {
    /// An empty store (a first boot).
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    fn tables(&self) -> std::sync::MutexGuard<'_, Tables> {
        self.tables
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl StateStore for MemoryStateStore {
    fn load(&self) -> impl Future<Output = Result<Snapshot, StoreError>> + Send {
        let tables = self.tables();
        let snapshot = Snapshot {
            machines: tables
                .machines
                .values()
                .map(|m| Machine::clone(m))
                .collect(),
            fences: tables.fences.iter().map(|(k, m)| (k.clone(), *m)).collect(),
            operations: tables
                .operations
                .iter()
                .map(|((id, kind), op)| (id.clone(), *kind, op.clone()))
                .collect(),
            revision: tables.revision,
            next_operation: tables.next_operation,
        };
        ready(Ok(snapshot))
    }

    fn commit(
        &self,
        changes: ChangeSet,
    ) -> impl Future<Output = Result<(), StoreError>> + Send + 'static {
        // Applied at call time, under the caller's decision lock: call order is commit order.
        let mut tables = self.tables();
        for machine in changes.machines {
            tables.machines.insert(machine.id.clone(), machine);
        }
        tables.fences.extend(changes.fences);
        for (id, kind, op) in changes.operations {
            tables.operations.insert((id, kind), op);
        }
        tables.revision = changes.revision;
        tables.next_operation = changes.next_operation;
        ready(Ok(()))
    }
}
