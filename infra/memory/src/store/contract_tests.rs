//! The in-memory store against the shared `StateStore` contract suites, and one
//! deliberately broken store per suite that the suite must reject (so each suite is known
//! to have teeth). The memory store's commits cannot fail, so the failure suite runs here
//! against a memory-backed store with a switchable fault, in a correct and a broken form.

use std::future::{Future, ready};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use bigfleet_libvirt_domain::{ChangeSet, Snapshot};
use bigfleet_libvirt_ports::testkit::{
    DiskFaults, state_store_concurrency_contract, state_store_contract,
    state_store_failure_contract,
};
use bigfleet_libvirt_ports::{StateStore, StoreError};

use super::MemoryStateStore;

#[tokio::test]
async fn memory_store_passes_the_state_store_contract() {
    state_store_contract(MemoryStateStore::new(), ready).await;
}

#[tokio::test]
async fn memory_store_passes_the_concurrency_contract() {
    state_store_concurrency_contract(MemoryStateStore::new(), ready).await;
}

/// A memory store that logs every change set; a reopen replays the log into a fresh store,
/// dropping the last `lose` change sets (0: a correct store).
#[derive(Clone, Default)]
struct Replayed {
    log: Arc<Mutex<Vec<ChangeSet>>>,
    inner: MemoryStateStore,
}

impl Replayed {
    fn reopen(self, lose: usize) -> Self {
        let log = self.log.lock().unwrap().clone();
        let keep = log.len().saturating_sub(lose);
        let inner = MemoryStateStore::new();
        for changes in &log[..keep] {
            drop(inner.commit(changes.clone()));
        }
        Self {
            log: Arc::new(Mutex::new(log[..keep].to_vec())),
            inner,
        }
    }
}

impl StateStore for Replayed {
    fn load(&self) -> impl Future<Output = Result<Snapshot, StoreError>> + Send {
        self.inner.load()
    }

    fn commit(
        &self,
        changes: ChangeSet,
    ) -> impl Future<Output = Result<(), StoreError>> + Send + 'static {
        self.log.lock().unwrap().push(changes.clone());
        self.inner.commit(changes)
    }
}

#[tokio::test]
async fn a_replayed_store_passes_the_reopen_contract() {
    state_store_contract(Replayed::default(), |s| ready(s.reopen(0))).await;
}

#[tokio::test]
#[should_panic(expected = "load after a reopen must equal the in-order application")]
async fn the_reopen_contract_rejects_a_store_that_drops_the_last_commit_on_reopen() {
    state_store_contract(Replayed::default(), |s| ready(s.reopen(1))).await;
}

/// A memory store that applies each even-numbered change set only after the next one
/// arrives, and resolves every commit at once: out of order, and acknowledged early.
#[derive(Clone, Default)]
struct Swapping {
    held: Arc<Mutex<Option<ChangeSet>>>,
    inner: MemoryStateStore,
}

impl StateStore for Swapping {
    fn load(&self) -> impl Future<Output = Result<Snapshot, StoreError>> + Send {
        self.inner.load()
    }

    fn commit(
        &self,
        changes: ChangeSet,
    ) -> impl Future<Output = Result<(), StoreError>> + Send + 'static {
        let mut held = self.held.lock().unwrap();
        match held.take() {
            None => *held = Some(changes),
            Some(earlier) => {
                drop(self.inner.commit(changes));
                drop(self.inner.commit(earlier));
            }
        }
        ready(Ok(()))
    }
}

#[tokio::test]
#[should_panic(expected = "load must show a prefix of the commit order")]
async fn the_concurrency_contract_rejects_a_store_that_reorders_and_acks_early() {
    state_store_concurrency_contract(Swapping::default(), ready).await;
}

/// A memory store whose disk can be broken: while broken every commit fails. After a
/// failure it refuses until `resume` (`forgets_refusal`: the bug of taking commits again as
/// soon as the disk is back).
#[derive(Clone)]
struct Faulty {
    inner: MemoryStateStore,
    broken: Arc<AtomicBool>,
    refusing: Arc<AtomicBool>,
    forgets_refusal: bool,
}

impl Faulty {
    fn new(forgets_refusal: bool) -> Self {
        Self {
            inner: MemoryStateStore::new(),
            broken: Arc::default(),
            refusing: Arc::default(),
            forgets_refusal,
        }
    }

    fn faults(&self) -> DiskFaults {
        let (down, up) = (Arc::clone(&self.broken), Arc::clone(&self.broken));
        DiskFaults {
            break_disk: Box::new(move || down.store(true, Ordering::SeqCst)),
            heal_disk: Box::new(move || up.store(false, Ordering::SeqCst)),
            resumes: true,
        }
    }
}

impl StateStore for Faulty {
    fn load(&self) -> impl Future<Output = Result<Snapshot, StoreError>> + Send {
        self.inner.load()
    }

    fn commit(
        &self,
        changes: ChangeSet,
    ) -> impl Future<Output = Result<(), StoreError>> + Send + 'static {
        let refusing = self.refusing.load(Ordering::SeqCst) && !self.forgets_refusal;
        if refusing {
            return ready(Err(StoreError::AfterFailure("disk broke".to_owned())));
        }
        if self.broken.load(Ordering::SeqCst) {
            self.refusing.store(true, Ordering::SeqCst);
            return ready(Err(StoreError::Io("injected: disk broken".to_owned())));
        }
        drop(self.inner.commit(changes));
        ready(Ok(()))
    }

    fn resume(&self) {
        self.refusing.store(false, Ordering::SeqCst);
    }
}

#[tokio::test]
async fn a_store_that_refuses_until_resume_passes_the_failure_contract() {
    let store = Faulty::new(false);
    let faults = store.faults();
    state_store_failure_contract(store, ready, faults).await;
}

#[tokio::test]
#[should_panic(expected = "must not end the refusal before resume")]
async fn the_failure_contract_rejects_a_store_that_forgets_its_refusal() {
    let store = Faulty::new(true);
    let faults = store.faults();
    state_store_failure_contract(store, ready, faults).await;
}
