//! The inventory and its bookkeeping: records with last-modified revisions, fence marks,
//! idempotency records and the two counters. Construction is either a first-boot seed or a
//! restore from durable state; the lifecycle decisions live in `transitions.rs`, reads in
//! `list.rs` and reconcile in `reconcile.rs`.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use crate::changes::{ChangeSet, Snapshot};
use crate::fence::{FenceKey, FenceMark};
use crate::machine::{Machine, MachineId, MachineState, Timestamp};
use crate::operation::{Kind, OperationId};
use crate::savepoint::Savepoint;
use crate::shared::Interner;
use crate::validate::{InvalidMachine, validate_instance};

pub use crate::list::{ListPage, ListQuery, ListRotation};
pub use crate::reconcile::ReconcileReport;
pub use crate::transitions::{Completion, CompletionOutcome, TransitionResult};

/// How long each kind of transition may take before it fails.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timeouts {
    /// Create deadline.
    pub create: Duration,
    /// Configure deadline (covers bootstrap and the readiness wait).
    pub configure: Duration,
    /// Drain deadline.
    pub drain: Duration,
    /// Delete deadline.
    pub delete: Duration,
}

impl Timeouts {
    /// The same deadline for every kind (`--transition-timeout`).
    #[must_use]
    pub fn uniform(timeout: Duration) -> Self {
        Self {
            create: timeout,
            configure: timeout,
            drain: timeout,
            delete: timeout,
        }
    }

    /// The deadline for `kind`.
    #[must_use]
    pub fn for_kind(&self, kind: Kind) -> Duration {
        match kind {
            Kind::Create => self.create,
            Kind::Configure => self.configure,
            Kind::Drain => self.drain,
            Kind::Delete => self.delete,
        }
    }
}

impl Default for Timeouts {
    /// The libvirt provider's deadlines: Create 5m, Configure 8m, Drain 15m, Delete 5m.
    fn default() -> Self {
        Self {
            create: Duration::from_secs(5 * 60),
            configure: Duration::from_secs(8 * 60),
            drain: Duration::from_secs(15 * 60),
            delete: Duration::from_secs(5 * 60),
        }
    }
}

/// Fixed facts about the provider that shape decisions.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Policy {
    /// Whether Delete is offered (false for bare-metal pools: Delete is UNIMPLEMENTED).
    pub delete_supported: bool,
    /// Whether every record must carry a zone (multi-zone providers).
    pub require_zone: bool,
    /// Transition deadlines.
    pub timeouts: Timeouts,
    /// Prefix of minted operation ids (`op` gives `op-1`, `op-2`, …).
    pub operation_prefix: String,
}

impl Default for Policy {
    fn default() -> Self {
        Self {
            delete_supported: true,
            require_zone: true,
            timeouts: Timeouts::default(),
            operation_prefix: "op".to_owned(),
        }
    }
}

/// Why durable state cannot be restored.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum SeedError {
    /// A described record breaks a field-shape rule (first boot).
    #[error("invalid machine record: {0}")]
    Invalid(#[from] InvalidMachine),
    /// A stored record is out of shape for its state.
    #[error("stored machine record is out of shape: {0}")]
    Corrupt(String),
}

/// A transition in flight: the only one a completion may finish.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct InFlight {
    pub(crate) kind: Kind,
    pub(crate) operation_id: OperationId,
    pub(crate) deadline: Timestamp,
    pub(crate) timeout: Duration,
}

#[derive(Clone, Debug)]
pub(crate) struct Record {
    pub(crate) machine: Arc<Machine>,
    pub(crate) modified: i64,
    pub(crate) in_flight: Option<InFlight>,
}

/// The whole lifecycle state of one provider process.
#[derive(Clone, Debug)]
pub struct Core {
    pub(crate) policy: Policy,
    pub(crate) records: BTreeMap<MachineId, Record>,
    /// (last-modified revision, id) for every record: the since_revision index.
    pub(crate) by_revision: BTreeSet<(i64, MachineId)>,
    pub(crate) fences: BTreeMap<FenceKey, FenceMark>,
    pub(crate) operations: BTreeMap<(MachineId, Kind), OperationId>,
    pub(crate) revision: i64,
    pub(crate) next_operation: u64,
    /// What the decision under way overwrote, while one runs inside [`Core::with_savepoint`].
    pub(crate) journal: Option<Savepoint>,
}

impl Core {
    fn empty(policy: Policy) -> Self {
        Self {
            policy,
            records: BTreeMap::new(),
            by_revision: BTreeSet::new(),
            fences: BTreeMap::new(),
            operations: BTreeMap::new(),
            revision: 0,
            next_operation: 0,
            journal: None,
        }
    }

    /// First boot: validates every described record and seeds them, one revision each.
    ///
    /// # Errors
    /// The first invalid or duplicate record; nothing is seeded then.
    pub fn seed(policy: Policy, described: Vec<Machine>) -> Result<(Self, ChangeSet), SeedError> {
        let mut core = Self::empty(policy);
        // The described records move into the core (no copy of the inventory is made), and
        // equal maps share one allocation.
        let mut ids = Vec::with_capacity(described.len());
        let mut interner = Interner::default();
        for mut machine in described {
            interner.intern_machine(&mut machine);
            validate_instance(&machine, core.policy.require_zone)?;
            if core.records.contains_key(&machine.id) {
                let id = machine.id.to_string();
                return Err(InvalidMachine::Duplicate { id }.into());
            }
            ids.push(machine.id.clone());
            core.records.insert(
                machine.id.clone(),
                Record {
                    machine: Arc::new(machine),
                    modified: 0,
                    in_flight: None,
                },
            );
        }
        let mut changes = ChangeSet::default();
        for id in ids {
            let machine = core.touch(&id);
            changes.machines.push(machine);
        }
        core.stamp(&mut changes);
        Ok((core, changes))
    }

    /// Restart: reloads durable state verbatim. Every record's last-modified revision is
    /// reset to the stored counter (so older cursors re-list rather than miss records), and
    /// every record left transitional becomes Failed, because the call's inputs were never
    /// persisted and the transition cannot be resumed.
    ///
    /// # Errors
    /// A stored record that is out of shape for its state.
    pub fn restore(
        policy: Policy,
        snapshot: Snapshot,
    ) -> Result<(Self, Option<ChangeSet>), SeedError> {
        let mut core = Self::empty(policy);
        core.revision = snapshot.revision;
        core.next_operation = snapshot.next_operation;
        let mut interner = Interner::default();
        for mut machine in snapshot.machines {
            interner.intern_machine(&mut machine);
            if let Some(problem) = machine.shape_violation() {
                return Err(SeedError::Corrupt(problem));
            }
            core.by_revision.insert((core.revision, machine.id.clone()));
            let record = Record {
                machine: Arc::new(machine),
                modified: core.revision,
                in_flight: None,
            };
            core.records.insert(record.machine.id.clone(), record);
        }
        core.fences.extend(snapshot.fences);
        for (id, kind, op) in snapshot.operations {
            core.operations.insert((id, kind), op);
        }
        let interrupted: Vec<MachineId> = core
            .records
            .values()
            .filter(|r| r.machine.state.is_transitional())
            .map(|r| r.machine.id.clone())
            .collect();
        if interrupted.is_empty() {
            return Ok((core, None));
        }
        let mut changes = ChangeSet::default();
        for id in interrupted {
            let machine = core.update(&id, |m| {
                let kind = Kind::ALL.into_iter().find(|k| k.transitional() == m.state);
                let kind = kind.map_or("unknown", Kind::name);
                m.state = MachineState::Failed;
                m.last_error =
                    format!("{kind} transition interrupted by a provider restart; needs re-drive");
            });
            changes.machines.push(machine);
        }
        core.stamp(&mut changes);
        Ok((core, Some(changes)))
    }

    /// The policy this core decides with.
    #[must_use]
    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// The current revision counter.
    #[must_use]
    pub fn revision(&self) -> i64 {
        self.revision
    }

    /// How many machines the inventory holds.
    #[must_use]
    pub fn len(&self) -> usize {
        self.records.len()
    }

    /// Whether the inventory holds no machine.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    /// The mark for (shard, machine), if one was ever set.
    #[must_use]
    pub fn fence_mark(&self, key: &FenceKey) -> Option<FenceMark> {
        self.fences.get(key).copied()
    }

    /// The operation recorded for (machine, kind), if any.
    #[must_use]
    pub fn operation(&self, id: &MachineId, kind: Kind) -> Option<&OperationId> {
        self.operations.get(&(id.clone(), kind))
    }

    /// Everything durable, as a store would hold it after applying every change set.
    #[must_use]
    pub fn snapshot(&self) -> Snapshot {
        Snapshot {
            machines: self
                .records
                .values()
                .map(|r| Machine::clone(&r.machine))
                .collect(),
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

    /// Applies `edit` to a record, bumps the revision and re-indexes it. Returns the new
    /// record, checked for shape.
    pub(crate) fn update(
        &mut self,
        id: &MachineId,
        edit: impl FnOnce(&mut Machine),
    ) -> Arc<Machine> {
        self.remember_record(id);
        let record = self
            .records
            .get_mut(id)
            .expect("update of a record that exists");
        let machine = Arc::make_mut(&mut record.machine);
        edit(machine);
        // make_mut edits in place when nobody else holds this version: drop its memo.
        machine.encoded.reset();
        record.machine.assert_shape();
        self.touch(id)
    }

    /// Bumps the revision and stamps the record with it.
    pub(crate) fn touch(&mut self, id: &MachineId) -> Arc<Machine> {
        self.remember_record(id);
        self.revision += 1;
        let record = self
            .records
            .get_mut(id)
            .expect("touch of a record that exists");
        self.by_revision.remove(&(record.modified, id.clone()));
        record.modified = self.revision;
        self.by_revision.insert((self.revision, id.clone()));
        Arc::clone(&record.machine)
    }

    /// Writes the counters into a change set.
    pub(crate) fn stamp(&self, changes: &mut ChangeSet) {
        changes.revision = self.revision;
        changes.next_operation = self.next_operation;
    }
}
