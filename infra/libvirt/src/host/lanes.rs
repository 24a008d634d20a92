//! The per-host budget and its lanes: which libvirt call may start on a host, and when.
//!
//! The scheduler itself lives in the ports crate (`ports/src/lanes.rs`, where its rules and their
//! tests are), so the simulator runs the same one in front of its simulated hosts. This adapter
//! gives every host one [`Lanes`] (`host/connection.rs`), moves each call's [`Permit`] into the
//! blocking thread that makes the libvirt call, and exports what the lanes show as metrics
//! (`metrics/lanes.rs`, the [`LaneObserver`] it implements).

pub use bigfleet_libvirt_ports::lanes::{
    Budget, DEFAULT_AGENT_BUDGET, DEFAULT_HOST_BUDGET, LIBVIRTD_DEFAULT_MAX_CLIENT_REQUESTS, Lane,
    LaneObserver, Lanes, Permit, TEARDOWN_BURST,
};
