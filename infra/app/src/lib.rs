//! The composition root: settings in, a running provider out. It is the one crate that knows
//! every adapter; the binary, the benchmarks and the simulator all build the provider through
//! it instead of wiring adapters by hand.
//!
//! - `metrics`: [`Metrics`], the one registry each adapter registers its series on (created
//!   here), and the series the root produces itself (transitions, machines, the state
//!   store, connection evictions);
//! - `server`: [`assemble`] (the adapter-level root: the hypervisor instrumented, the
//!   provider started with its observers, the restored machines handed back) and
//!   [`capacity_server`] (the generated gRPC server over the real handlers);
//! - `serve` (feature `serve`): [`serve`] (both ports until shutdown; compiled out under
//!   `--cfg madsim` and without the feature);
//! - `launch` (feature `libvirt`): the operator's flags, declared once with clap's derive
//!   ([`launch::Flags`], [`launch::LimitFlags`]), validated into a [`launch::Plan`];
//! - `preflight` (feature `libvirt`): `doctor`'s run over every `--connect` host;
//! - `inspect` (feature `redb`): the `state inspect` report;
//! - `wiring` (features `libvirt` and `redb`): [`run`], a [`launch::Plan`] to a serving
//!   provider: store and backend chosen, the adapter configured, the provider built through
//!   [`assemble`], both ports bound and served;
//! - `exit` (feature `redb`): [`Exit`], what `run` leaves for a fast process exit (the
//!   state file closed, the inventory left unfreed).
//!
//! The features `libvirt` and `redb` (on by default) pull in the adapters that link libvirt
//! and redb, and `serve` (on by default) the real servers (tonic's router, health,
//! reflection, the HTTP side server on axum, the `process_*` series through procfs); the
//! simulator depends on this crate without any of them.

pub mod metrics;
#[cfg(all(feature = "serve", not(madsim)))]
mod serve;
mod server;
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
mod wiring;

#[cfg(feature = "redb")]
pub use exit::Exit;
pub use metrics::Metrics;
#[cfg(all(feature = "serve", not(madsim)))]
pub use serve::serve;
#[cfg(not(all(feature = "serve", not(madsim))))]
pub use server::serve;
pub use server::{
    Assembled, Banner, NetLimits, Parts, ServeConfig, assemble, capacity_server, reconcile_every,
};
#[cfg(all(feature = "libvirt", feature = "redb"))]
pub use wiring::{Launch, Listeners, OnStart, Running, run};
