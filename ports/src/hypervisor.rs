//! The `Hypervisor` port: what the provider asks of a set of libvirt hosts (or of the fake).
//!
//! Calls are written as if synchronous; the provider runs each under the transition's
//! deadline and drops the future when the deadline passes, so an adapter MUST NOT leave
//! shared state inconsistent when its future is dropped mid-call.

use std::fmt;
use std::future::Future;
use std::sync::Arc;

use bigfleet_libvirt_domain::{HostRef, Machine, OperationId, StringMap};

/// What a failed call may already have done to the host.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SideEffects {
    /// Nothing happened.
    None,
    /// Something may have happened (for example the reply was lost after dispatch).
    Unknown,
    /// The effect happened even though the call reports failure.
    Applied,
}

/// A failed hypervisor call, classified by what it may already have done.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct HypervisorError {
    /// What went wrong, in words an operator can act on. Becomes `last_error`.
    pub message: String,
    /// What the call may have done.
    pub side_effects: SideEffects,
}

impl HypervisorError {
    /// A failure that changed nothing and will fail again if retried as is.
    #[must_use]
    pub fn permanent(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            side_effects: SideEffects::None,
        }
    }

    /// A failure whose effect on the host is unknown.
    #[must_use]
    pub fn indefinite(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            side_effects: SideEffects::Unknown,
        }
    }
}

/// The opaque bootstrap blob. It is never logged, persisted or echoed: `Debug` prints only
/// its length.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct BootstrapBlob(Vec<u8>);

impl BootstrapBlob {
    /// Wraps the bytes a Configure call carried.
    #[must_use]
    pub fn new(bytes: Vec<u8>) -> Self {
        Self(bytes)
    }

    /// The bytes, for delivery into the guest only.
    #[must_use]
    pub fn expose(&self) -> &[u8] {
        &self.0
    }
}

impl fmt::Debug for BootstrapBlob {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "BootstrapBlob(<{} bytes redacted>)", self.0.len())
    }
}

/// Create the machine on its zone's host.
#[derive(Clone, Debug)]
pub struct CreateRequest {
    /// The record as accepted (Creating).
    pub machine: Arc<Machine>,
    /// Stable across retries of this operation: the hypervisor's idempotency token.
    pub operation_id: OperationId,
}

/// What a successful Create reports.
#[derive(Clone, Debug, PartialEq)]
pub struct Created {
    /// Where the machine runs; MUST be set.
    pub host: HostRef,
    /// Replacement resources, if the host knows better.
    pub resources: Option<StringMap>,
    /// Replacement allocatable, if the host knows better.
    pub allocatable: Option<StringMap>,
}

/// Bootstrap the machine into a cluster.
#[derive(Clone, Debug)]
pub struct ConfigureRequest {
    /// The record as accepted (Configuring, with cluster and metadata attached).
    pub machine: Arc<Machine>,
    /// The cluster to join.
    pub cluster_id: String,
    /// The opaque bootstrap blob.
    pub bootstrap_blob: BootstrapBlob,
    /// The operation id.
    pub operation_id: OperationId,
}

/// Wait until the configured machine's node is Ready in its cluster.
#[derive(Clone, Debug)]
pub struct ReadinessRequest {
    /// The record (still Configuring).
    pub machine: Arc<Machine>,
    /// The cluster it joined.
    pub cluster_id: String,
    /// The operation id.
    pub operation_id: OperationId,
}

/// Drain the machine out of its cluster.
#[derive(Clone, Debug)]
pub struct DrainRequest {
    /// The record as accepted (Draining).
    pub machine: Arc<Machine>,
    /// The kubelet grace period; values ≤ 0 are the adapter's to interpret.
    pub grace_period_seconds: i64,
    /// The operation id.
    pub operation_id: OperationId,
}

/// Destroy the machine and its volumes.
#[derive(Clone, Debug)]
pub struct DeleteRequest {
    /// The record as accepted (Deleting, host still set). A compensating delete after a
    /// failed Create passes that Create's record, which has no host: the adapter MUST then
    /// look on the host of the machine's zone for the domain named after the machine id.
    pub machine: Arc<Machine>,
    /// The operation id.
    pub operation_id: OperationId,
}

/// A set of hosts that can run machines.
///
/// Contract:
/// - `describe` MUST report substrate truth only: Speculative records (no host) for open
///   slots and Idle records (host set) for machines it runs, each passing the domain's
///   field-shape validation. It is called to seed an empty store and by reconcile.
/// - `create` MUST be idempotent per operation id: a retry with the same id adopts what an
///   earlier attempt made and never creates a second machine. On failure it MUST roll back
///   only what this attempt created. On success it MUST return a set host.
/// - `configure` MUST deliver the blob without logging or persisting it, and MUST report
///   success only if the bootstrap hook exited 0.
/// - `confirm_node_ready` MUST return only once the node is Ready in `cluster_id` (or fail);
///   adapters that cannot observe readiness return at once and say so in `readiness_gate`.
/// - `drain` and `delete` MUST be idempotent; `delete` of a machine that is already gone
///   MUST succeed and still clean its volumes.
/// - Every call MUST tolerate its future being dropped at the deadline.
/// - `restored` is told, once the provider has started and before it serves, the machines
///   its durable state holds; an adapter that keeps its own view of what should be running
///   takes it from there, one that keeps none ignores it (the default).
/// - `failed` is told each record that goes Failed while the provider runs (once its
///   completion is durable), so an adapter that holds room for open slots can let a dead
///   slot's room go.
pub trait Hypervisor: Send + Sync + 'static {
    /// The substrate's view of every slot and machine this provider owns.
    fn describe(&self) -> impl Future<Output = Result<Vec<Machine>, HypervisorError>> + Send;

    /// Creates (or adopts) the machine.
    fn create(
        &self,
        request: CreateRequest,
    ) -> impl Future<Output = Result<Created, HypervisorError>> + Send;

    /// Bootstraps the machine into its cluster.
    fn configure(
        &self,
        request: ConfigureRequest,
    ) -> impl Future<Output = Result<(), HypervisorError>> + Send;

    /// Waits for the node to be Ready; the default accepts at once (no gate).
    fn confirm_node_ready(
        &self,
        request: ReadinessRequest,
    ) -> impl Future<Output = Result<(), HypervisorError>> + Send {
        let _ = request;
        async { Ok(()) }
    }

    /// Whether `confirm_node_ready` really observes node readiness.
    fn readiness_gate(&self) -> bool {
        false
    }

    /// Drains the machine's node.
    fn drain(
        &self,
        request: DrainRequest,
    ) -> impl Future<Output = Result<(), HypervisorError>> + Send;

    /// Destroys the machine and its volumes.
    fn delete(
        &self,
        request: DeleteRequest,
    ) -> impl Future<Output = Result<(), HypervisorError>> + Send;

    /// The restore hand-off: the machines the provider started with (seeded or restored),
    /// given back once before serving. The default keeps nothing.
    fn restored(&self, machines: &[Arc<Machine>]) {
        let _ = machines;
    }

    /// A record went Failed. Failed is terminal, so nothing will Create that slot again: an
    /// adapter that fits slots onto limited capacity (`describe` withholding what does not
    /// fit) stops holding room for it. Records already Failed at start-up come through
    /// `restored`. The default keeps nothing.
    fn failed(&self, machine: &Machine) {
        let _ = machine;
    }
}
