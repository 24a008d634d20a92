//! Test doubles of the four ports for the crate's own unit tests, one per port where the
//! tests' needs allow: a scriptable host ([`TestHost`]), a disk that can fill up, stall or
//! fail ([`TestDisk`]), two clocks ([`StoppedClock`], [`TokioClock`]) and a spawner
//! ([`TestSpawner`]). Each starts as the plainest double of its port (everything answers
//! at once and succeeds); its builder methods turn on the behaviour a test needs.
//!
//! They run on tokio (its `Notify` and `watch`, its timer and its spawn), which the crate
//! has only as a dev-dependency, so they are compiled for the unit tests only, not under
//! the `testkit` feature.

use std::collections::BTreeSet;
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bigfleet_libvirt_domain::{ChangeSet, HostRef, Kind, Machine, MachineId, Snapshot, Timestamp};
use tokio::sync::{Notify, watch};

use crate::testkit::speculative;
use crate::{
    Clock, ConfigureRequest, CreateRequest, Created, DeleteRequest, DrainRequest, Hypervisor,
    HypervisorError, SideEffects, Spawner, StateStore, StoreError,
};

/// Locks a double's state; a test that panicked while holding it has failed already.
fn locked<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().expect("a test double's lock is not poisoned")
}

/// A scriptable host. Clones share their state, so a test keeps one clone to script and
/// inspect while the provider drives another.
///
/// - Inventory: `describe` answers a Speculative slot `m-1`, plus every slot added with
///   [`TestHost::with_slot`] or [`TestHost::add_slot`].
/// - Calls: every `create`, `configure`, `drain` and `delete` is recorded by kind on entry
///   ([`TestHost::calls`], [`TestHost::delete_count`]).
/// - Domains: a `create` leaves a domain for its machine unless its answer is an error that
///   provably changed nothing (an indefinite error models a lost reply: the domain exists
///   all the same); a `delete` removes it ([`TestHost::domain_count`],
///   [`TestHost::add_domain`] for one a previous process left).
/// - [`TestHost::failing_create`]: every `create` fails with that error.
/// - [`TestHost::gated`]: every `create` waits until [`TestHost::release_create`] lets it
///   through; otherwise every call answers at once.
#[derive(Clone)]
pub struct TestHost {
    inventory: Arc<Mutex<Vec<Machine>>>,
    calls: Arc<Mutex<Vec<Kind>>>,
    domains: Arc<Mutex<BTreeSet<MachineId>>>,
    failed: Arc<Mutex<Vec<MachineId>>>,
    create_answer: Option<HypervisorError>,
    create_gate: Option<Arc<Notify>>,
}

impl Default for TestHost {
    fn default() -> Self {
        Self {
            inventory: Arc::new(Mutex::new(vec![speculative("m-1")])),
            calls: Arc::default(),
            domains: Arc::default(),
            failed: Arc::default(),
            create_answer: None,
            create_gate: None,
        }
    }
}

impl TestHost {
    /// A host whose every `create` fails with `error`.
    pub fn failing_create(error: HypervisorError) -> Self {
        Self {
            create_answer: Some(error),
            ..Self::default()
        }
    }

    /// This host, its `create` calls waiting for [`TestHost::release_create`].
    pub fn gated(self) -> Self {
        Self {
            create_gate: Some(Arc::default()),
            ..self
        }
    }

    /// This host, with a Speculative slot `id` in its inventory.
    pub fn with_slot(self, id: &str) -> Self {
        self.add_slot(id);
        self
    }

    /// Adds a Speculative slot `id` to the inventory the next `describe` answers.
    pub fn add_slot(&self, id: &str) {
        locked(&self.inventory).push(speculative(id));
    }

    /// Lets one `create` through the gate: the one waiting, or else the next one.
    pub fn release_create(&self) {
        self.create_gate
            .as_ref()
            .expect("release_create is for a gated host")
            .notify_one();
    }

    /// Records a domain for `id`, as if a create of an earlier process had made it.
    pub fn add_domain(&self, id: &str) {
        locked(&self.domains).insert(MachineId::new(id).expect("a non-empty machine id"));
    }

    /// The kinds of the calls made so far, in order.
    pub fn calls(&self) -> Vec<Kind> {
        locked(&self.calls).clone()
    }

    /// How many `delete` calls were made.
    pub fn delete_count(&self) -> usize {
        self.calls().iter().filter(|&&k| k == Kind::Delete).count()
    }

    /// How many domains the host holds.
    pub fn domain_count(&self) -> usize {
        locked(&self.domains).len()
    }

    /// The machines the provider said went Failed ([`Hypervisor::failed`]), in order.
    pub fn told_failed(&self) -> Vec<MachineId> {
        locked(&self.failed).clone()
    }

    fn record(&self, kind: Kind) {
        locked(&self.calls).push(kind);
    }
}

impl Hypervisor for TestHost {
    fn describe(&self) -> impl Future<Output = Result<Vec<Machine>, HypervisorError>> + Send {
        std::future::ready(Ok(locked(&self.inventory).clone()))
    }

    async fn create(&self, request: CreateRequest) -> Result<Created, HypervisorError> {
        self.record(Kind::Create);
        if let Some(gate) = &self.create_gate {
            gate.notified().await;
        }
        let error = self.create_answer.clone();
        if error
            .as_ref()
            .is_none_or(|e| e.side_effects != SideEffects::None)
        {
            locked(&self.domains).insert(request.machine.id.clone());
        }
        match error {
            Some(error) => Err(error),
            None => Ok(Created {
                host: HostRef {
                    provider: "test".to_owned(),
                    reference: format!("zone-a/{}", request.machine.id),
                },
                resources: None,
                allocatable: None,
            }),
        }
    }

    async fn configure(&self, _: ConfigureRequest) -> Result<(), HypervisorError> {
        self.record(Kind::Configure);
        Ok(())
    }

    async fn drain(&self, _: DrainRequest) -> Result<(), HypervisorError> {
        self.record(Kind::Drain);
        Ok(())
    }

    async fn delete(&self, request: DeleteRequest) -> Result<(), HypervisorError> {
        self.record(Kind::Delete);
        locked(&self.domains).remove(&request.machine.id);
        Ok(())
    }

    fn failed(&self, machine: &Machine) {
        locked(&self.failed).push(machine.id.clone());
    }
}

#[derive(Default)]
struct DiskState {
    durable: Snapshot,
    full: bool,
    refusing: bool,
    failing: bool,
    attempts: u32,
    /// Commits made on a held disk so far (each one's ticket).
    held: u64,
}

/// A disk for the provider's store. Clones share their state. By default every commit is
/// applied when it is made and succeeds. Its knobs:
///
/// - [`TestDisk::set_full`]: a commit made on a full disk fails (`No space left on
///   device`), and every later one is refused ([`StoreError::AfterFailure`]) without being
///   applied until `resume`, as the port's contract asks. [`TestDisk::attempts`] counts the
///   commits that were attempted (not refused).
/// - [`TestDisk::slow`] and [`TestDisk::set_open`]: the commits of a slow disk complete
///   only while it is open (a closed disk is a slow fsync); they are applied when they
///   complete, not when they are made.
/// - [`TestDisk::held`] and [`TestDisk::release`]: the commits of a held disk complete one
///   at a time, in the order they were made, as the test releases them (each one a slow
///   fsync of its own); they are applied when they complete. [`TestDisk::held_count`] says
///   how many were made.
/// - [`TestDisk::set_failing`]: a commit that completes while the disk is failing fails
///   (an injected fsync failure) and applies nothing; later ones are not refused for it.
#[derive(Clone, Default)]
pub struct TestDisk {
    state: Arc<Mutex<DiskState>>,
    open: Option<watch::Sender<bool>>,
    /// On a held disk, how many commits were released so far.
    released: Option<watch::Sender<u64>>,
}

/// How a commit goes on once it was made: at once, when the slow disk is open, or when the
/// held disk released it (its ticket is below the count released).
enum Pending {
    Done(Result<(), StoreError>),
    WhenOpen(ChangeSet, watch::Receiver<bool>),
    WhenReleased(ChangeSet, u64, watch::Receiver<u64>),
}

impl TestDisk {
    /// A slow disk, open to begin with: see [`TestDisk::set_open`].
    pub fn slow() -> Self {
        Self {
            open: Some(watch::Sender::new(true)),
            ..Self::default()
        }
    }

    /// A held disk: see [`TestDisk::release`].
    pub fn held() -> Self {
        Self {
            released: Some(watch::Sender::new(0)),
            ..Self::default()
        }
    }

    /// Lets the oldest commit of a held disk that is not yet released complete (or the next
    /// one made, when none waits).
    pub fn release(&self) {
        self.released
            .as_ref()
            .expect("release is for a held disk")
            .send_modify(|released| *released += 1);
    }

    /// How many commits were made on a held disk (released or not).
    pub fn held_count(&self) -> u64 {
        locked(&self.state).held
    }

    /// Fills the disk (`true`) or gives it room again (`false`).
    pub fn set_full(&self, full: bool) {
        locked(&self.state).full = full;
    }

    /// Opens or closes a slow disk: its commits complete only while it is open.
    pub fn set_open(&self, open: bool) {
        self.open
            .as_ref()
            .expect("set_open is for a slow disk")
            .send_replace(open);
    }

    /// Starts or stops failing the commits that complete.
    pub fn set_failing(&self, failing: bool) {
        locked(&self.state).failing = failing;
    }

    /// The durable state: every change set committed so far, applied in order.
    pub fn durable(&self) -> Snapshot {
        locked(&self.state).durable.clone()
    }

    /// Applies `changes` to the durable state, as a commit of an earlier process did.
    pub fn apply(&self, changes: &ChangeSet) {
        locked(&self.state).durable.apply(changes);
    }

    /// How many commits were attempted: made while the disk did not refuse them.
    pub fn attempts(&self) -> u32 {
        locked(&self.state).attempts
    }

    /// What becomes of a commit when it is made.
    fn make(&self, changes: ChangeSet) -> Pending {
        let mut disk = locked(&self.state);
        if disk.refusing {
            let refused = StoreError::AfterFailure("an earlier commit failed".to_owned());
            return Pending::Done(Err(refused));
        }
        disk.attempts += 1;
        if disk.full {
            disk.refusing = true;
            let full = StoreError::Io("No space left on device (os error 28)".to_owned());
            return Pending::Done(Err(full));
        }
        if let Some(released) = &self.released {
            let ticket = disk.held;
            disk.held += 1;
            return Pending::WhenReleased(changes, ticket, released.subscribe());
        }
        match &self.open {
            Some(open) => Pending::WhenOpen(changes, open.subscribe()),
            None => Pending::Done(complete(&mut disk, &changes)),
        }
    }
}

/// Completes a commit: applies it, or fails it while the disk is failing.
fn complete(disk: &mut DiskState, changes: &ChangeSet) -> Result<(), StoreError> {
    if disk.failing {
        return Err(StoreError::Io("injected fsync failure".to_owned()));
    }
    disk.durable.apply(changes);
    Ok(())
}

impl StateStore for TestDisk {
    fn load(&self) -> impl Future<Output = Result<Snapshot, StoreError>> + Send {
        std::future::ready(Ok(self.durable()))
    }

    fn commit(
        &self,
        changes: ChangeSet,
    ) -> impl Future<Output = Result<(), StoreError>> + Send + 'static {
        let pending = self.make(changes);
        let state = Arc::clone(&self.state);
        async move {
            match pending {
                Pending::Done(result) => result,
                Pending::WhenOpen(changes, mut open) => {
                    open.wait_for(|open| *open)
                        .await
                        .map_err(|_| StoreError::Io("disk gone".to_owned()))?;
                    complete(&mut locked(&state), &changes)
                }
                Pending::WhenReleased(changes, ticket, mut released) => {
                    released
                        .wait_for(|released| *released > ticket)
                        .await
                        .map_err(|_| StoreError::Io("disk gone".to_owned()))?;
                    complete(&mut locked(&state), &changes)
                }
            }
        }
    }

    fn resume(&self) {
        locked(&self.state).refusing = false;
    }
}

/// How the timers of a [`StoppedClock`] fire.
#[derive(Clone, Copy)]
enum Timers {
    /// Every timer fires at once.
    AtOnce,
    /// A wait of up to a minute ends after one yield; a longer one never does.
    ShortOnly,
}

/// A clock stopped at t=1s. [`StoppedClock::instant`]: its timers fire at once, so backoff
/// and deadlines cost nothing. [`StoppedClock::short_waits_only`]: short waits (retry
/// backoff) end after one yield, long ones (over a minute: transition deadlines) never do.
#[derive(Clone, Copy)]
pub struct StoppedClock {
    timers: Timers,
}

impl StoppedClock {
    /// A stopped clock whose timers fire at once.
    pub fn instant() -> Self {
        Self {
            timers: Timers::AtOnce,
        }
    }

    /// A stopped clock whose short waits end after one yield and whose long ones never do.
    pub fn short_waits_only() -> Self {
        Self {
            timers: Timers::ShortOnly,
        }
    }
}

impl Clock for StoppedClock {
    fn now(&self) -> Timestamp {
        Timestamp(1_000_000_000)
    }

    fn sleep_until(&self, deadline: Timestamp) -> impl Future<Output = ()> + Send + 'static {
        let long = deadline.saturating_since(self.now()) > Duration::from_secs(60);
        let timers = self.timers;
        async move {
            if let Timers::ShortOnly = timers {
                if long {
                    std::future::pending::<()>().await;
                }
                tokio::task::yield_now().await;
            }
        }
    }
}

/// The provider's clock on tokio's clock (paused, in the tests that use it), starting at
/// zero when it is made. It has no knobs.
#[derive(Clone)]
pub struct TokioClock {
    base: tokio::time::Instant,
}

impl TokioClock {
    /// A clock whose zero is now.
    pub fn starting_now() -> Self {
        Self {
            base: tokio::time::Instant::now(),
        }
    }
}

impl Clock for TokioClock {
    fn now(&self) -> Timestamp {
        let elapsed = self.base.elapsed().as_nanos();
        Timestamp(u64::try_from(elapsed).unwrap_or(u64::MAX))
    }

    // The tests' own Clock adapter: the one place they may wait on tokio's timer.
    #[allow(clippy::disallowed_methods)]
    fn sleep_until(&self, deadline: Timestamp) -> impl Future<Output = ()> + Send + 'static {
        tokio::time::sleep_until(self.base + Duration::from_nanos(deadline.0))
    }
}

/// Spawns every task on tokio; [`TestSpawner::losing_transitions`] drops every transition
/// worker unstarted instead (a worker that never runs), while the provider's other tasks
/// run.
#[derive(Clone, Default)]
pub struct TestSpawner {
    lose_transitions: bool,
}

impl TestSpawner {
    /// A spawner that drops every transition worker unstarted.
    pub fn losing_transitions() -> Self {
        Self {
            lose_transitions: true,
        }
    }
}

impl Spawner for TestSpawner {
    // The tests' own Spawner adapter: the one place they may call tokio::spawn.
    #[allow(clippy::disallowed_methods)]
    fn spawn(&self, name: &'static str, task: impl Future<Output = ()> + Send + 'static) {
        if self.lose_transitions && name == "transition" {
            return;
        }
        drop(tokio::task::spawn(task));
    }
}
