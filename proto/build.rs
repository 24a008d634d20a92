//! Compiles `bigfleet/v1alpha1/provider.proto` with protox (pure Rust, so no `protoc` is
//! needed on the build machine) and hands the descriptor set to tonic-prost-build. The same
//! encoded descriptor set is written next to the generated code for gRPC reflection.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto = "bigfleet/v1alpha1/provider.proto";
    println!("cargo:rerun-if-changed={proto}");
    let fds = protox::compile([proto], ["."])?;
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(
        out.join("bigfleet_descriptor.bin"),
        prost::Message::encode_to_vec(&fds),
    )?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(fds)?;
    Ok(())
}
