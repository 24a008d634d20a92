//! `SimStateStore`: the StateStore port with an explicit durability model (madsim's file
//! system does not model power loss, so it is not used).
//!
//! The disk (`crate::disk::Disk`, held by the world) outlives provider processes. `commit`
//! takes its place in the queue of the current process the moment it is called; a
//! background fsync task (on the provider node) takes everything queued, waits a seeded
//! fsync delay, applies the change sets in order and only then resolves their futures, in
//! order. Killing the node drops the queue and the batch in flight: a restart loads exactly
//! what was durable. An injected fsync failure fails that batch and every later commit (the
//! store fails stop, as after an fsync error nothing can be trusted) and asks the
//! supervisor to restart the process.
//!
//! Each change set made durable is appended to the history as it was applied
//! (`Event::Durable`): the checkers follow the disk from there.

use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};

use bigfleet_libvirt_domain::{ChangeSet, Snapshot};
use bigfleet_libvirt_ports::{StateStore, StoreError};
use futures::StreamExt;
use futures::channel::{mpsc, oneshot};

use crate::faults::StoreFaults;
use crate::history::Event;
use crate::rng::SimRng;
use crate::world::World;

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
            self.world.disk().apply(&changes);
            self.world.record(Event::Durable(changes));
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
