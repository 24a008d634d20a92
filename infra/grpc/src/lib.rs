//! The tonic adapter: proto ↔ domain conversion (`convert`), the one place gRPC status
//! codes are decided (`status`), the `CapacityProvider` service itself (`service`), the
//! caller's mTLS identity and what it may call (`identity`), TLS on the gRPC port (`tls`),
//! the memory budget of List answers held for slow readers (`list_budget`) and how they are
//! streamed, with the send-progress deadline (`list_stream`), and the series the service
//! produces (`metrics`).

pub mod convert;
pub mod identity;
pub mod list_budget;
pub mod list_stream;
pub mod metrics;
pub mod service;
pub mod status;
pub mod tls;
pub mod trace_context;

pub use service::{CapacityService, ServiceSettings};
