//! The black-box harness: starts the real `bigfleet-libvirt` binary on loopback ports it
//! picks itself (`127.0.0.1:0`), learns the bound addresses from its JSON "serving" log
//! line, and offers the conformance suite's vocabulary (pick, walk, reach, stays-in).
//!
//! The binary is found at `$BIGFLEET_LIBVIRT_BIN`, else in the workspace target directory;
//! the README's test command builds it before running the tests.

#![allow(dead_code)]

pub mod http;
pub mod logs;
pub mod process;
pub mod profiles;
pub mod scrape;
pub mod tls;
pub mod walk;

pub use http::http_get;
pub use process::{Server, binary, exit_within};
pub use profiles::{bare_metal, core, fault};
pub use walk::*;
