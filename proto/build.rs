//! Compiles `bigfleet/v1alpha1/provider.proto` with protox (pure Rust, so no `protoc` is
//! needed on the build machine) and hands the descriptor set to tonic-prost-build for the
//! messages and the client. The same encoded descriptor set is written next to the
//! generated code for gRPC reflection.
//!
//! The server side is generated from a manual definition of the same service (package,
//! service and method names, so the routes are identical) because `List` answers with
//! [`EncodedMachineList`](crate::wire::EncodedMachineList): machines the provider has
//! already encoded once, spliced into the response by [`ListCodec`](crate::wire::ListCodec)
//! so a full List does not rebuild and re-encode every record. The bytes on the wire are
//! those of `MachineList` (`proto/tests/wire.rs` proves it).

use tonic_build::manual::{Builder, Method, Service};

const PROST: &str = "tonic_prost::ProstCodec";

fn method(name: &str, route: &str, input: &str, output: &str, codec: &str) -> Method {
    Method::builder()
        .name(name)
        .route_name(route)
        .input_type(format!("crate::v1alpha1::{input}"))
        .output_type(output)
        .codec_path(codec)
        .build()
}

fn server() -> Service {
    let ack = "crate::v1alpha1::TransitionAck";
    Service::builder()
        .name("CapacityProvider")
        .package("bigfleet.v1alpha1")
        .method(method("create", "Create", "CreateRequest", ack, PROST))
        .method(method(
            "configure",
            "Configure",
            "ConfigureRequest",
            ack,
            PROST,
        ))
        .method(method("drain", "Drain", "DrainRequest", ack, PROST))
        .method(method("delete", "Delete", "DeleteRequest", ack, PROST))
        .method(method(
            "get",
            "Get",
            "MachineRef",
            "crate::v1alpha1::Machine",
            PROST,
        ))
        .method(method(
            "list",
            "List",
            "ListFilter",
            "crate::wire::EncodedMachineList",
            "crate::wire::ListCodec",
        ))
        .build()
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto = "bigfleet/v1alpha1/provider.proto";
    println!("cargo:rerun-if-changed={proto}");
    println!("cargo:rerun-if-changed=build.rs");
    let fds = protox::compile([proto], ["."])?;
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(
        out.join("bigfleet_descriptor.bin"),
        prost::Message::encode_to_vec(&fds),
    )?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(false)
        .compile_fds(fds)?;
    Builder::new()
        .build_client(false)
        .build_server(true)
        .compile(&[server()]);
    Ok(())
}
