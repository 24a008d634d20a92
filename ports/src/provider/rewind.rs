//! The failed-commit rewind: every decision is enqueued with its savepoint, and when the
//! store reports a failure every decision not yet durable is taken back, newest first, so
//! the core serves the last durable state again, and the store is told to resume.

use bigfleet_libvirt_domain::{ChangeSet, MachineId, Savepoint};
use futures::FutureExt;
use futures::future::BoxFuture;
use tracing::{debug, error, info};

use super::{Barrier, Guarded, Pending, Provider};
use crate::clock::Clock;
use crate::hypervisor::Hypervisor;
use crate::spawn::Spawner;
use crate::store::{StateStore, StoreError};

impl<H: Hypervisor, S: StateStore, C: Clock, E: Spawner> Provider<H, S, C, E> {
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
    pub(super) fn enqueue(
        &self,
        guarded: &mut Guarded,
        changes: Option<ChangeSet>,
        savepoint: Savepoint,
    ) -> Barrier {
        if let Some(changes) = changes {
            let seq = guarded.next_seq;
            guarded.next_seq += 1;
            let machines: Vec<MachineId> = changes.machines.iter().map(|m| m.id.clone()).collect();
            for id in &machines {
                guarded.machine_commits.insert(id.clone(), seq);
            }
            if !machines.is_empty() {
                guarded.revision_commit = Some(seq);
            }
            let commit: BoxFuture<'static, _> = Box::pin(self.inner.store.commit(changes));
            guarded.last_commit = commit.shared();
            guarded.pending.push_back(Pending {
                seq,
                barrier: guarded.last_commit.clone(),
                savepoint,
                machines,
            });
        }
        guarded.last_commit.clone()
    }

    /// [`Self::settle_locked`] under the lock.
    pub(super) fn settle(&self) {
        let mut guarded = self.lock();
        self.settle_locked(&mut guarded);
    }

    /// Forgets the savepoints of decisions the store confirmed, oldest first. At the first
    /// failure reported, every decision not yet durable is rewound, newest first: the store
    /// confirms in order and refuses everything after a failure, so none of them can still
    /// become durable, and the core is back at the last durable state. Then the store may
    /// attempt the next change set afresh.
    pub(super) fn settle_locked(&self, guarded: &mut Guarded) {
        while let Some(front) = guarded.pending.front() {
            match front.barrier.clone().now_or_never() {
                None => return,
                Some(Ok(())) => {
                    if let Some(done) = guarded.pending.pop_front() {
                        guarded.confirmed(&done);
                    }
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
                    guarded.machine_commits.clear();
                    guarded.revision_commit = None;
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
}

/// A barrier that is already resolved.
pub(super) fn settled() -> Barrier {
    let ready: BoxFuture<'static, Result<(), StoreError>> = Box::pin(std::future::ready(Ok(())));
    ready.shared()
}
