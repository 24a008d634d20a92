//! Starting the compensation: the best-effort delete of whatever a failed Create or a
//! failed Delete may have left on its host (the task itself is `compensation.rs`), and its
//! start-up half for the Creates and Deletes a restart interrupted.

use std::sync::Arc;

use bigfleet_libvirt_domain::{Kind, ListQuery, Machine, MachineState, OperationId};
use futures::FutureExt;
use tracing::{Instrument, info_span};

use super::Provider;
use crate::clock::Clock;
use crate::compensation;
use crate::hypervisor::Hypervisor;
use crate::spawn::Spawner;
use crate::store::StateStore;

impl<H: Hypervisor, S: StateStore, C: Clock, E: Spawner> Provider<H, S, C, E> {
    /// Start-up half of the compensation: a restart may have interrupted a Create (now
    /// Failed without a host), a Delete (now Failed with its host and no binding: a failed
    /// Configure or Drain keeps its cluster, and a Delete starts only from Idle, which has
    /// none) or a compensation in flight, so each such record gets its compensating delete
    /// again (idempotent when nothing is left).
    pub(super) fn compensate_failed(&self) {
        let failed = {
            let guarded = self.lock();
            let query = ListQuery {
                states: Some([MachineState::Failed].into()),
                ..ListQuery::default()
            };
            let page = guarded.core.list(&query);
            let kind = |m: &Machine| match (m.has_host(), m.cluster.is_empty()) {
                (false, _) => Some(Kind::Create),
                (true, true) => Some(Kind::Delete),
                (true, false) => None,
            };
            (page.machines.into_iter())
                .filter_map(|m| Some((guarded.core.operation(&m.id, kind(&m)?)?.clone(), m)))
                .collect::<Vec<_>>()
        };
        for (operation_id, machine) in failed {
            self.compensate(machine, operation_id);
        }
    }

    /// Starts the best-effort delete of whatever a failed Create or Delete may have left on
    /// its host (`compensation.rs`). The task holds the hypervisor and clock, not the provider.
    pub(super) fn compensate(&self, machine: Arc<Machine>, operation_id: OperationId) {
        if cfg!(feature = "bug-no-create-compensation") {
            return; // Injected bug (simulator bug hunt only): leak the domain.
        }
        if cfg!(feature = "bug-no-delete-compensation") && machine.has_host() {
            return; // Injected bug (simulator bug hunt only): leave a failed Delete's domain.
        }
        let timeout = self.lock().core.policy().timeouts.delete;
        let span = info_span!(
            "compensation",
            machine_id = %machine.id,
            operation_id = %operation_id,
        );
        let hypervisor = Arc::clone(&self.inner.hypervisor);
        let clock = self.inner.clock.clone();
        let task = compensation::delete_leftover(hypervisor, clock, timeout, machine, operation_id);
        self.inner
            .spawner
            .spawn("create-compensation", task.map(drop).instrument(span));
    }
}
