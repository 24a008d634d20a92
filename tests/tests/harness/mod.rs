//! The black-box harness: starts the real `bigfleet-libvirt` binary on loopback ports it
//! picks itself (`127.0.0.1:0`), learns the bound addresses from its JSON "serving" log
//! line, and offers the conformance suite's vocabulary (pick, walk, reach, stays-in).
//!
//! The binary is the one Cargo builds for the test run (`CARGO_BIN_EXE_bigfleet-libvirt`):
//! these tests belong to the binary's package, so a plain `cargo test` is enough.

#![allow(dead_code)]

pub mod backend;
pub mod faketime;
pub mod http;
pub mod logs;
pub mod process;
pub mod profiles;
pub mod raw_list;
pub mod scrape;
pub mod skip;
pub mod timing;
pub mod tls;
pub mod walk;

/// The repository's root: this package (`infra/bin`) is two levels below it.
pub fn repo_root() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("the repository root exists")
}

pub use http::{http_get, query_encoded, timeline_events};
pub use process::{Server, binary, exit_within};
pub use profiles::{bare_metal, core, fault};
pub use walk::*;
