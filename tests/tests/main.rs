//! One integration-test binary: the real `bigfleet-libvirt` over real gRPC on loopback.
//! Each module names the conformance behaviour ids (`Bxxx`) or upstream baseline tests it
//! covers.

mod harness;

mod bare_metal;
mod baseline;
mod concurrency;
mod deploy;
mod deploy_doctor;
mod disk_full;
mod doctor;
mod dry_run;
mod durable;
mod echo;
mod errors;
mod fault;
mod fencing;
mod fieldshape;
mod identity;
mod identity_docs;
mod image;
mod image_source;
mod inspect;
mod libvirt;
mod lifecycle;
mod limits;
mod list;
mod metadata;
mod observe;
mod observe_live;
mod ops;
mod property;
mod qemu_e2e;
mod qemu_faults;
mod qemu_zones;
mod scale;
mod signals;
mod smoke;
mod tidy;
