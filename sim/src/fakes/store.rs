//! `SimStateStore`: the StateStore port with an explicit durability model (madsim's file
//! system does not model power loss, so it is not used).
//!
//! The [`Disk`] outlives provider processes. `commit` takes its place in the queue of the
//! current process the moment it is called; a background fsync task (on the provider node)
//! takes everything queued, waits a seeded fsync delay, applies the change sets in order
//! and only then resolves their futures, in order. Killing the node drops the queue and
//! the batch in flight: a restart loads exactly what was durable. An injected fsync failure
//! fails that batch and every later commit (the store fails stop, as after an fsync error
//! nothing can be trusted) and asks the supervisor to restart the process.
//!
//! The disk also keeps, per machine, every durable record in order: the checkers use it to
//! prove answers reflect only durable state and that every durable step is a legal edge.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};

use bigfleet_libvirt_domain::{
    ChangeSet, FenceKey, FenceMark, Kind, Machine, MachineId, OperationId, Snapshot,
};
use bigfleet_libvirt_ports::{StateStore, StoreError};
use futures::StreamExt;
use futures::channel::{mpsc, oneshot};

use crate::faults::StoreFaults;
use crate::history::Event;
use crate::rng::SimRng;
use crate::world::World;

/// What survives a crash.
#[derive(Debug, Default)]
pub struct Disk {
    machines: BTreeMap<MachineId, Arc<Machine>>,
    fences: BTreeMap<FenceKey, FenceMark>,
    operations: BTreeMap<(MachineId, Kind), OperationId>,
    revision: i64,
    next_operation: u64,
    /// Every durable record of each machine, oldest first.
    history: BTreeMap<MachineId, Vec<Arc<Machine>>>,
    /// Durable change sets so far.
    commits: u64,
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

    /// Every durable record of `id`, oldest first.
    #[must_use]
    pub fn history(&self, id: &MachineId) -> &[Arc<Machine>] {
        self.history.get(id).map_or(&[], Vec::as_slice)
    }

    /// The current durable record of every machine.
    pub fn machines(&self) -> impl Iterator<Item = &Arc<Machine>> {
        self.machines.values()
    }

    /// Number of durable change sets.
    #[must_use]
    pub fn commits(&self) -> u64 {
        self.commits
    }

    /// Applies one change set; returns each machine's previous and new record.
    fn apply(&mut self, changes: &ChangeSet) -> Vec<(Option<Arc<Machine>>, Arc<Machine>)> {
        let mut steps = Vec::with_capacity(changes.machines.len());
        for machine in &changes.machines {
            let previous = self
                .machines
                .insert(machine.id.clone(), Arc::clone(machine));
            let history = self.history.entry(machine.id.clone()).or_default();
            history.push(Arc::clone(machine));
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
        self.commits += 1;
        steps
    }
}

type Waiter = oneshot::Sender<Result<(), StoreError>>;

#[derive(Default)]
struct Queue {
    pending: Vec<(ChangeSet, Waiter)>,
    failed: Option<StoreError>,
}

/// One process's handle on the disk.
#[derive(Clone)]
pub struct SimStateStore {
    world: Arc<World>,
    queue: Arc<Mutex<Queue>>,
    wake: mpsc::UnboundedSender<()>,
}

impl SimStateStore {
    /// Opens the disk for a new process and starts its fsync task on the current node.
    #[must_use]
    pub fn open(world: Arc<World>, incarnation: u64) -> Self {
        let (wake, woken) = mpsc::unbounded();
        let store = Self {
            world,
            queue: Arc::new(Mutex::new(Queue::default())),
            wake,
        };
        let rng = SimRng::stream(store.world.plan.seed, &format!("fsync-{incarnation}"));
        drop(madsim::task::spawn(store.clone().fsync_loop(woken, rng)));
        store
    }

    fn queue(&self) -> MutexGuard<'_, Queue> {
        self.queue.lock().expect("store queue lock")
    }

    async fn fsync_loop(self, mut woken: mpsc::UnboundedReceiver<()>, mut rng: SimRng) {
        let faults: StoreFaults = self.world.plan.store.clone();
        while woken.next().await.is_some() {
            while let Ok(()) = woken.try_recv() {}
            let batch = std::mem::take(&mut self.queue().pending);
            if batch.is_empty() {
                continue;
            }
            let slow = rng.chance(faults.slow_fsync);
            let delay = if slow {
                rng.duration(
                    std::time::Duration::from_millis(50),
                    std::time::Duration::from_millis(500),
                )
            } else {
                rng.duration(faults.fsync.0, faults.fsync.1)
            };
            madsim::time::sleep(delay).await;
            if !self.world.calm() && rng.chance(faults.fsync_failure) {
                self.fail(batch);
                continue;
            }
            self.make_durable(batch);
        }
    }

    fn make_durable(&self, batch: Vec<(ChangeSet, Waiter)>) {
        let count = batch.len();
        for (changes, waiter) in batch {
            let steps = self.world.disk().apply(&changes);
            self.world.record(Event::Durable(steps));
            let _ = waiter.send(Ok(()));
        }
        let revision = self.world.disk().revision();
        self.world.trace(format!(
            "store fsync change_sets={count} revision={revision}"
        ));
    }

    fn fail(&self, batch: Vec<(ChangeSet, Waiter)>) {
        let error = StoreError::Io("injected fsync failure".to_owned());
        let later = {
            let mut queue = self.queue();
            queue.failed = Some(error.clone());
            std::mem::take(&mut queue.pending)
        };
        self.world
            .trace(format!("store fsync FAILED change_sets={}", batch.len()));
        for (_, waiter) in batch.into_iter().chain(later) {
            let _ = waiter.send(Err(error.clone()));
        }
        self.world.request_restart("fsync failure");
    }
}

impl StateStore for SimStateStore {
    fn load(&self) -> impl Future<Output = Result<Snapshot, StoreError>> + Send {
        std::future::ready(Ok(self.world.disk().snapshot()))
    }

    fn commit(
        &self,
        changes: ChangeSet,
    ) -> impl Future<Output = Result<(), StoreError>> + Send + 'static {
        let (waiter, done) = oneshot::channel();
        {
            let mut queue = self.queue();
            match &queue.failed {
                Some(error) => {
                    let _ = waiter.send(Err(error.clone()));
                }
                None => queue.pending.push((changes, waiter)),
            }
        }
        let _ = self.wake.unbounded_send(());
        async move {
            done.await
                .unwrap_or_else(|_| Err(StoreError::Io("the store stopped".to_owned())))
        }
    }
}
