//! Machine records and their value types.
//!
//! A [`Machine`] is what the shard sees through Get and List. Its structural shape depends on
//! its state (docs/contract.md §2.1); [`Machine::assert_shape`] checks that shape before a
//! record is persisted and after it is loaded, because a record out of shape means the state
//! machine itself is broken and must not be written anywhere.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::shared::SharedMap;

/// A string-to-string map with deterministic iteration order (labels, resources, metadata).
pub type StringMap = BTreeMap<String, String>;

/// A point on the provider's clock, in nanoseconds on the Unix-epoch scale. Only the `Clock`
/// port makes these: monotonic within one process and never persisted, so it reads as a date
/// but is not the wall clock (see `ports::Clock`).
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
pub struct Timestamp(pub u64);

impl Timestamp {
    /// The timestamp `duration` after this one, saturating at the end of time.
    #[must_use]
    pub fn saturating_add(self, duration: Duration) -> Self {
        let nanos = u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX);
        Self(self.0.saturating_add(nanos))
    }

    /// The time from `earlier` to this timestamp, zero if `earlier` is later.
    #[must_use]
    pub fn saturating_since(self, earlier: Self) -> Duration {
        Duration::from_nanos(self.0.saturating_sub(earlier.0))
    }
}

/// A machine identifier: any non-empty string, opaque to the core.
///
/// Shared, not copied: the inventory's maps, the revision index and the stores all key by
/// the id, so a clone costs a reference count, not another string.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct MachineId(Arc<str>);

/// The only way a machine id can be malformed: it is empty.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("machine id is empty")]
pub struct MachineIdError;

impl MachineId {
    /// Wraps a non-empty string.
    ///
    /// # Errors
    /// [`MachineIdError`] when `id` is empty.
    pub fn new(id: impl Into<String>) -> Result<Self, MachineIdError> {
        let id = id.into();
        if id.is_empty() {
            Err(MachineIdError)
        } else {
            Ok(Self(Arc::from(id)))
        }
    }

    /// The id as a string slice.
    #[must_use]
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The smallest id in sort order, used only as a range bound.
    pub(crate) fn lowest() -> Self {
        Self(Arc::from(""))
    }
}

impl fmt::Display for MachineId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The lifecycle state of a machine. Discriminants are the wire numbers; never renumber.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum MachineState {
    /// A quota slot: no host, no cluster.
    Speculative = 1,
    /// Being created (Speculative → Idle).
    Creating = 2,
    /// Running on a host, not bound to a cluster.
    Idle = 3,
    /// Being bootstrapped into a cluster (Idle → Configured).
    Configuring = 4,
    /// Bound to a cluster.
    Configured = 5,
    /// Being drained out of its cluster (Configured → Idle).
    Draining = 6,
    /// Being destroyed (Idle → Speculative).
    Deleting = 7,
    /// The last transition failed; terminal pending cleanup.
    Failed = 8,
}

impl MachineState {
    /// Every state, in wire order.
    pub const ALL: [Self; 8] = [
        Self::Speculative,
        Self::Creating,
        Self::Idle,
        Self::Configuring,
        Self::Configured,
        Self::Draining,
        Self::Deleting,
        Self::Failed,
    ];

    /// The state with wire number `n`, if there is one (0 and unknown numbers have none).
    #[must_use]
    pub fn from_wire(n: i32) -> Option<Self> {
        Self::ALL.into_iter().find(|s| *s as i32 == n)
    }

    /// Whether this is one of the four transitional states.
    #[must_use]
    pub fn is_transitional(self) -> bool {
        matches!(
            self,
            Self::Creating | Self::Configuring | Self::Draining | Self::Deleting
        )
    }

    /// The state's name as operators read it (`Speculative`, `Creating`, …).
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::Speculative => "Speculative",
            Self::Creating => "Creating",
            Self::Idle => "Idle",
            Self::Configuring => "Configuring",
            Self::Configured => "Configured",
            Self::Draining => "Draining",
            Self::Deleting => "Deleting",
            Self::Failed => "Failed",
        }
    }
}

impl fmt::Display for MachineState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// How the shard may hold a machine. Discriminants are the wire numbers; never renumber.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum CapacityType {
    /// Invalid for any emitted machine.
    Unspecified = 0,
    /// A fixed free pool; held forever, no Delete.
    BareMetal = 1,
    /// Reserved capacity; held forever.
    Reserved = 2,
    /// Released after minutes idle.
    OnDemand = 3,
    /// Preemptible; requires an interruption probability above zero.
    Spot = 4,
}

impl CapacityType {
    /// The capacity type with wire number `n` (unknown numbers are `Unspecified`).
    #[must_use]
    pub fn from_wire(n: i32) -> Self {
        match n {
            1 => Self::BareMetal,
            2 => Self::Reserved,
            3 => Self::OnDemand,
            4 => Self::Spot,
            _ => Self::Unspecified,
        }
    }

    /// The token used in machine ids and state files (`OnDemand`, `BareMetal`, …).
    #[must_use]
    pub fn token(self) -> &'static str {
        match self {
            Self::Unspecified => "Unspecified",
            Self::BareMetal => "BareMetal",
            Self::Reserved => "Reserved",
            Self::OnDemand => "OnDemand",
            Self::Spot => "Spot",
        }
    }
}

/// Where a machine runs: the provider label and a substrate-scoped host reference.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostRef {
    /// The provider label (`--provider`).
    pub provider: String,
    /// The substrate reference, `<zone>/<domain>` for libvirt.
    pub reference: String,
}

impl HostRef {
    /// Whether the reference names a host at all (the wire treats an all-empty HostRef as
    /// absent).
    #[must_use]
    pub fn is_set(&self) -> bool {
        !self.provider.is_empty() || !self.reference.is_empty()
    }
}

/// One machine as the shard sees it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Machine {
    /// Stable, opaque identity.
    pub id: MachineId,
    /// Lifecycle state.
    pub state: MachineState,
    /// Host, absent while Speculative or Creating.
    pub host: Option<HostRef>,
    /// Instance type name, always set.
    pub instance_type: String,
    /// Zone (one libvirt host).
    pub zone: String,
    /// Capacity type, never `Unspecified` on an emitted record.
    pub capacity_type: CapacityType,
    /// USD per hour, finite and non-negative.
    pub price_per_hour: f64,
    /// Hourly interruption probability in [0, 1].
    pub interruption_probability: f64,
    /// Per-replica request shape the machine serves (shared with equal records).
    pub resources: SharedMap,
    /// Hardware capacity (shared with equal records).
    pub allocatable: SharedMap,
    /// Extra matching labels (shared with equal records).
    pub labels: SharedMap,
    /// Why the machine is Failed; empty otherwise.
    pub last_error: String,
    /// The bound cluster while Configuring, Configured or Draining.
    pub cluster: String,
    /// Opaque shard metadata, stored and echoed verbatim while bound.
    pub shard_metadata: StringMap,
    /// The record's encoding, memoised by the adapter that serialises it (see [`Encoded`]).
    #[serde(skip)]
    pub encoded: Encoded,
}

/// A memo of one version of a record's serialised form, so an adapter that answers many
/// reads (a full List of 100k machines) encodes each version once instead of per read.
///
/// The domain never reads it. Every change to a record empties it (changes go through one
/// place, which resets it after the edit), a clone starts empty, it never takes part in
/// equality, and it is never persisted.
#[derive(Default)]
pub struct Encoded(OnceLock<Arc<[u8]>>);

impl Encoded {
    /// The memoised bytes, computing them with `encode` on first use.
    pub fn get_or_init(&self, encode: impl FnOnce() -> Vec<u8>) -> Arc<[u8]> {
        Arc::clone(self.0.get_or_init(|| Arc::from(encode())))
    }

    /// Whether the bytes have been computed for this version.
    #[must_use]
    pub fn is_set(&self) -> bool {
        self.0.get().is_some()
    }

    /// Forgets the bytes: the record they encoded has changed.
    pub(crate) fn reset(&mut self) {
        self.0.take();
    }
}

impl Clone for Encoded {
    /// A clone is about to be edited or outlive this version: it starts empty.
    fn clone(&self) -> Self {
        Self::default()
    }
}

impl PartialEq for Encoded {
    /// Derived data: two records are equal by their fields alone.
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl fmt::Debug for Encoded {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.is_set() {
            "Encoded(set)"
        } else {
            "Encoded(empty)"
        })
    }
}

impl Machine {
    /// Whether the record has a host.
    #[must_use]
    pub fn has_host(&self) -> bool {
        self.host.as_ref().is_some_and(HostRef::is_set)
    }

    /// Describes how the record breaks the structural shape its state implies (docs/contract.md
    /// §2.1), or `None` when it is in shape.
    #[must_use]
    pub fn shape_violation(&self) -> Option<String> {
        let (id, state) = (&self.id, self.state);
        let unbound = self.cluster.is_empty() && self.shard_metadata.is_empty();
        let problem = match state {
            MachineState::Speculative | MachineState::Creating if self.has_host() => "has a host",
            MachineState::Speculative | MachineState::Creating if !unbound => "is bound",
            MachineState::Idle | MachineState::Deleting if !self.has_host() => "has no host",
            MachineState::Idle | MachineState::Deleting if !unbound => "is bound",
            MachineState::Configuring | MachineState::Configured | MachineState::Draining
                if !self.has_host() =>
            {
                "has no host"
            }
            MachineState::Configuring | MachineState::Configured | MachineState::Draining
                if self.cluster.is_empty() =>
            {
                "has no cluster"
            }
            MachineState::Failed if self.last_error.is_empty() => "has no last_error",
            s if s != MachineState::Failed && !self.last_error.is_empty() => "has a last_error",
            _ => return None,
        };
        Some(format!("machine {id} is {state} but {problem}"))
    }

    /// Asserts the structural shape the state implies. A violation is a bug in the state
    /// machine, so it panics rather than returning an error.
    ///
    /// # Panics
    /// When the record is out of shape for its state.
    pub fn assert_shape(&self) {
        if let Some(problem) = self.shape_violation() {
            panic!("state machine invariant broken: {problem}");
        }
    }
}
