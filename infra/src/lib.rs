//! Adapters around the provider core: configuration loading, the fake hypervisor, the
//! in-memory store, the tonic gRPC service, the axum HTTP side server, telemetry, and the
//! composition root the `bigfleet-libvirt` binary (and the simulator) call.

pub mod config;
