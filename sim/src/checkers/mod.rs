//! Invariant checkers, kept apart from the workload (docs/design.md §5.6). They judge the
//! run from its history (`crate::history`), which every other part only appends to: each
//! answer as it left the provider and each answer a client received (`online`), each
//! durable commit (`durable`), each host effect and each request arriving at a host
//! (`hosts`), the books after each Create and Delete (`claims`), each host call sent and ended (`serving`), each span opened (`spans`), each
//! provider start (`restart`); and, run by the scenario, the deadline and serving watches
//! every 500 ms of simulated time and the final checks after faults stop and the provider
//! has converged (`quiescence`). Only the scenario names this module (the tidy test
//! `tests/tests/tidy/sim.rs` says so).
//!
//! Events are judged in the order they happened, each against what came before it: the
//! [`Ledger`] is the checkers' model of what clients were told (the highest token of each
//! (shard, machine) that got a definite non-fenced answer, every token sent, the operation
//! ids acknowledged, the highest List revision answered), and [`DiskSeen`] their copy of
//! the disk, following the change sets the store made durable.

pub mod claims;
pub mod deadlines;
pub mod durable;
pub mod hosts;
pub mod online;
pub mod quiescence;
pub mod restart;
pub mod serving;
pub mod spans;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use bigfleet_libvirt_domain::{
    CapacityType, FenceMark, HostRef, Kind, Machine, MachineId, MachineState, Snapshot, StringMap,
};
use bigfleet_libvirt_proto::v1alpha1 as pb;

use crate::disk::Disk;
use crate::history::{Entry, Event};
use crate::time::elapsed;
use crate::verdict::{Invariant, Violations};
use crate::workload::CLUSTER_KEY;
use crate::world::World;

/// Locks, ignoring poisoning: a panicking run is reported, and its state is still readable.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The checkers of one run: what they know from the history read so far, and what they
/// found.
pub struct Checkers {
    world: Arc<World>,
    ledger: Mutex<Ledger>,
    disk: Mutex<DiskSeen>,
    violations: Mutex<Violations>,
}

impl Checkers {
    /// The checkers of `world`'s run, before any event.
    #[must_use]
    pub fn new(world: Arc<World>) -> Self {
        Self {
            world,
            ledger: Mutex::new(Ledger::default()),
            disk: Mutex::new(DiskSeen::default()),
            violations: Mutex::new(Violations::default()),
        }
    }

    /// The world they judge.
    #[must_use]
    pub fn world(&self) -> &Arc<World> {
        &self.world
    }

    /// Checks every event the history holds that no checker has read yet, in order.
    /// Called by the watches every 500 ms, at quiescence and when the run ends.
    pub fn read_history(&self) {
        let entries = self.world.history().take_unread();
        for entry in entries {
            self.check(entry);
        }
    }

    fn check(&self, Entry { number, at, event }: Entry) {
        match event {
            Event::Durable(changes) => {
                let steps = self.disk().apply(&changes);
                durable::on_commit(self, at, &steps);
            }
            Event::HostEffect { machine, domains } => {
                hosts::on_effect(self, at, &machine, domains);
            }
            Event::Books {
                host,
                holdings,
                in_flight,
            } => claims::on_books(self, at, host, &holdings, &in_flight),
            Event::HostLoad {
                host,
                connection,
                in_flight,
                host_in_flight,
            } => hosts::on_load(self, at, host, connection, (in_flight, host_in_flight)),
            Event::HostCall {
                call,
                host,
                faulted,
            } => serving::on_call(self, at, call, host, faulted),
            Event::HostCallEnd { call, how } => serving::on_call_end(self, at, call, how),
            Event::Starting => restart::on_starting(self, at),
            Event::Started(machines) => restart::on_started(self, at, &machines),
            Event::Killed => deadlines::on_kill(self),
            Event::Answered(rpc, reply) => online::on_answer(self, at, &rpc, &reply),
            Event::Sent { scope, token } => online::on_send(self, number, scope, token),
            Event::Mutated {
                sent,
                kind,
                reply,
                binding,
            } => online::on_mutation(self, at, sent, kind, reply.as_ref(), binding.as_ref()),
            Event::Got(machine) => online::on_machine(self, at, &machine),
            Event::Listing => online::on_listing(self, number),
            Event::Listed { sent, list, cursor } => {
                online::on_list(self, at, sent, list.as_ref(), cursor);
            }
            Event::Span(seen) => spans::on_span(self, at, &seen),
        }
    }

    /// Records a broken invariant, now.
    pub fn violation(&self, invariant: Invariant, detail: impl Into<String>) {
        self.violation_at(invariant, elapsed(), detail);
    }

    /// Records an invariant broken at `at` (the time of the event that shows it; the
    /// trace line carries it too).
    pub fn violation_at(&self, invariant: Invariant, at: Duration, detail: impl Into<String>) {
        let detail = detail.into();
        let line = format!("VIOLATION {}: {detail}", invariant.name());
        self.world.trace_at(at, &line);
        lock(&self.violations).push(invariant, at, detail);
    }

    /// The violations so far.
    pub fn violations(&self) -> MutexGuard<'_, Violations> {
        lock(&self.violations)
    }

    /// What the checkers know of what clients were told.
    pub fn ledger(&self) -> MutexGuard<'_, Ledger> {
        lock(&self.ledger)
    }

    /// Their copy of the disk.
    pub fn disk(&self) -> MutexGuard<'_, DiskSeen> {
        lock(&self.disk)
    }
}

/// The disk as the history tells it: each change set the store made durable, applied in
/// the same order, so at each event it is the disk as it was then.
#[derive(Debug, Default)]
pub struct DiskSeen {
    /// The disk.
    pub disk: Disk,
    /// Every durable record of each machine, oldest first.
    pub records: BTreeMap<MachineId, Vec<Arc<Machine>>>,
    /// What the provider process starting last loaded (`restart`).
    pub loaded: Option<Snapshot>,
}

impl DiskSeen {
    /// Applies a change set made durable; returns each machine's previous and new record.
    pub fn apply(
        &mut self,
        changes: &bigfleet_libvirt_domain::ChangeSet,
    ) -> Vec<(Option<Arc<Machine>>, Arc<Machine>)> {
        for machine in &changes.machines {
            let records = self.records.entry(machine.id.clone()).or_default();
            records.push(Arc::clone(machine));
        }
        self.disk.apply(changes)
    }

    /// Every durable record of `id`, oldest first.
    #[must_use]
    pub fn records(&self, id: &MachineId) -> &[Arc<Machine>] {
        self.records.get(id).map_or(&[], Vec::as_slice)
    }
}

/// (shard id, machine id).
pub type FenceScope = (String, String);

/// What clients were told, as far as the checkers can know.
#[derive(Clone, Debug, Default)]
pub struct Ledger {
    /// Highest token per (shard, machine) that got a definite non-fenced answer.
    pub acked_marks: BTreeMap<FenceScope, FenceMark>,
    /// Every token sent per (shard, machine).
    pub sent: BTreeMap<FenceScope, BTreeSet<FenceMark>>,
    /// Highest operation number acknowledged per (machine, kind).
    pub acked_ops: BTreeMap<(String, Kind), u64>,
    /// Highest List revision answered.
    pub max_revision: i64,
    /// The machines whose durable record is transitional, with the simulated time the
    /// transition became durable and its state (`deadlines`).
    pub in_flight: BTreeMap<MachineId, (Duration, MachineState)>,
    /// The host calls in flight, by number (`serving`).
    pub calls: BTreeMap<u64, serving::CallSeen>,
    /// The fenced calls sent and not yet answered, by the number of their `Sent` event.
    pub sends: BTreeMap<u64, online::Sent>,
    /// The Lists sent and not yet answered, by the number of their `Listing` event, each
    /// with the highest revision any client had been answered when it was sent.
    pub lists: BTreeMap<u64, i64>,
    /// Whether a provider process has started and serves (`deadlines`).
    pub serving: bool,
}

/// The `n` of an operation id `op-n`.
#[must_use]
pub fn op_number(id: &str) -> Option<u64> {
    id.rsplit_once('-').and_then(|(_, n)| n.parse().ok())
}

/// A wire machine as a domain record, for the shape and binding rules.
#[must_use]
pub fn from_wire(m: &pb::Machine) -> Option<Machine> {
    let map = |r: &Option<pb::Resources>| -> StringMap {
        r.as_ref()
            .map(|r| {
                r.resources
                    .iter()
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect()
            })
            .unwrap_or_default()
    };
    Some(Machine {
        id: MachineId::new(m.id.clone()).ok()?,
        state: MachineState::from_wire(m.state)?,
        host: m.host.as_ref().map(|h| HostRef {
            provider: h.provider.clone(),
            reference: h.r#ref.clone(),
        }),
        instance_type: m.instance_type.clone(),
        zone: m.zone.clone(),
        capacity_type: CapacityType::from_wire(m.capacity_type),
        price_per_hour: m.price_per_hour,
        interruption_probability: m.interruption_probability,
        resources: map(&m.resources).into(),
        allocatable: map(&m.allocatable).into(),
        labels: m
            .labels
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
        last_error: m.last_error.clone(),
        cluster: m.cluster.clone(),
        shard_metadata: m
            .shard_metadata
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
        encoded: Default::default(),
    })
}

/// Whether the state holds a cluster binding.
#[must_use]
pub fn bound_state(state: MachineState) -> bool {
    matches!(
        state,
        MachineState::Configuring | MachineState::Configured | MachineState::Draining
    )
}

/// How a record breaks the shape its state implies or the "bound exactly while bound"
/// rule, if it does.
#[must_use]
pub fn binding_problem(m: &Machine) -> Option<String> {
    if let Some(problem) = m.shape_violation() {
        return Some(problem);
    }
    let has_cluster = !m.cluster.is_empty();
    let has_metadata = !m.shard_metadata.is_empty();
    let consistent = m.shard_metadata.get(CLUSTER_KEY) == Some(&m.cluster);
    let ok = match m.state {
        s if bound_state(s) => has_cluster && consistent,
        // A failed Configure or Drain keeps its binding; other failures have none.
        MachineState::Failed => has_cluster == has_metadata && (!has_cluster || consistent),
        _ => !has_cluster && !has_metadata,
    };
    (!ok).then(|| {
        format!(
            "machine {} is {} with cluster {:?} and shard_metadata {:?}",
            m.id, m.state, m.cluster, m.shard_metadata
        )
    })
}
