//! The transition runner: one accepted transition's hypervisor call under its deadline, and
//! its completion, committed until it is durable.

use std::sync::Arc;

use bigfleet_libvirt_domain::{
    Completion, CompletionOutcome, Dispatch, Kind, Machine, MachineState, Timestamp,
    TransitionResult,
};
use futures::FutureExt;
use tracing::{info, warn};

use super::{
    COMPLETION_RETRY_FIRST, COMPLETION_RETRY_MAX, Provider, TransitionEvent, duration_nanos,
};
use crate::clock::Clock;
use crate::hypervisor::{
    BootstrapBlob, ConfigureRequest, CreateRequest, DeleteRequest, DrainRequest, Hypervisor,
    HypervisorError, ReadinessRequest, SideEffects,
};
use crate::spawn::Spawner;
use crate::store::StateStore;

impl<H: Hypervisor, S: StateStore, C: Clock, E: Spawner> Provider<H, S, C, E> {
    /// Runs one accepted transition to completion or to its deadline.
    pub(super) async fn run(self, dispatch: Dispatch, blob: BootstrapBlob) {
        let deadline = self.inner.clock.sleep_until(dispatch.deadline);
        // Biased: when the call finishes in the same instant as the deadline, take the
        // result; the core still turns a success at or after the deadline into a timeout.
        // A worker that only gets to start at or after its deadline (a commit slower than
        // the deadline) does not touch the host.
        let (result, may_have_acted) = if self.inner.clock.now() >= dispatch.deadline {
            (TransitionResult::TimedOut, false)
        } else {
            futures::select_biased! {
            outcome = self.call(&dispatch, blob).fuse() => match outcome {
                Ok(result) => (result, true),
                Err(e) => (TransitionResult::Failed(e.message), e.side_effects != SideEffects::None),
            },
            // A call cut off by its deadline may still have acted on the host.
            () = deadline.fuse() => (TransitionResult::TimedOut, true),
            }
        };
        let ended = self.finish(&dispatch, result).await;
        let failed = ended.is_some_and(|m| m.state == MachineState::Failed);
        // A failed Create that may have acted may have left a domain the state does not
        // know; a failed Delete, whatever it did, leaves a Failed record nothing will ever
        // Delete again, while its shard asked for the machine to go: both are cleaned up.
        let leaves = match dispatch.kind {
            Kind::Create => may_have_acted,
            Kind::Delete => true,
            Kind::Configure | Kind::Drain => false,
        };
        if leaves && failed {
            self.compensate(Arc::clone(&dispatch.machine), dispatch.operation_id.clone());
        }
    }

    async fn call(
        &self,
        dispatch: &Dispatch,
        blob: BootstrapBlob,
    ) -> Result<TransitionResult, HypervisorError> {
        let hv = &self.inner.hypervisor;
        let machine = Arc::clone(&dispatch.machine);
        let operation_id = dispatch.operation_id.clone();
        match dispatch.kind {
            Kind::Create => hv
                .create(CreateRequest {
                    machine,
                    operation_id,
                })
                .await
                .map(|c| TransitionResult::Created {
                    host: c.host,
                    resources: c.resources,
                    allocatable: c.allocatable,
                }),
            Kind::Configure => self.configure(machine, operation_id, blob).await,
            Kind::Drain => {
                let grace_period_seconds = dispatch.grace_period_seconds;
                let request = DrainRequest {
                    machine,
                    grace_period_seconds,
                    operation_id,
                };
                if cfg!(feature = "bug-drain-skips-the-host") {
                    Ok(TransitionResult::Drained)
                } else {
                    hv.drain(request).await.map(|()| TransitionResult::Drained)
                }
            }
            Kind::Delete => hv
                .delete(DeleteRequest {
                    machine,
                    operation_id,
                })
                .await
                .map(|()| TransitionResult::Deleted),
        }
    }

    async fn configure(
        &self,
        machine: Arc<Machine>,
        operation_id: bigfleet_libvirt_domain::OperationId,
        blob: BootstrapBlob,
    ) -> Result<TransitionResult, HypervisorError> {
        let hv = &self.inner.hypervisor;
        let cluster_id = machine.cluster.clone();
        let request = ConfigureRequest {
            machine: Arc::clone(&machine),
            cluster_id: cluster_id.clone(),
            bootstrap_blob: blob,
            operation_id: operation_id.clone(),
        };
        hv.configure(request).await?;
        let readiness = ReadinessRequest {
            machine,
            cluster_id,
            operation_id,
        };
        hv.confirm_node_ready(readiness)
            .await
            .map_err(|e| HypervisorError {
                message: format!("node readiness: {}", e.message),
                ..e
            })?;
        Ok(TransitionResult::Configured)
    }

    /// Completes a transition; returns the machine as it ended, or `None` if the result was
    /// dropped.
    pub(super) async fn finish(
        &self,
        dispatch: &Dispatch,
        result: TransitionResult,
    ) -> Option<Arc<Machine>> {
        let now = self.inner.clock.now();
        let completion = Completion {
            machine_id: dispatch.machine.id.clone(),
            kind: dispatch.kind,
            operation_id: dispatch.operation_id.clone(),
            result,
        };
        let outcome = self.commit_completion(dispatch, &completion, now).await;
        let accepted_at = dispatch
            .deadline
            .0
            .saturating_sub(duration_nanos(dispatch.timeout));
        let elapsed = now.saturating_since(Timestamp(accepted_at));
        let machine = match outcome {
            CompletionOutcome::Applied(machine) => {
                if machine.state == MachineState::Failed {
                    warn!(error = %machine.last_error, "transition failed");
                    self.inner.hypervisor.failed(&machine);
                } else {
                    info!(state = %machine.state, "transition completed");
                }
                Some(machine)
            }
            CompletionOutcome::Dropped => {
                info!("transition result dropped: the machine moved on");
                None
            }
        };
        record_outcome(machine.as_deref());
        self.notify(&TransitionEvent {
            kind: dispatch.kind,
            machine: machine.clone(),
            elapsed,
        });
        machine
    }

    /// Applies a transition's completion and commits it, again and again until the store
    /// takes it: a completion that cannot be committed is rewound with the rest and
    /// committed again (with the same `now`, so a retry never turns a success into a
    /// timeout), since the transition happened and a restart must not lose it.
    async fn commit_completion(
        &self,
        dispatch: &Dispatch,
        completion: &Completion,
        now: Timestamp,
    ) -> CompletionOutcome {
        let mut backoff = COMPLETION_RETRY_FIRST;
        loop {
            let (outcome, durable) = {
                let mut guarded = self.lock();
                self.settle_locked(&mut guarded);
                let ((outcome, changes), savepoint) = guarded
                    .core
                    .with_savepoint(|c| c.complete(completion.clone(), now));
                (outcome, self.enqueue(&mut guarded, changes, savepoint))
            };
            let durable = durable.await;
            self.settle();
            match durable {
                Ok(()) => {
                    let entry = (
                        dispatch.deadline,
                        dispatch.machine.id.clone(),
                        dispatch.kind,
                    );
                    self.lock().deadlines.remove(&entry);
                    return outcome;
                }
                Err(e) => {
                    warn!(error = %e, retry_in = ?backoff, "transition outcome not persisted yet");
                    let retry_at = self.inner.clock.now().saturating_add(backoff);
                    self.inner.clock.sleep_until(retry_at).await;
                    backoff = (backoff * 2).min(COMPLETION_RETRY_MAX);
                }
            }
        }
    }

    /// Tells every observer about a finished transition.
    fn notify(&self, event: &TransitionEvent) {
        for observer in &self.inner.observers {
            observer(event);
        }
    }
}

/// Records how the transition ended on its span (the worker's, or the sweep's for an
/// overdue one; `finish` runs in it): `outcome`, and an error status when it failed.
fn record_outcome(machine: Option<&Machine>) {
    let span = tracing::Span::current();
    match machine {
        Some(m) if m.state == MachineState::Failed => {
            span.record("outcome", "failed");
            span.record("otel.status_code", "ERROR");
            span.record("otel.status_description", m.last_error.as_str());
        }
        Some(_) => {
            span.record("outcome", "succeeded");
        }
        None => {
            span.record("outcome", "dropped");
        }
    }
}
