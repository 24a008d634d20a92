//! The read paths: Get and List answer once the decisions they reflect are durable, and no
//! later: a Get waits for the newest decision on its machine, a List for the newest decision
//! that moved the revision it returns, never for decisions on other machines that its answer
//! does not show. When what they waited for is rewound by a failed commit they answer from
//! the last durable state instead, at once.

use std::sync::Arc;

use bigfleet_libvirt_domain::{ListPage, ListQuery, Machine, MachineId};

use super::{Guarded, Provider};
use crate::clock::Clock;
use crate::hypervisor::Hypervisor;
use crate::spawn::Spawner;
use crate::store::{StateStore, StoreError};

impl<H: Hypervisor, S: StateStore, C: Clock, E: Spawner> Provider<H, S, C, E> {
    /// One machine by id, once the newest decision on it is durable: the record a Get shows
    /// is the one that decision wrote, so decisions on other machines are not waited for.
    ///
    /// # Errors
    /// When the state it reflects could not be persisted.
    pub async fn get(&self, id: &str) -> Result<Option<Arc<Machine>>, StoreError> {
        let machine = MachineId::new(id).ok();
        self.read(
            |guarded| guarded.core.get(id),
            |guarded| {
                let machine = machine.as_ref()?;
                guarded.machine_commits.get(machine).copied()
            },
        )
        .await
    }

    /// The machines a List call returns, once the revision it returns is durable, and with it
    /// every record it shows (so a cursor handed out is never ahead of what a restart
    /// reloads): it waits for the newest decision that moved the revision, not for later
    /// ones that wrote no record (fence marks and idempotency records alone). A capped call
    /// continues where the previous capped call stopped (see [`ListRotation`](bigfleet_libvirt_domain::ListRotation)); the step happens
    /// under the lock, so concurrent capped pickers get different machines.
    ///
    /// # Errors
    /// When the state it reflects could not be persisted.
    pub async fn list(&self, query: &ListQuery) -> Result<ListPage, StoreError> {
        self.read(
            |guarded| {
                let Guarded { core, rotation, .. } = guarded;
                core.list_rotating(query, rotation)
            },
            |guarded| guarded.revision_commit,
        )
        .await
    }

    /// Answers a read once the pending change set `reflects` names (a place in the commit
    /// order, looked up in the same critical section as the answer) is durable; at once when
    /// it names none or one already durable. When that change set fails, the answer is
    /// looked up again from the last durable state: at once, by looking past the decisions
    /// still waiting for the store (rewound for the look and redone right after), so reads
    /// never wait on a disk that keeps failing.
    async fn read<T>(
        &self,
        mut look: impl FnMut(&mut Guarded) -> T,
        reflects: impl FnOnce(&Guarded) -> Option<u64>,
    ) -> Result<T, StoreError> {
        let (answer, durable) = {
            let mut guarded = self.lock();
            let answer = look(&mut guarded);
            let durable = reflects(&guarded).and_then(|seq| guarded.pending_barrier(seq));
            (answer, durable)
        };
        let Some(durable) = durable else {
            return Ok(answer);
        };
        let durable = durable.await;
        let mut guarded = self.lock();
        self.settle_locked(&mut guarded);
        if durable.is_ok() {
            return Ok(answer);
        }
        let mut redos = Vec::with_capacity(guarded.pending.len());
        for index in (0..guarded.pending.len()).rev() {
            let savepoint = std::mem::take(&mut guarded.pending[index].savepoint);
            redos.push(guarded.core.rewind(savepoint));
        }
        let answer = look(&mut guarded);
        for (index, redo) in redos.into_iter().rev().enumerate() {
            guarded.pending[index].savepoint = guarded.core.rewind(redo);
        }
        Ok(answer)
    }
}
