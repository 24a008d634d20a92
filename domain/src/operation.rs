//! Transition kinds and operation ids.
//!
//! Idempotency is keyed on (machine, kind) rather than (machine, target state) because
//! Create and Drain share the target Idle (docs/contract.md §4).

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::machine::MachineState;

/// The four mutating calls. Discriminants are persisted; never renumber.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Kind {
    /// Speculative → Creating → Idle.
    Create = 1,
    /// Idle → Configuring → Configured.
    Configure = 2,
    /// Configured → Draining → Idle.
    Drain = 3,
    /// Idle → Deleting → Speculative.
    Delete = 4,
}

impl Kind {
    /// Every kind, in persisted order.
    pub const ALL: [Self; 4] = [Self::Create, Self::Configure, Self::Drain, Self::Delete];

    /// The lower-case name used in messages and state files.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::Create => "create",
            Self::Configure => "configure",
            Self::Drain => "drain",
            Self::Delete => "delete",
        }
    }

    /// The only state a call of this kind may start from.
    #[must_use]
    pub fn source(self) -> MachineState {
        match self {
            Self::Create => MachineState::Speculative,
            Self::Configure | Self::Delete => MachineState::Idle,
            Self::Drain => MachineState::Configured,
        }
    }

    /// The transitional state an accepted call enters.
    #[must_use]
    pub fn transitional(self) -> MachineState {
        match self {
            Self::Create => MachineState::Creating,
            Self::Configure => MachineState::Configuring,
            Self::Drain => MachineState::Draining,
            Self::Delete => MachineState::Deleting,
        }
    }

    /// The stable state a successful transition of this kind ends in.
    #[must_use]
    pub fn target(self) -> MachineState {
        match self {
            Self::Create | Self::Drain => MachineState::Idle,
            Self::Configure => MachineState::Configured,
            Self::Delete => MachineState::Speculative,
        }
    }

    /// Whether a recorded operation of this kind is reused while the machine is in `state`.
    #[must_use]
    pub fn reuses_in(self, state: MachineState) -> bool {
        state == self.transitional() || state == self.target()
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// An operation id, `<prefix>-<n>` from one persisted server-wide counter.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct OperationId(String);

impl OperationId {
    /// Wraps an id read back from durable state.
    #[must_use]
    pub fn from_stored(id: String) -> Self {
        Self(id)
    }

    /// Mints the id for counter value `n`.
    #[must_use]
    pub(crate) fn mint(prefix: &str, n: u64) -> Self {
        Self(format!("{prefix}-{n}"))
    }

    /// The id as a string slice.
    #[must_use]
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for OperationId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}
