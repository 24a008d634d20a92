//! The Provider service: accept → persist → acknowledge → run the transition under its
//! deadline → complete → persist (→ compensate a failed Create that may have left a
//! domain, see `compensation.rs`). The transition runner is in `provider/transition.rs`, the
//! deadline sweep in `provider/deadlines.rs`.
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

use std::collections::{BTreeSet, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bigfleet_libvirt_domain::{
    Ack, Core, Kind, ListPage, ListQuery, ListRotation, Machine, MachineId, MachineState,
    MutateDecision, MutateError, Mutation, OperationId, Policy, ReconcileReport, Savepoint,
    SeedError, Timestamp,
};
use futures::FutureExt;
use futures::channel::mpsc;
use futures::future::{BoxFuture, Shared};
use tracing::{Instrument, debug, error, info, info_span, warn};

use crate::clock::Clock;
use crate::compensation;
use crate::hypervisor::{BootstrapBlob, Hypervisor, HypervisorError};
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
    barrier: Barrier,
    savepoint: Savepoint,
}

/// The decision core and the durability barrier of its newest decision, guarded together
/// so that whoever observes the core also learns what must be durable first.
struct Guarded {
    core: Core,
    last_commit: Barrier,
    /// Where the last capped List stopped, so consecutive (and concurrent) capped picks
    /// spread over the inventory instead of all returning its first records. In memory only.
    rotation: ListRotation,
    /// Decisions enqueued and not yet seen durable, oldest first.
    pending: VecDeque<Pending>,
    /// The deadline of every transition accepted and not yet completed, earliest first, for
    /// the deadline sweep. An entry left by a decision a failed commit took back is harmless:
    /// the sweep only fails what the core still has in flight past its deadline.
    deadlines: BTreeSet<DeadlineEntry>,
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
    /// Loads durable state (seeding from the hypervisor on first boot, failing interrupted
    /// transitions after a restart) and returns a provider ready to serve, which tells
    /// `observers` about every transition it finishes.
    ///
    /// # Errors
    /// When the store cannot be read or committed, or first-boot seeding fails.
    pub async fn start(
        config: ProviderConfig,
        hypervisor: H,
        store: S,
        clock: C,
        spawner: E,
        observers: Vec<Observer>,
    ) -> Result<Self, StartError> {
        let snapshot = store.load().await?;
        let (core, changes) = if snapshot.is_fresh() {
            let deadline = clock.now().saturating_add(config.seed_timeout);
            let described = futures::select_biased! {
                described = hypervisor.describe().fuse() => described.map_err(StartError::Describe)?,
                () = clock.sleep_until(deadline).fuse() =>
                    return Err(StartError::DescribeTimedOut(config.seed_timeout)),
            };
            let (core, changes) = Core::seed(config.policy, described)?;
            info!(
                machines = core.len(),
                "seeded an empty store from the hypervisor"
            );
            (core, Some(changes))
        } else {
            let (core, changes) = Core::restore(config.policy, snapshot)?;
            let failed = changes.as_ref().map_or(0, |c| c.machines.len());
            info!(
                machines = core.len(),
                interrupted = failed,
                "restored durable state"
            );
            (core, changes)
        };
        if let Some(changes) = changes {
            store.commit(changes).await.map_err(StartError::Persist)?;
        }
        let guarded = Guarded {
            core,
            last_commit: settled(),
            rotation: ListRotation::default(),
            pending: VecDeque::new(),
            deadlines: BTreeSet::new(),
        };
        let (sweep_wake, woken) = mpsc::channel(1);
        let inner = Inner {
            core: Mutex::new(guarded),
            store_status: Mutex::default(),
            hypervisor: Arc::new(hypervisor),
            store,
            clock,
            spawner,
            observers,
            sweep_wake,
        };
        let provider = Self {
            inner: Arc::new(inner),
        };
        let sweep = sweep_deadlines(Arc::downgrade(&provider.inner), woken);
        // Injected bug (simulator bug hunt only, with the one in `mutate`): no sweep, so
        // nothing but a restart ends a transition whose worker never started.
        if !cfg!(feature = "bug-transition-after-commit") {
            provider.inner.spawner.spawn(
                "deadline-sweep",
                sweep.instrument(info_span!("deadline_sweep")),
            );
        }
        provider.compensate_failed_creates();
        Ok(provider)
    }

    /// Decides a mutating call, makes the decision durable, starts the transition it
    /// accepted, and returns the acknowledgement.
    ///
    /// Cancellation-safe: the transition's worker is spawned in the same critical section
    /// that takes the decision, before the first await, and it waits for the decision to be
    /// durable on its own. A caller that stops waiting (a client deadline, a reset stream)
    /// loses only its answer; an accepted transition runs to completion either way.
    ///
    /// # Errors
    /// The core's rejection, or a store failure (then nothing was acknowledged).
    pub async fn mutate(
        &self,
        mutation: Mutation,
        blob: BootstrapBlob,
    ) -> Result<Ack, ProviderError> {
        let now = self.inner.clock.now();
        let mut mutation = mutation;
        let mut blob = Some(blob);
        let mut attempt = 0;
        let decision = loop {
            let (decision, durable, spare) = self.decide(mutation, now, &mut blob);
            // Injected bug (simulator bug hunt only): acknowledge before the decision is durable.
            #[cfg(feature = "bug-ack-before-persist")]
            let durable = {
                drop(durable);
                settled()
            };
            // Even an answer that changed nothing (an idempotent retry, a rejection) waits
            // for the decisions it observed to be durable: no answer may reflect state a
            // crash could still take back.
            let durable = durable.await;
            self.settle();
            // Injected bug (simulator bug hunt only): the worker is started by the caller's
            // future once the commit is in, so a caller that goes away while it waits leaves
            // the transition without a worker.
            #[cfg(feature = "bug-transition-after-commit")]
            if let (
                Ok(()),
                Ok(Ack {
                    dispatch: Some(dispatch),
                    ..
                }),
            ) = (&durable, &decision.outcome)
            {
                let blob = blob.clone().unwrap_or_default();
                self.start_transition(&mut self.lock(), dispatch.clone(), blob, settled());
            }
            match durable {
                Ok(()) => break decision,
                // This call's own decision was in the commit that failed: it is not
                // acknowledged.
                Err(store_error)
                    if decision.changes.is_some()
                        && !matches!(store_error, StoreError::AfterFailure(_)) =>
                {
                    warn!(error = %store_error, "decision not persisted; call not acknowledged");
                    return Err(ProviderError::Store(store_error));
                }
                // It was decided on top of (or observed) a decision that was rewound, and was
                // not written itself: decide again on what is durable.
                Err(store_error) => match spare {
                    Some(again) if attempt + 1 < DECISIONS_MAX => {
                        attempt += 1;
                        mutation = again;
                    }
                    _ => return Err(ProviderError::Store(store_error)),
                },
            }
        };
        Ok(decision.outcome?)
    }

    /// Takes one decision of [`Self::mutate`] in one critical section: settles what the store
    /// reported, decides, enqueues the change set and spawns the worker of an accepted
    /// transition. Returns the decision, its barrier, and a copy of the mutation when the
    /// decision observed others not yet durable (it may have to be taken again, with the
    /// blob, which is then kept too).
    fn decide(
        &self,
        mutation: Mutation,
        now: Timestamp,
        blob: &mut Option<BootstrapBlob>,
    ) -> (MutateDecision, Barrier, Option<Mutation>) {
        let mut guarded = self.lock();
        self.settle_locked(&mut guarded);
        let spare = (!guarded.pending.is_empty()).then(|| mutation.clone());
        let (decision, savepoint) = guarded.core.with_savepoint(|c| c.mutate(mutation, now));
        let durable = self.enqueue(&mut guarded, decision.changes.clone(), savepoint);
        if let Ok(Ack {
            dispatch: Some(dispatch),
            ..
        }) = &decision.outcome
            && !cfg!(feature = "bug-transition-after-commit")
        {
            let blob = if spare.is_some() {
                blob.clone()
            } else {
                blob.take()
            };
            let blob = blob.unwrap_or_default();
            self.start_transition(&mut guarded, dispatch.clone(), blob, durable.clone());
        }
        (decision, durable, spare)
    }
    /// One machine by id, once everything it may reflect is durable.
    ///
    /// # Errors
    /// When the state it reflects could not be persisted.
    pub async fn get(&self, id: &str) -> Result<Option<Arc<Machine>>, StoreError> {
        self.read(|guarded| guarded.core.get(id)).await
    }

    /// The machines a List call returns, once everything they may reflect is durable (so a
    /// cursor handed out is never ahead of what a restart reloads). A capped call continues
    /// where the previous capped call stopped (see [`ListRotation`]); the step happens under
    /// the lock, so concurrent capped pickers get different machines.
    ///
    /// # Errors
    /// When the state it reflects could not be persisted.
    pub async fn list(&self, query: &ListQuery) -> Result<ListPage, StoreError> {
        self.read(|guarded| {
            let Guarded { core, rotation, .. } = guarded;
            core.list_rotating(query, rotation)
        })
        .await
    }

    /// Answers a read once everything it may reflect is durable. When what it observed is
    /// rewound by a failed commit, it answers from the last durable state instead: at once,
    /// by looking past the decisions still waiting for the store (rewound for the look and
    /// redone right after), so reads never wait on a disk that keeps failing.
    async fn read<T>(&self, mut look: impl FnMut(&mut Guarded) -> T) -> Result<T, StoreError> {
        let (answer, durable) = {
            let mut guarded = self.lock();
            (look(&mut guarded), guarded.last_commit.clone())
        };
        let durable = durable.await;
        let mut guarded = self.lock();
        self.settle_locked(&mut guarded);
        if durable.is_ok() {
            return Ok(answer);
        }
        let mut redos = Vec::with_capacity(guarded.pending.len());
        for index in (0..guarded.pending.len()).rev() {
            let savepoint = std::mem::take(&mut guarded.pending[index].savepoint);
            redos.push(guarded.core.rewind(savepoint));
        }
        let answer = look(&mut guarded);
        for (index, redo) in redos.into_iter().rev().enumerate() {
            guarded.pending[index].savepoint = guarded.core.rewind(redo);
        }
        Ok(answer)
    }

    /// Commits a change set that changes nothing, to learn whether the store takes writes
    /// again after a failure even when no call arrives (a provider taken out of service
    /// while its disk is full gets none).
    ///
    /// # Errors
    /// When the commit fails.
    pub async fn probe_store(&self) -> Result<(), StoreError> {
        let durable = {
            let mut guarded = self.lock();
            self.settle_locked(&mut guarded);
            let changes = guarded.core.probe();
            self.enqueue(&mut guarded, Some(changes), Savepoint::default())
        };
        let durable = durable.await;
        self.settle();
        durable
    }

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

    /// Describes the hypervisor and folds the result into the inventory.
    ///
    /// # Errors
    /// When describe fails or the result cannot be persisted.
    pub async fn reconcile(&self) -> Result<ReconcileReport, ReconcileError> {
        let described = self.inner.hypervisor.describe().await?;
        let (report, durable) = {
            let mut guarded = self.lock();
            self.settle_locked(&mut guarded);
            let (report, savepoint) = guarded.core.with_savepoint(|c| c.reconcile(described));
            let durable = self.enqueue(&mut guarded, report.changes.clone(), savepoint);
            (report, durable)
        };
        for skipped in &report.skipped {
            warn!(error = %skipped, "reconcile skipped an invalid record");
        }
        let durable = durable.await;
        self.settle();
        durable?;
        Ok(report)
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

    /// Enqueues a decision's change set (under the lock, so the store sees decisions in
    /// order) and returns the barrier that resolves once it, and everything before it, is
    /// durable. A decision without changes gets the previous barrier. The savepoint is kept
    /// until the store confirms the change set, to take the decision back if it fails.
    ///
    /// The caller settles ([`Self::settle_locked`]) before it takes the decision, in the same
    /// critical section; this never settles. A failed commit rewound *beneath* a decision
    /// that is already taken but not yet pending would come back when that decision is
    /// rewound in turn (its savepoint recorded the state with the failed decision in it). A
    /// caller that gave up leaves its failed commit to whoever decides next, so this is the
    /// common case, not a corner.
    fn enqueue(
        &self,
        guarded: &mut Guarded,
        changes: Option<bigfleet_libvirt_domain::ChangeSet>,
        savepoint: Savepoint,
    ) -> Barrier {
        if let Some(changes) = changes {
            let commit: BoxFuture<'static, _> = Box::pin(self.inner.store.commit(changes));
            guarded.last_commit = commit.shared();
            guarded.pending.push_back(Pending {
                barrier: guarded.last_commit.clone(),
                savepoint,
            });
        }
        guarded.last_commit.clone()
    }

    /// [`Self::settle_locked`] under the lock.
    fn settle(&self) {
        let mut guarded = self.lock();
        self.settle_locked(&mut guarded);
    }

    /// Forgets the savepoints of decisions the store confirmed, oldest first. At the first
    /// failure reported, every decision not yet durable is rewound, newest first: the store
    /// confirms in order and refuses everything after a failure, so none of them can still
    /// become durable, and the core is back at the last durable state. Then the store may
    /// attempt the next change set afresh.
    fn settle_locked(&self, guarded: &mut Guarded) {
        while let Some(front) = guarded.pending.front() {
            match front.barrier.clone().now_or_never() {
                None => return,
                Some(Ok(())) => {
                    guarded.pending.pop_front();
                    self.set_store_status(|status| {
                        if status.failing.take().is_some() {
                            info!("the state store takes commits again");
                        }
                    });
                }
                Some(Err(error)) => {
                    let rewound = guarded.pending.len();
                    while let Some(pending) = guarded.pending.pop_back() {
                        let _redo = guarded.core.rewind(pending.savepoint);
                    }
                    guarded.last_commit = settled();
                    self.inner.store.resume();
                    self.set_store_status(|status| {
                        // Said loudly once; while the store keeps failing, the failure count
                        // and readiness say the rest.
                        if status.failing.is_none() {
                            error!(
                                error = %error,
                                rewound,
                                "state commit failed: its calls are not acknowledged and \
                                 reads serve the last durable state; the next commit tries again"
                            );
                        } else {
                            debug!(error = %error, rewound, "state commit failed again");
                        }
                        status.failing = Some(error.to_string());
                        status.failures += 1;
                    });
                    return;
                }
            }
        }
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
    /// Start-up half of the Create compensation: a restart may have interrupted a Create
    /// (now Failed without a host) or a compensation in flight, so every Failed record
    /// without a host gets its compensating delete again (idempotent when nothing is left).
    fn compensate_failed_creates(&self) {
        let failed = {
            let guarded = self.lock();
            let query = ListQuery {
                states: Some([MachineState::Failed].into()),
                ..ListQuery::default()
            };
            let page = guarded.core.list(&query);
            page.machines
                .into_iter()
                .filter(|m| !m.has_host())
                .filter_map(|m| Some((guarded.core.operation(&m.id, Kind::Create)?.clone(), m)))
                .collect::<Vec<_>>()
        };
        for (operation_id, machine) in failed {
            self.compensate(machine, operation_id);
        }
    }

    /// Starts the best-effort delete of whatever a failed Create may have left on its host
    /// (`compensation.rs`). The task holds the hypervisor and clock, not the provider.
    fn compensate(&self, machine: Arc<Machine>, operation_id: OperationId) {
        if cfg!(feature = "bug-no-create-compensation") {
            return; // Injected bug (simulator bug hunt only): leak the domain.
        }
        let timeout = self.lock().core.policy().timeouts.delete;
        let span = info_span!(
            "compensation",
            machine_id = %machine.id,
            operation_id = %operation_id,
        );
        let hypervisor = Arc::clone(&self.inner.hypervisor);
        let clock = self.inner.clock.clone();
        let task = compensation::delete_leftover(hypervisor, clock, timeout, machine, operation_id);
        self.inner
            .spawner
            .spawn("create-compensation", task.map(drop).instrument(span));
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

/// A barrier that is already resolved.
fn settled() -> Barrier {
    let ready: BoxFuture<'static, Result<(), StoreError>> = Box::pin(std::future::ready(Ok(())));
    ready.shared()
}

mod deadlines;
use deadlines::sweep_deadlines;
mod transition;

#[cfg(test)]
mod tests;

#[cfg(test)]
mod cancel_tests;
