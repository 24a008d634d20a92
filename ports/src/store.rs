//! The `StateStore` port: durable fence marks, idempotency records, counters and machines.

use std::future::Future;

use bigfleet_libvirt_domain::{ChangeSet, Snapshot};

/// Why the store could not load or commit.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    /// The durable state cannot be read as this provider's state (corrupt, truncated,
    /// foreign or of an unknown schema version). Nothing was changed.
    #[error("state file {path} is unusable: {reason}")]
    Unusable {
        /// The file.
        path: String,
        /// What is wrong and what to do.
        reason: String,
    },
    /// Another process holds the state.
    #[error("state file {path} is in use by another bigfleet-libvirt process; stop it first")]
    Locked {
        /// The file.
        path: String,
    },
    /// An IO or engine failure while committing or loading.
    #[error("state store failure: {0}")]
    Io(String),
    /// The change set was not written because an earlier commit failed and it was decided
    /// on top of that one; once the earlier decision is taken back it may be decided again.
    #[error("state store failure: not written, an earlier commit failed: {0}")]
    AfterFailure(String),
}

/// Durable state.
///
/// Contract:
/// - `load` MUST return everything committed before the last stop (an empty [`Snapshot`] on
///   first boot) and MUST NOT modify the stored state.
/// - `commit` MUST take its place in the commit order at the moment it is *called* (the
///   provider calls it while it still holds its decision lock), MUST apply change sets in
///   that order, and MUST apply each change set atomically: all of it or none of it.
/// - The future `commit` returns MUST resolve only once the change set is durable to the
///   degree the store promises (the in-memory store: process lifetime; redb: fsync'd).
///   The provider acknowledges a call only after that.
/// - A store MAY share one durable write among many concurrent change sets (group commit),
///   provided each caller's future still resolves only after its own change set is durable.
/// - Applying every committed change set in order to an empty snapshot MUST give exactly the
///   snapshot `load` later returns.
/// - A commit that fails MUST leave the durable state as it was before its change set, and
///   the store MUST then fail every later change set without applying it until `resume` is
///   called: those were decided on top of the failed one (a store that tells them apart
///   answers them [`StoreError::AfterFailure`]). The provider calls `resume`,
///   under its decision lock, once it has taken the failed decisions back; change sets
///   committed after that are attempted afresh (a store MAY reopen its file to do so).
pub trait StateStore: Send + Sync + 'static {
    /// Loads the durable state.
    fn load(&self) -> impl Future<Output = Result<Snapshot, StoreError>> + Send;

    /// Enqueues `changes` now; the future resolves when they are durable.
    fn commit(
        &self,
        changes: ChangeSet,
    ) -> impl Future<Output = Result<(), StoreError>> + Send + 'static;

    /// Ends the refusal that follows a failed commit: the next change set is attempted
    /// again. Stores whose commits never fail, and stores that fail for good (the process
    /// is restarted instead), keep this default, which does nothing.
    fn resume(&self) {}
}
