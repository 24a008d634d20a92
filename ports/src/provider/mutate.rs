//! The mutating paths: a call decided, its change set enqueued and its transition's worker
//! started in one critical section, then the wait for durability, and the call decided
//! again when the state it was decided on is rewound (`rewind.rs`); the reconcile pass; and
//! the probe commit readiness uses while the store refuses commits.

use bigfleet_libvirt_domain::{
    Ack, MutateDecision, Mutation, ReconcileReport, Savepoint, Timestamp,
};
use tracing::warn;

#[cfg(any(
    feature = "bug-ack-before-persist",
    feature = "bug-transition-after-commit"
))]
use super::rewind::settled;
use super::{Barrier, DECISIONS_MAX, Provider, ProviderError, ReconcileError};
use crate::clock::Clock;
use crate::hypervisor::{BootstrapBlob, Hypervisor};
use crate::spawn::Spawner;
use crate::store::{StateStore, StoreError};

impl<H: Hypervisor, S: StateStore, C: Clock, E: Spawner> Provider<H, S, C, E> {
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
}
