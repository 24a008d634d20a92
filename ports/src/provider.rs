//! The Provider service: accept → persist → acknowledge → run the transition under its
//! deadline → complete → persist (→ compensate a failed Create that may have left a
//! domain, see `compensation.rs`). This file holds the service's types and its small
//! accessors; each job has its own file under `provider/`:
//!
//! - `start.rs`: loading, first-boot seeding, restart recovery;
//! - `mutate.rs`: the mutating paths (a call and its critical section, the reconcile pass,
//!   the probe commit);
//! - `read.rs`: the read paths (Get, List);
//! - `rewind.rs`: enqueueing change sets and the failed-commit rewind;
//! - `transition.rs`: the transition runner and its completion;
//! - `deadlines.rs`: the deadline sweep;
//! - `compensate.rs`: starting the compensation of failed Creates and Deletes.
//!
//! The domain core sits behind one mutex. A decision and the enqueueing of its change set
//! happen under that lock, so the store sees change sets in decision order; waiting for
//! durability happens outside it, so concurrent calls can share one durable write. Work on
//! the hypervisor never runs under the lock.
//!
//! A failed commit is per commit, never sticky: every decision is taken with a savepoint,
//! and when the store reports a failure, every decision not yet durable is rewound (newest
//! first), so the core serves the last durable state again; the store is then told to
//! resume and the next change set is attempted afresh. The calls whose decisions were in
//! the failed commit are answered `UNAVAILABLE`; calls decided on top of it while it ran,
//! and reads, are decided again on the rewound state; a transition's completion is retried
//! until it is durable.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bigfleet_libvirt_domain::{
    Core, Kind, ListPage, ListQuery, ListRotation, Machine, MachineId, MachineState, MutateError,
    Policy, Savepoint, SeedError, Timestamp,
};
use futures::channel::mpsc;
use futures::future::{BoxFuture, Shared};

use crate::clock::Clock;
use crate::hypervisor::{Hypervisor, HypervisorError};
use crate::spawn::Spawner;
use crate::store::{StateStore, StoreError};

/// Settings of the provider service.
#[derive(Clone, Debug)]
pub struct ProviderConfig {
    /// Decision policy (Delete capability, zone rule, deadlines, op-id prefix).
    pub policy: Policy,
    /// How long the first-boot `describe` may take.
    pub seed_timeout: Duration,
}

impl Default for ProviderConfig {
    fn default() -> Self {
        Self {
            policy: Policy::default(),
            seed_timeout: Duration::from_secs(30),
        }
    }
}

/// Why the provider could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The store could not be read.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// What start-up decided (the seeded inventory, or transitions a restart interrupted
    /// marked Failed) could not be written.
    #[error("write the start-up state: {0}; then start the provider again")]
    Persist(StoreError),
    /// First boot: the hypervisor could not describe its inventory.
    #[error("describe the inventory to seed an empty store: {0}")]
    Describe(HypervisorError),
    /// First boot: describing the inventory took longer than the seed timeout.
    #[error("describe the inventory to seed an empty store: no answer within {0:?}")]
    DescribeTimedOut(Duration),
    /// The described or stored inventory is unusable.
    #[error(transparent)]
    Inventory(#[from] SeedError),
}

/// Why a mutating call failed.
#[derive(Debug, thiserror::Error)]
pub enum ProviderError {
    /// The core refused the call.
    #[error(transparent)]
    Rejected(#[from] MutateError),
    /// The decision could not be made durable, so it was not acknowledged.
    #[error("the decision could not be persisted: {0}")]
    Store(#[from] StoreError),
}

/// The end of one transition, for metrics and tests.
#[derive(Clone, Debug, PartialEq)]
pub struct TransitionEvent {
    /// The transition kind.
    pub kind: Kind,
    /// The machine as it ended (target state or Failed), or `None` if the result was dropped.
    pub machine: Option<Arc<Machine>>,
    /// Time from dispatch to completion.
    pub elapsed: Duration,
}

/// Told about every finished transition (metrics, benchmarks, tests), in the order given to
/// [`Provider::start`].
pub type Observer = Arc<dyn Fn(&TransitionEvent) + Send + Sync>;

/// The durability of the most recently enqueued change set. The store makes change sets
/// durable in the order they were enqueued, so once this resolves, everything decided
/// before it is durable too.
type Barrier = Shared<BoxFuture<'static, Result<(), StoreError>>>;

/// How many times a mutating call is decided in all when the state it was decided on is
/// rewound by a commit that failed without holding its own decision, before it gives up.
const DECISIONS_MAX: usize = 8;

/// The first wait before a transition's completion is committed again after a failed commit;
/// it doubles up to [`COMPLETION_RETRY_MAX`].
const COMPLETION_RETRY_FIRST: Duration = Duration::from_millis(100);
const COMPLETION_RETRY_MAX: Duration = Duration::from_secs(5);

/// How long past a transition's deadline the deadline sweep leaves the result to the
/// transition's own worker (which stops the hypervisor call at the deadline itself) before it
/// fails the machine on its own.
pub const SWEEP_GRACE: Duration = Duration::from_secs(1);

/// A transition's deadline as the sweep keeps it: when, on which machine, of what kind.
type DeadlineEntry = (Timestamp, MachineId, Kind);

/// A decision whose change set the store has not yet confirmed, and what takes it back.
struct Pending {
    /// Its place in the commit order: one more than the change set enqueued before it.
    seq: u64,
    barrier: Barrier,
    savepoint: Savepoint,
    /// The machines whose records its change set writes.
    machines: Vec<MachineId>,
}

/// The decision core and the durability barriers of what it holds, guarded together so that
/// whoever observes the core also learns what must be durable first.
struct Guarded {
    core: Core,
    /// The barrier of the newest decision: what an answer that may reflect anything the core
    /// holds (a mutating call's) waits for.
    last_commit: Barrier,
    /// The place in the commit order ([`Pending::seq`]) the next change set gets.
    next_seq: u64,
    /// For each machine whose newest record is not yet durable, the pending change set that
    /// writes it: a Get of that machine waits for that one only.
    machine_commits: BTreeMap<MachineId, u64>,
    /// The newest pending change set that moved the revision (every change set with a record
    /// does, and no other): a List, whose records and revision that decision bounds, waits
    /// for it.
    revision_commit: Option<u64>,
    /// Where the last capped List stopped, so consecutive (and concurrent) capped picks
    /// spread over the inventory instead of all returning its first records. In memory only.
    rotation: ListRotation,
    /// Decisions enqueued and not yet seen durable, oldest first.
    pending: VecDeque<Pending>,
    /// The deadline of every transition accepted and not yet completed, earliest first, for
    /// the deadline sweep, with the transition's span (a child of the call's, so a sweep
    /// that fails it stays in the caller's trace). An entry left by a decision a failed
    /// commit took back is harmless: the sweep only fails what the core still has in flight
    /// past its deadline.
    deadlines: BTreeMap<DeadlineEntry, tracing::Span>,
}

impl Guarded {
    /// The barrier of the pending change set `seq`, or `None` once it is durable (or was
    /// taken back, which leaves nothing of it in the core).
    fn pending_barrier(&self, seq: u64) -> Option<Barrier> {
        let first = self.pending.front()?.seq;
        let index = usize::try_from(seq.checked_sub(first)?).ok()?;
        self.pending.get(index).map(|p| p.barrier.clone())
    }

    /// Forgets what readers waited for on a change set that became durable.
    fn confirmed(&mut self, done: &Pending) {
        for id in &done.machines {
            if self.machine_commits.get(id) == Some(&done.seq) {
                self.machine_commits.remove(id);
            }
        }
        if self.revision_commit == Some(done.seq) {
            self.revision_commit = None;
        }
    }
}

/// Whether the state store is taking commits, for readiness, health and metrics.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StoreStatus {
    /// Why the last commit attempt failed; `None` while commits succeed.
    pub failing: Option<String>,
    /// Commit attempts that failed since start-up.
    pub failures: u64,
}

struct Inner<H, S, C, E> {
    core: Mutex<Guarded>,
    store_status: Mutex<StoreStatus>,
    // Shared so a compensating delete can outlive the call that needed it without holding
    // the provider (see `compensation.rs`).
    hypervisor: Arc<H>,
    store: S,
    clock: C,
    spawner: E,
    /// Fixed at start, so no transition's end can be missed by one registered later.
    observers: Vec<Observer>,
    /// Wakes the deadline sweep when a new earliest deadline is recorded; dropped with the
    /// provider, which ends the sweep.
    sweep_wake: mpsc::Sender<()>,
}

/// The provider service, cheap to clone (one shared instance behind an `Arc`).
pub struct Provider<H, S, C, E> {
    inner: Arc<Inner<H, S, C, E>>,
}

impl<H, S, C, E> Clone for Provider<H, S, C, E> {
    fn clone(&self) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
        }
    }
}

impl<H: Hypervisor, S: StateStore, C: Clock, E: Spawner> Provider<H, S, C, E> {
    /// Whether the store takes commits (the last attempt's outcome) and how many failed.
    #[must_use]
    pub fn store_status(&self) -> StoreStatus {
        self.inner
            .store_status
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// The current inventory without waiting for durability (metrics and tests only; never
    /// for answering a client).
    #[must_use]
    pub fn peek(&self, query: &ListQuery) -> ListPage {
        self.lock().core.list(query)
    }

    /// How many machines the inventory holds (an upper bound on a List's answer).
    #[must_use]
    pub fn machine_count(&self) -> usize {
        self.lock().core.len()
    }

    /// Whether Delete is offered.
    #[must_use]
    pub fn delete_supported(&self) -> bool {
        self.lock().core.policy().delete_supported
    }

    /// Whether the hypervisor enforces the node-readiness gate.
    #[must_use]
    pub fn readiness_gate(&self) -> bool {
        self.inner.hypervisor.readiness_gate()
    }

    /// The restore hand-off: gives the hypervisor the machines the provider holds
    /// ([`Hypervisor::restored`]). The composition root calls it once, before serving.
    pub fn hand_off_restored(&self) {
        let machines = self.peek(&ListQuery::default()).machines;
        self.inner.hypervisor.restored(&machines);
    }

    /// Number of machines by state.
    #[must_use]
    pub fn count_by_state(&self) -> Vec<(MachineState, usize)> {
        let page = self.peek(&ListQuery::default());
        MachineState::ALL
            .into_iter()
            .map(|s| (s, page.machines.iter().filter(|m| m.state == s).count()))
            .collect()
    }

    /// Completes at `deadline` on the provider's clock.
    pub fn sleep_until(
        &self,
        deadline: Timestamp,
    ) -> impl std::future::Future<Output = ()> + Send + 'static {
        self.inner.clock.sleep_until(deadline)
    }

    /// The current time, from the provider's clock.
    #[must_use]
    pub fn now(&self) -> Timestamp {
        self.inner.clock.now()
    }

    fn set_store_status(&self, change: impl FnOnce(&mut StoreStatus)) {
        let mut status = self
            .inner
            .store_status
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        change(&mut status);
    }

    fn lock(&self) -> MutexGuard<'_, Guarded> {
        // A panic while holding the lock means an invariant broke; keep serving reads of
        // the last consistent state rather than poisoning every later call.
        self.inner
            .core
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Why a reconcile pass failed.
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    /// Describe failed.
    #[error("describe: {0}")]
    Describe(#[from] HypervisorError),
    /// The refreshed records could not be persisted.
    #[error(transparent)]
    Store(#[from] StoreError),
}

fn duration_nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

mod compensate;
mod deadlines;
mod mutate;
mod read;
mod rewind;
mod start;
mod transition;

#[cfg(test)]
mod tests;

#[cfg(test)]
mod cancel_tests;

#[cfg(test)]
mod read_tests;
