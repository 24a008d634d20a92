//! The read paths: Get and List answer once what they reflect is durable, and from the last
//! durable state at once when what they observed was rewound by a failed commit.

use std::sync::Arc;

use bigfleet_libvirt_domain::{ListPage, ListQuery, Machine};

use super::{Guarded, Provider};
use crate::clock::Clock;
use crate::hypervisor::Hypervisor;
use crate::spawn::Spawner;
use crate::store::{StateStore, StoreError};

impl<H: Hypervisor, S: StateStore, C: Clock, E: Spawner> Provider<H, S, C, E> {
    /// One machine by id, once everything it may reflect is durable.
    ///
    /// # Errors
    /// When the state it reflects could not be persisted.
    pub async fn get(&self, id: &str) -> Result<Option<Arc<Machine>>, StoreError> {
        self.read(|guarded| guarded.core.get(id)).await
    }

    /// The machines a List call returns, once everything they may reflect is durable (so a
    /// cursor handed out is never ahead of what a restart reloads). A capped call continues
    /// where the previous capped call stopped (see [`ListRotation`](bigfleet_libvirt_domain::ListRotation)); the step happens under
    /// the lock, so concurrent capped pickers get different machines.
    ///
    /// # Errors
    /// When the state it reflects could not be persisted.
    pub async fn list(&self, query: &ListQuery) -> Result<ListPage, StoreError> {
        self.read(|guarded| {
            let Guarded { core, rotation, .. } = guarded;
            core.list_rotating(query, rotation)
        })
        .await
    }

    /// Answers a read once everything it may reflect is durable. When what it observed is
    /// rewound by a failed commit, it answers from the last durable state instead: at once,
    /// by looking past the decisions still waiting for the store (rewound for the look and
    /// redone right after), so reads never wait on a disk that keeps failing.
    async fn read<T>(&self, mut look: impl FnMut(&mut Guarded) -> T) -> Result<T, StoreError> {
        let (answer, durable) = {
            let mut guarded = self.lock();
            (look(&mut guarded), guarded.last_commit.clone())
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
