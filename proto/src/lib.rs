//! The `bigfleet.v1alpha1` wire types and the generated `CapacityProvider` client and
//! server. Nothing here is hand-written logic beyond the `List` response codec (`wire`): conversions to domain types live in the
//! gRPC adapter (`bigfleet-libvirt-infra`), so this crate stays a faithful mirror of the
//! upstream contract.

/// Generated messages, enums, client and server for package `bigfleet.v1alpha1`.
pub mod v1alpha1 {
    #![allow(missing_docs, clippy::all, clippy::pedantic)]
    tonic::include_proto!("bigfleet.v1alpha1");
    // The server, from the manual definition in build.rs (same routes; List answers with
    // pre-encoded machines).
    include!(concat!(
        env!("OUT_DIR"),
        "/bigfleet.v1alpha1.CapacityProvider.rs"
    ));
}

pub mod wire;

/// The encoded `FileDescriptorSet` of the contract, served by gRPC reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/bigfleet_descriptor.bin"));
