//! Deterministic simulation of bigfleet-libvirt under madsim.
//!
//! The real provider (the `Provider` service, built by the binary's composition root
//! `bigfleet_libvirt_app::assemble`, and the generated `CapacityProvider` gRPC server over the real
//! `CapacityService` handlers, served by madsim-tonic) runs on simulated nodes against
//! fault-injecting hosts, a store with an explicit durability model and shards sending
//! concurrent fenced traffic through the generated client over madsim's network.
//! Every decision comes from the madsim seed; the runner prints it first and a hash of the
//! event trace last, and a failing seed prints the one command that replays it.
//!
//! Everything here is compiled only under `RUSTFLAGS="--cfg madsim"` (`scripts/sim.sh`);
//! a normal build gets a stub whose runner explains how to run it. What is and is not
//! simulated is written down in `sim/README.md`.

#[cfg(madsim)]
pub mod checkers;
#[cfg(madsim)]
pub mod disk;
#[cfg(madsim)]
pub mod fakes;
#[cfg(madsim)]
pub mod faults;
#[cfg(madsim)]
pub mod history;
#[cfg(madsim)]
pub mod hosts;
#[cfg(madsim)]
pub mod net;
#[cfg(madsim)]
pub mod rng;
#[cfg(madsim)]
pub mod rpc;
#[cfg(madsim)]
pub mod runner;
#[cfg(madsim)]
pub mod scenario;
#[cfg(madsim)]
pub mod server;
#[cfg(madsim)]
pub mod spans;
#[cfg(madsim)]
pub mod time;
#[cfg(madsim)]
pub mod trace;
#[cfg(madsim)]
pub mod verdict;
#[cfg(madsim)]
pub mod workload;
#[cfg(madsim)]
pub mod world;

/// What the runner prints when it was built without `--cfg madsim`.
pub const HOW_TO_RUN: &str = "\
bigfleet-libvirt-sim runs only in a simulation build (RUSTFLAGS=\"--cfg madsim\", target/sim):
  scripts/sim.sh --seed 42          one seed, with its plan and trace hash
  scripts/sim.sh --seeds 1..=500    a sweep
  scripts/sim.sh --ci               the fixed seed list (sim/seeds.txt) and the determinism check
  scripts/sim.sh --bugs             prove each injected bug is caught
See sim/README.md.";
