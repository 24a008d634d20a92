//! The pure lifecycle core of bigfleet-libvirt.
//!
//! Everything the wire contract decides lives here: the eight machine states and twelve
//! edges, the exact processing order of a mutating call, fencing per (shard, machine),
//! idempotency per (machine, kind), transition deadlines, the cluster binding and
//! `shard_metadata`, List revisions and reconcile. The crate is synchronous and does no IO:
//! time arrives as a [`Timestamp`] argument and every decision returns the [`ChangeSet`] the
//! caller must persist before it acknowledges. That shape is what lets the same core run
//! under the real runtime, under deterministic simulation and in plain unit tests.
//!
//! The [`authorization`] module holds the table of who may call what under a client
//! identity (mTLS).
//!
//! The [`catalog`] module holds the other pure half: what the provider offers (instance
//! types, prices, capacity type, offerings) and the slot ids of the Speculative inventory
//! built from them.

pub mod authorization;
pub mod catalog;
mod changes;
mod core;
mod cursor;
mod echo;
mod fence;
mod list;
mod machine;
mod mutate;
mod operation;
mod read;
mod reconcile;
mod savepoint;
mod shared;
mod transitions;
mod validate;

pub use crate::changes::{ChangeSet, Snapshot};
pub use crate::core::{
    Completion, CompletionOutcome, Core, ListPage, ListQuery, ListRotation, Policy,
    ReconcileReport, SeedError, Timeouts, TransitionResult,
};
pub use crate::cursor::parse_cursor;
pub use crate::echo::{ECHO_BYTES, Echo, EchoField, MAX_ID_BYTES};
pub use crate::fence::{FenceKey, FenceMark, FenceToken};
pub use crate::machine::{
    CapacityType, Encoded, HostRef, Machine, MachineId, MachineIdError, MachineState, StringMap,
    Timestamp,
};
pub use crate::mutate::{Ack, Dispatch, MutateDecision, MutateError, MutateRequest, Mutation};
pub use crate::operation::{Kind, OperationId};
pub use crate::read::{GetIdError, check_get_id};
pub use crate::savepoint::Savepoint;
pub use crate::shared::{Interner, SharedMap};
pub use crate::validate::{InvalidMachine, validate_instance};
