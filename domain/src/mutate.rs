//! The mutating calls: requests, acknowledgements and rejections.

use std::sync::Arc;
use std::time::Duration;

use crate::changes::ChangeSet;
use crate::echo::{Echo, MAX_ID_BYTES};
use crate::fence::{FenceKey, FenceMark, FenceToken};
use crate::machine::{Machine, MachineState, StringMap, Timestamp};
use crate::operation::{Kind, OperationId};

/// What the caller asks for, beyond the machine id and token.
#[derive(Clone, Debug, PartialEq)]
pub enum MutateRequest {
    /// Create the machine on a host.
    Create,
    /// Bind it to `cluster`, attaching `shard_metadata` verbatim.
    Configure {
        /// The cluster id.
        cluster: String,
        /// Opaque shard metadata.
        shard_metadata: StringMap,
    },
    /// Drain it out of its cluster within the grace period (negative values pass through).
    Drain {
        /// The kubelet grace period in seconds.
        grace_period_seconds: i64,
    },
    /// Destroy it and return the slot to Speculative.
    Delete,
}

impl MutateRequest {
    /// The kind of transition this request asks for.
    #[must_use]
    pub fn kind(&self) -> Kind {
        match self {
            Self::Create => Kind::Create,
            Self::Configure { .. } => Kind::Configure,
            Self::Drain { .. } => Kind::Drain,
            Self::Delete => Kind::Delete,
        }
    }
}

/// A mutating call as the core sees it. The bootstrap blob never enters the core: it is
/// neither persisted nor part of any decision.
#[derive(Clone, Debug, PartialEq)]
pub struct Mutation {
    /// The machine id exactly as sent (may be empty: that is checked first).
    pub machine_id: String,
    /// The fencing token.
    pub token: FenceToken,
    /// The request.
    pub request: MutateRequest,
}

/// Work the caller must start after persisting an accepted transition.
#[derive(Clone, Debug, PartialEq)]
pub struct Dispatch {
    /// The transition kind.
    pub kind: Kind,
    /// Its operation id, handed to the hypervisor as an idempotency token.
    pub operation_id: OperationId,
    /// The record as accepted (already transitional, with the binding for Configure).
    pub machine: Arc<Machine>,
    /// When the transition times out.
    pub deadline: Timestamp,
    /// The deadline's length, for messages.
    pub timeout: Duration,
    /// The Drain grace period (0 for other kinds).
    pub grace_period_seconds: i64,
}

/// A successful answer to a mutating call.
#[derive(Clone, Debug, PartialEq)]
pub struct Ack {
    /// The operation id (the recorded one on an idempotent retry).
    pub operation_id: OperationId,
    /// The machine snapshot at acceptance.
    pub machine: Arc<Machine>,
    /// The transition to start; `None` for an idempotent retry.
    pub dispatch: Option<Dispatch>,
}

/// Why a mutating call is refused.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum MutateError {
    /// The machine id is empty.
    #[error("machine_id required")]
    MissingMachineId,
    /// A `machine_id` or `shard_id` is longer than [`MAX_ID_BYTES`].
    #[error("{field} is {length} bytes; at most {MAX_ID_BYTES} are accepted (use a shorter id)")]
    IdTooLong {
        /// `machine_id` or `shard_id`.
        field: &'static str,
        /// Its length in bytes.
        length: usize,
    },
    /// A Configure names no cluster.
    #[error("cluster_id required")]
    MissingClusterId,
    /// This pool cannot delete machines (bare metal).
    #[error("this provider does not support Delete (bare-metal free-pool semantics)")]
    DeleteUnsupported,
    /// The token is not strictly newer than the mark for (shard, machine).
    #[error(
        "stale fencing token ({}, {}) for shard {} on machine {}: the mark is ({}, {})",
        presented.epoch, presented.sequence, Echo(&key.shard_id), Echo(&key.machine_id),
        mark.epoch, mark.sequence
    )]
    Fenced {
        /// The (shard, machine) pair.
        key: FenceKey,
        /// The token's (epoch, sequence).
        presented: FenceMark,
        /// The current mark.
        mark: FenceMark,
    },
    /// No machine has this id.
    #[error("machine {} not found", Echo(machine_id))]
    NotFound {
        /// The id asked for.
        machine_id: String,
    },
    /// The machine is not in the state this call starts from.
    #[error("machine {} is {state}; {kind} requires {}", Echo(machine_id), kind.source())]
    OutOfPosition {
        /// The machine.
        machine_id: String,
        /// The call's kind.
        kind: Kind,
        /// The machine's current state.
        state: MachineState,
    },
}

/// The result of a mutating call and what must be persisted before answering. A rejection
/// may still carry changes: a passing token advances its mark before the not-found,
/// idempotency and position checks.
#[derive(Clone, Debug, PartialEq)]
pub struct MutateDecision {
    /// The answer.
    pub outcome: Result<Ack, MutateError>,
    /// What to persist before answering; `None` when nothing changed.
    pub changes: Option<ChangeSet>,
}
