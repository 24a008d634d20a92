//! The tonic adapter: proto ↔ domain conversion (`convert`), the one place gRPC status
//! codes are decided (`status`), and the `CapacityProvider` service itself (`service`).

pub mod convert;
pub mod service;
pub mod status;

pub use service::CapacityService;
