//! Compensation for Creates that may have left a domain behind, and for Deletes that did
//! not finish.
//!
//! A Create that ends Failed leaves a Failed record without a host, and Failed is terminal:
//! nothing will ever Delete that machine. If the failed call may still have acted on the
//! host (its reply was lost, it reported a partial effect, it was cut off by its deadline,
//! or it succeeded too late), a domain can exist that the state does not know about. The
//! provider therefore issues a best-effort `delete` of that machine's domain: bounded
//! attempts, each under the Delete deadline, with exponential backoff on the `Clock` port.
//! `delete` is idempotent, so compensating a Create that in fact created nothing is
//! harmless. The same compensation runs at start-up for every Failed record without a host,
//! because a restart may have interrupted a Create or a compensation in flight.
//!
//! A Delete that ends Failed (an error, its deadline, a restart) keeps its host on the
//! record, as the contract says, and is as terminal: the shard asked for the machine to go
//! and will never ask again, so whatever the Delete did not remove yet (a running or stopped
//! domain, volumes whose domain is gone) would stay on the host for good. It gets the same
//! best-effort delete, and at start-up every Failed record with a host and no binding (only
//! a Delete fails that way) gets it again.

use std::sync::Arc;
use std::time::Duration;

use bigfleet_libvirt_domain::{Machine, OperationId};
use futures::FutureExt;
use tracing::{error, info, warn};

use crate::clock::Clock;
use crate::hypervisor::{DeleteRequest, Hypervisor};

/// How many compensating deletes are tried before giving up (the next start tries again).
pub(crate) const ATTEMPTS_MAX: u32 = 8;
/// The pause after the first failed attempt; it doubles up to [`BACKOFF_MAX`].
const BACKOFF_FIRST: Duration = Duration::from_secs(1);
/// The longest pause between two attempts.
const BACKOFF_MAX: Duration = Duration::from_secs(60);

/// Deletes `machine`'s domain, retrying with backoff; every attempt runs under `timeout`.
/// Returns whether a delete succeeded.
pub(crate) async fn delete_leftover<H: Hypervisor, C: Clock>(
    hypervisor: Arc<H>,
    clock: C,
    timeout: Duration,
    machine: Arc<Machine>,
    operation_id: OperationId,
) -> bool {
    let mut backoff = BACKOFF_FIRST;
    for attempt in 1..=ATTEMPTS_MAX {
        let request = DeleteRequest {
            machine: Arc::clone(&machine),
            operation_id: operation_id.clone(),
        };
        let deadline = clock.now().saturating_add(timeout);
        // Biased: a delete that finishes in the same instant as its deadline counts.
        let outcome = futures::select_biased! {
            outcome = hypervisor.delete(request).fuse() => outcome.map_err(|e| e.message),
            () = clock.sleep_until(deadline).fuse() => Err(format!("no answer within {timeout:?}")),
        };
        match outcome {
            Ok(()) => {
                info!(
                    attempt,
                    "compensating delete after a failed create or delete succeeded"
                );
                return true;
            }
            Err(message) => warn!(attempt, error = %message, "compensating delete failed"),
        }
        if attempt < ATTEMPTS_MAX {
            clock.sleep_until(clock.now().saturating_add(backoff)).await;
            backoff = (backoff * 2).min(BACKOFF_MAX);
        }
    }
    error!(
        attempts = ATTEMPTS_MAX,
        "gave up deleting what a failed create or delete may have left; the next start tries again"
    );
    false
}

#[cfg(test)]
mod tests;
