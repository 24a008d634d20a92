//! `bigfleet-libvirt doctor`: a preflight that turns the set-up mistakes which otherwise surface
//! minutes later as FAILED machines (a missing golden image, an inactive pool, no KVM, a missing
//! network) into one line each, with the fix, before anything is served.
//!
//! This module is pure: it judges [`HostFacts`] (what the libvirt adapter's probe read from each
//! host, without changing anything there) against [`Expectations`] (what the flags would run), and
//! renders the [`Report`] as a table or JSON. Keeping the judgement apart from libvirt lets every
//! verdict, including ones the libvirt test driver cannot stage (an inactive pool, KVM missing), be
//! tested directly. `doctor/facts.rs` holds the facts and the expectations, `doctor/probe.rs` reads
//! them from a host (and `doctor/trial_domain.rs` runs the opt-in throw-away domains);
//! `doctor/checks.rs` the checks of one host (`doctor/golden.rs` the `image-source` one,
//! `doctor/ceph.rs` the rbd pool's and the seed pool's, with the probe's read of the pool's
//! cephx secret, `doctor/trial.rs` the `cpu trial` ones, `doctor/placement.rs` the `dedicated cpus` and `huge
//! pages` ones, `doctor/passthrough.rs` the `devices` ones), `doctor/judge.rs` the judgement that runs them in
//! order, and `doctor/report.rs` the report, its verdict and its table.

mod budget;
mod ceph;
mod checks;
mod facts;
mod golden;
mod judge;
mod passthrough;
mod placement;
pub(crate) mod probe;
mod report;
mod trial;
pub mod trial_domain;

pub use facts::{
    Connection, CpuTrial, DomainCaps, Domains, Expectations, HostFacts, Pool, Probe, RbdFacts,
    Slots, Volume,
};
pub use judge::judge;
pub use report::{Check, Report, Status, table};

#[cfg(test)]
mod ceph_tests;
#[cfg(test)]
mod passthrough_tests;
#[cfg(test)]
mod placement_tests;
#[cfg(test)]
mod tests;
