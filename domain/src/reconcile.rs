//! Reconcile (docs/contract.md §9): adopt described records the inventory lacks and refresh
//! the substrate facts of known ones. Lifecycle state, host, binding, metadata, last_error,
//! instance type, zone and capacity type are never touched, and records are never removed.

use std::sync::Arc;

use crate::changes::ChangeSet;
use crate::core::{Core, Record};
use crate::machine::{Machine, MachineId};
use crate::validate::{InvalidMachine, validate_instance};

/// What one reconcile pass did.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ReconcileReport {
    /// Records added because the inventory did not know them.
    pub added: Vec<MachineId>,
    /// Records whose price, probability, resources, allocatable or labels changed.
    pub refreshed: Vec<MachineId>,
    /// Described records skipped because they break a field-shape rule.
    pub skipped: Vec<InvalidMachine>,
    /// What to persist; `None` when nothing changed (and the revision did not move).
    pub changes: Option<ChangeSet>,
}

impl Core {
    /// Folds one Describe result into the inventory.
    pub fn reconcile(&mut self, described: Vec<Machine>) -> ReconcileReport {
        let mut report = ReconcileReport::default();
        let mut changes = ChangeSet::default();
        for fresh in described {
            if let Err(invalid) = validate_instance(&fresh, self.policy.require_zone) {
                report.skipped.push(invalid);
                continue;
            }
            let id = fresh.id.clone();
            let Some(record) = self.records.get(&id) else {
                self.remember_record(&id);
                let record = Record {
                    machine: Arc::new(fresh),
                    modified: 0,
                    in_flight: None,
                };
                self.records.insert(id.clone(), record);
                changes.machines.push(self.touch(&id));
                report.added.push(id);
                continue;
            };
            let current = &record.machine;
            // Validated numbers are never NaN, so `==` is exact (and treats -0.0 as 0.0).
            #[allow(clippy::float_cmp)]
            let unchanged = current.price_per_hour == fresh.price_per_hour
                && current.interruption_probability == fresh.interruption_probability
                && current.resources == fresh.resources
                && current.allocatable == fresh.allocatable
                && current.labels == fresh.labels;
            if unchanged {
                continue;
            }
            let machine = self.update(&id, |m| {
                m.price_per_hour = fresh.price_per_hour;
                m.interruption_probability = fresh.interruption_probability;
                m.resources = fresh.resources;
                m.allocatable = fresh.allocatable;
                m.labels = fresh.labels;
            });
            changes.machines.push(machine);
            report.refreshed.push(id);
        }
        if !changes.is_empty() {
            self.stamp(&mut changes);
            report.changes = Some(changes);
        }
        report
    }
}
