//! One integration-test binary: the real `bigfleet-libvirt` over real gRPC on loopback.
//! Each module names the conformance behaviour ids (`Bxxx`) or upstream baseline tests it
//! covers.

mod harness;

mod bare_metal;
mod baseline;
mod concurrency;
mod deploy;
mod deploy_doctor;
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
mod inspect;
mod libvirt;
mod lifecycle;
mod limits;
mod list;
mod metadata;
mod ops;
mod property;
mod qemu_e2e;
mod scale;
mod smoke;
mod tidy;
