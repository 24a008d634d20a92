//! The deadline sweep: the provider's own guarantee that an accepted operation ends by its
//! deadline. Every accepted transition's deadline is recorded when it is decided (in the same
//! critical section that spawns its worker), and a background task owned by the provider
//! fails, as timed out, whatever is still in flight [`SWEEP_GRACE`] after its deadline,
//! whatever its worker did.
//!
//! A worker's `transition` span is opened in the accepting call's span, so it, and every
//! hypervisor call under it, is in that call's trace even though it runs after the answer;
//! `finish` records its `outcome` (and an error status when it failed) on it.

use std::sync::{Arc, Weak};

use bigfleet_libvirt_domain::{Dispatch, Kind, MachineState, Timestamp, TransitionResult};
use futures::future::BoxFuture;
use futures::{FutureExt, StreamExt};
use tracing::{Instrument, debug, info_span, warn};

use super::{Barrier, Guarded, Inner, Provider, SWEEP_GRACE};
use crate::clock::Clock;
use crate::hypervisor::{BootstrapBlob, Hypervisor};
use crate::spawn::Spawner;
use crate::store::StateStore;

impl<H: Hypervisor, S: StateStore, C: Clock, E: Spawner> Provider<H, S, C, E> {
    /// Records an accepted transition's deadline for the sweep and spawns its worker, under
    /// the lock that took the decision. The worker starts the hypervisor call once
    /// `durable` resolves; if the commit fails instead, the decision was taken back and the
    /// worker ends without acting (the caller, if still there, decides again).
    pub(super) fn start_transition(
        &self,
        guarded: &mut Guarded,
        dispatch: Dispatch,
        blob: BootstrapBlob,
        durable: Barrier,
    ) {
        let entry = (
            dispatch.deadline,
            dispatch.machine.id.clone(),
            dispatch.kind,
        );
        let earliest = guarded
            .deadlines
            .first_key_value()
            .is_none_or(|(first, _)| entry < *first);
        let provider = self.clone();
        // Injected bug (simulator bug hunt only): the span is opened in a new trace of its
        // own instead of in the accepting call's.
        #[cfg(feature = "bug-detached-transition-span")]
        let _detached = info_span!(parent: None, "detached").entered();
        let span = info_span!(
            "transition",
            kind = %dispatch.kind,
            machine_id = %dispatch.machine.id,
            operation_id = %dispatch.operation_id,
            zone = %dispatch.machine.zone,
            outcome = tracing::field::Empty,
            otel.status_code = tracing::field::Empty,
            otel.status_description = tracing::field::Empty,
        );
        guarded.deadlines.insert(entry, span.clone());
        if earliest {
            // Full means a wake-up is already pending; closed cannot happen while we exist.
            let _pending = self.inner.sweep_wake.clone().try_send(());
        }
        let task = async move {
            if let Err(error) = durable.await {
                debug!(%error, "decision taken back by a failed commit: transition not started");
                return;
            }
            provider.run(dispatch, blob).await;
        };
        self.inner
            .spawner
            .spawn("transition", task.instrument(span));
    }

    /// Fails, as timed out, every transition still in flight [`SWEEP_GRACE`] after its
    /// deadline: the guarantee that an accepted operation ends by its deadline does not rest
    /// on its worker (one that never started, or hung, is caught here). Returns when the
    /// next sweep is due (`None`: nothing in flight).
    pub(super) async fn expire_overdue(&self) -> Option<Timestamp> {
        let now = self.inner.clock.now();
        let due = {
            let mut guarded = self.lock();
            let mut due = Vec::new();
            while let Some(((deadline, ..), _)) = guarded.deadlines.first_key_value() {
                if deadline.saturating_add(SWEEP_GRACE) > now {
                    break;
                }
                let Some(((_, id, _), span)) = guarded.deadlines.pop_first() else {
                    break;
                };
                due.extend(
                    guarded
                        .core
                        .overdue(&id, now)
                        .map(|dispatch| (dispatch, span)),
                );
            }
            due
        };
        // Each is failed inside its own transition's span: the caller's trace shows it.
        for (dispatch, span) in due {
            async {
                warn!(
                    deadline_passed_by = ?now.saturating_since(dispatch.deadline),
                    "no result from the transition's worker by its deadline: failing it"
                );
                let ended = self.finish(&dispatch, TransitionResult::TimedOut).await;
                let failed = ended.is_some_and(|m| m.state == MachineState::Failed);
                if dispatch.kind == Kind::Create && failed {
                    // Whatever the worker did on the host is unknown.
                    self.compensate(Arc::clone(&dispatch.machine), dispatch.operation_id.clone());
                }
            }
            .instrument(span)
            .await;
        }
        let guarded = self.lock();
        guarded
            .deadlines
            .first_key_value()
            .map(|((deadline, ..), _)| deadline.saturating_add(SWEEP_GRACE))
    }
}

/// The deadline sweep: runs while the provider exists (it holds it only while sweeping),
/// waking at the next deadline past its grace or when an earlier one is recorded.
pub(super) async fn sweep_deadlines<H: Hypervisor, S: StateStore, C: Clock, E: Spawner>(
    provider: Weak<Inner<H, S, C, E>>,
    mut woken: futures::channel::mpsc::Receiver<()>,
) {
    // A wake-up time the clock's timer already fired for without the clock reaching it (a
    // test clock whose timers fire at once): not slept for again until something new is
    // recorded, so such a clock cannot turn the sweep into a busy loop.
    let mut fired: Option<Timestamp> = None;
    loop {
        let (next, clock) = {
            let Some(inner) = provider.upgrade() else {
                return;
            };
            let clock = inner.clock.clone();
            (Provider { inner }.expire_overdue().await, clock)
        };
        let sleep: BoxFuture<'static, ()> = match next {
            Some(at) if fired != Some(at) => Box::pin(clock.sleep_until(at)),
            _ => Box::pin(std::future::pending()),
        };
        futures::select_biased! {
            wake = woken.next() => {
                if wake.is_none() {
                    return;
                }
                fired = None;
            },
            () = sleep.fuse() => fired = next,
        }
    }
}
