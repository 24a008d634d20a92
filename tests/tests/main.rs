//! One integration-test binary: the real `bigfleet-libvirt` over real gRPC on loopback.
//! Each module names the conformance behaviour ids (`Bxxx`) or upstream baseline tests it
//! covers.

// Black-box tests and benchmarks measure wall time and spawn freely: the product's bans on raw
// time, spawning and hash collections (clippy.toml) do not apply to them.
#![allow(clippy::disallowed_methods, clippy::disallowed_types)]

mod harness;
// The benchmarks' flag set, for the tests that run the composition root in process.
#[path = "../benches/common/flags.rs"]
mod bench_flags;

mod bare_metal;
mod baseline;
mod cancel;
mod clock_step;
mod concurrency;
mod deploy;
mod deploy_doctor;
mod disk_full;
mod doctor;
mod dry_run;
mod durable;
mod echo;
mod embedding;
mod errors;
mod fault;
mod fencing;
mod fieldshape;
mod host_hang;
mod identity;
mod identity_docs;
mod image;
mod image_source;
mod inspect;
mod libvirt;
mod lifecycle;
mod limits;
mod list;
mod list_burst;
mod list_fairness;
mod logs;
mod metadata;
mod observe;
mod observe_live;
mod ops;
mod phases;
mod property;
mod qemu_ceph;
mod qemu_conformance;
mod qemu_crash;
mod qemu_e2e;
mod qemu_faults;
mod qemu_image;
mod qemu_lanes;
mod qemu_remote;
mod qemu_slow;
mod qemu_zones;
mod read_wait;
mod scale;
mod signals;
mod slowloris;
mod smoke;
mod tidy;
