//! Adapters around the provider core: configuration loading, the fake hypervisor, the
//! in-memory store, the tonic gRPC service, the axum HTTP side server, telemetry, and the
//! composition root the `bigfleet-libvirt` binary (and the simulator) call.

pub mod accept;
pub mod app;
pub mod config;
pub mod doctor;
pub mod fake;
pub mod grpc;
pub mod http;
pub mod identity;
pub mod inspect;
pub mod instrumented;
pub mod launch;
pub mod libvirt;
pub mod metrics;
pub mod naming;
pub mod preflight;
pub mod process;
pub mod side_server;
pub mod store;
pub mod system;
pub mod telemetry;
pub mod tls;
