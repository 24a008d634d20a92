//! The boundary of the provider: the port traits every adapter implements, and the
//! [`Provider`] service that drives the pure domain core through them.
//!
//! Ports use static dispatch (`impl Future + Send` in trait methods, no boxing) because
//! the provider is generic over its adapters; the binary and the simulator instantiate it
//! with different ones through the same composition root.

pub mod claims;
mod clock;
mod compensation;
mod domain_ref;
mod hypervisor;
pub mod lanes;
mod provider;
mod spawn;
pub mod spread;
pub mod steps;
mod store;
#[cfg(any(test, feature = "testkit"))]
pub mod testkit;

pub use crate::clock::Clock;
pub use crate::domain_ref::{DomainRef, DomainRefError};
pub use crate::hypervisor::{
    BootstrapBlob, ConfigureRequest, CreateRequest, Created, DeleteRequest, DrainRequest,
    Hypervisor, HypervisorError, ReadinessRequest, SideEffects,
};
pub use crate::provider::{
    Observer, Provider, ProviderConfig, ProviderError, ReconcileError, SWEEP_GRACE, StartError,
    StoreStatus, TransitionEvent,
};
pub use crate::spawn::Spawner;
pub use crate::store::{StateStore, StoreError};
