//! The composition root: settings in, a running provider out. It is the one crate that knows
//! every adapter; the binary, the benchmarks and the simulator all build the provider through
//! it instead of wiring adapters by hand.
//!
//! - `metrics`: [`Metrics`], the one registry each adapter registers its series on (created
//!   here), and the series the root produces itself (transitions, machines, the state
//!   store, connection evictions);
//! - `assemble`: [`assemble`], the adapter-level root (the hypervisor instrumented, the
//!   provider started with its observers, the restored machines handed back);
//! - `service`: [`capacity_server`], the one way the gRPC service is built (the generated
//!   server over the real handlers, as [`ServiceSettings`] say), for `serve` and the
//!   simulator alike;
//! - `serve` (feature `serve`): [`serve`] (both ports until shutdown); `serve_stub` stands in
//!   for it under `--cfg madsim` and without the feature; `serve_config`: what it reads
//!   ([`ServeConfig`], [`NetLimits`], [`Banner`]);
//! - `reconcile`: [`reconcile_every`], the background reconcile loop of the binary and the
//!   simulator;
//! - `launch` (feature `libvirt`): the operator's flags, declared once with clap's derive
//!   ([`launch::Flags`], [`launch::LimitFlags`]), validated into a [`launch::Plan`];
//! - `preflight` (feature `libvirt`): `doctor`'s run over every `--connect` host;
//! - `inspect` (feature `redb`): the `state inspect` report;
//! - `run` (features `libvirt` and `redb`): [`run`], a [`launch::Plan`] to a serving
//!   provider: store and backend chosen, the adapter configured, the provider built through
//!   [`assemble`], both ports bound and served;
//! - `exit` (feature `redb`): [`Exit`], what `run` leaves for a fast process exit (the
//!   state file closed, the inventory left unfreed).
//!
//! The features `libvirt` and `redb` (on by default) pull in the adapters that link libvirt
//! and redb, and `serve` (on by default) the real servers (tonic's router, health,
//! reflection, the HTTP side server on axum, the `process_*` series through procfs); the
//! simulator depends on this crate without any of them.

mod assemble;
pub mod metrics;
mod reconcile;
#[cfg(all(feature = "serve", not(madsim)))]
mod serve;
mod serve_config;
#[cfg(not(all(feature = "serve", not(madsim))))]
mod serve_stub;
mod service;
mod timeline;

#[cfg(feature = "redb")]
mod exit;
#[cfg(feature = "redb")]
pub mod inspect;
#[cfg(feature = "libvirt")]
pub mod launch;
#[cfg(feature = "libvirt")]
pub mod preflight;
#[cfg(all(feature = "libvirt", feature = "redb"))]
mod run;

pub use assemble::{Assembled, Parts, assemble};
pub use bigfleet_libvirt_grpc::ServiceSettings;
#[cfg(feature = "redb")]
pub use exit::Exit;
pub use metrics::Metrics;
pub use reconcile::reconcile_every;
#[cfg(all(feature = "libvirt", feature = "redb"))]
pub use run::{Launch, Listeners, OnStart, Running, run};
#[cfg(all(feature = "serve", not(madsim)))]
pub use serve::serve;
pub use serve_config::{Banner, NetLimits, ServeConfig};
#[cfg(not(all(feature = "serve", not(madsim))))]
pub use serve_stub::serve;
pub use service::capacity_server;
