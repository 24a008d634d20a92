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
//!
//! The simulation build (`RUSTFLAGS="--cfg madsim"`, `sim/`) generates the server and the
//! client from that same manual definition with madsim-tonic-build instead, into
//! `OUT_DIR/sim/`: the same trait (so `CapacityService` implements it unchanged), served by a
//! madsim-tonic `Server` over madsim's simulated network. madsim-tonic passes messages as
//! in-memory values, so no codec runs there and the simulated client of `List` receives the
//! server's `EncodedMachineList` itself (the caller decodes it, as a real client decodes the
//! bytes).

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
    let madsim = std::env::var_os("CARGO_CFG_MADSIM").is_some();
    tonic_prost_build::configure()
        .build_client(!madsim)
        .build_server(false)
        .compile_fds(fds)?;
    if madsim {
        simulated(&out)?;
    } else {
        Builder::new()
            .build_client(false)
            .build_server(true)
            .compile(&[server()]);
    }
    Ok(())
}

/// The madsim-tonic server and client of [`server()`], in `OUT_DIR/sim/`.
///
/// The generated code names its runtime `tonic` (madsim-tonic expects to be renamed to it);
/// this crate keeps the real tonic as `tonic` (`include_proto!`, `wire`'s codec), so the
/// generated paths are pointed at `madsim_tonic` instead, and the server struct gets the default interceptor parameter so
/// it is spelled `CapacityProviderServer<T>` as in the real build.
#[cfg(madsim)]
fn simulated(out: &std::path::Path) -> Result<(), Box<dyn std::error::Error>> {
    let service = server();
    let attributes = madsim_tonic_build::Attributes::default();
    let server = madsim_tonic_build::server::generate(&service, true, "super", false, &attributes);
    let client = madsim_tonic_build::client::generate(&service, true, "super", false, &attributes);
    let code = format!("{client}\n{server}\n").replace("tonic ::", "madsim_tonic ::");
    let plain = "pub struct CapacityProviderServer < T : CapacityProvider , F >";
    let defaulted =
        "pub struct CapacityProviderServer < T : CapacityProvider , F = IdentityInterceptor >";
    if !code.contains(plain) {
        return Err("madsim-tonic-build's server struct is not spelled as expected".into());
    }
    let code = code.replace(plain, defaulted);
    let dir = out.join("sim");
    std::fs::create_dir_all(&dir)?;
    std::fs::write(dir.join("bigfleet.v1alpha1.CapacityProvider.rs"), code)?;
    Ok(())
}

#[cfg(not(madsim))]
fn simulated(_out: &std::path::Path) -> Result<(), Box<dyn std::error::Error>> {
    Err("--cfg madsim must reach the build script too (RUSTFLAGS, without --target)".into())
}
