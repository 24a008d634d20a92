//! [`reconcile_every`]: the background reconcile pass, the one loop the binary (`serve`)
//! and the simulator both run, each on its own clock.

use std::time::Duration;

use bigfleet_libvirt_domain::{ReconcileReport, Timestamp};
use bigfleet_libvirt_ports::{Clock, Hypervisor, Provider, ReconcileError, Spawner, StateStore};

/// The background reconcile pass: one interval after start-up (as the reference does) and
/// every interval after that, each outcome handed to `after`. The binary logs and counts
/// outcomes; the simulator traces them. Both run this same loop on their own clock.
pub async fn reconcile_every<H: Hypervisor, S: StateStore, C: Clock, E: Spawner>(
    provider: Provider<H, S, C, E>,
    interval: Duration,
    mut after: impl FnMut(&Result<ReconcileReport, ReconcileError>),
) {
    loop {
        let next: Timestamp = provider.now().saturating_add(interval);
        provider.sleep_until(next).await;
        after(&provider.reconcile().await);
    }
}
