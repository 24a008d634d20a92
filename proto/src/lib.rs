//! The `bigfleet.v1alpha1` wire types and the generated `CapacityProvider` client and
//! server. Nothing here is hand-written logic beyond the `List` response codec (`wire`): conversions to domain types live in the
//! gRPC adapter (`bigfleet-libvirt-grpc`), so this crate stays a faithful mirror of the
//! upstream contract.

/// Generated messages, enums, client and server for package `bigfleet.v1alpha1` (under
/// `--cfg madsim`, the client and server are madsim-tonic's simulated ones).
pub mod v1alpha1 {
    #![allow(missing_docs, clippy::all, clippy::pedantic)]
    tonic::include_proto!("bigfleet.v1alpha1");
    // The server, from the manual definition in build.rs (same routes; List answers with
    // pre-encoded machines).
    #[cfg(not(madsim))]
    include!(concat!(
        env!("OUT_DIR"),
        "/bigfleet.v1alpha1.CapacityProvider.rs"
    ));
    // The simulation build: server and client from the same definition, for madsim-tonic
    // (messages travel as values over madsim's network; see build.rs).
    #[cfg(madsim)]
    include!(concat!(
        env!("OUT_DIR"),
        "/sim/bigfleet.v1alpha1.CapacityProvider.rs"
    ));
}

pub mod wire;

/// The encoded `FileDescriptorSet` of the contract, served by gRPC reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/bigfleet_descriptor.bin"));
