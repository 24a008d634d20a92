//! [`serve`] in a build that cannot serve: under `--cfg madsim` (the simulation, `sim/`)
//! and without the `serve` feature there are no tokio sockets, tonic-health, reflection, TLS
//! or HTTP side server to run. The simulator hosts [`capacity_server`](crate::capacity_server)
//! on madsim-tonic itself; this stub, which refuses to run, keeps the binary compiling.

use bigfleet_libvirt_ports::{Clock, Hypervisor, Provider, Spawner, StateStore};

use crate::metrics::Metrics;
use crate::serve_config::ServeConfig;

/// Refuses to run: this build links none of what serving needs (see the module doc).
///
/// # Errors
/// Always.
pub async fn serve<H: Hypervisor, S: StateStore, C: Clock, E: Spawner>(
    _provider: Provider<H, S, C, E>,
    _metrics: Metrics,
    _grpc: tokio::net::TcpListener,
    _http: Option<tokio::net::TcpListener>,
    _config: ServeConfig,
    _shutdown: impl std::future::Future<Output = ()> + Send,
) -> anyhow::Result<()> {
    anyhow::bail!(
        "app::serve is compiled out of this build: it needs the `serve` feature of \
         bigfleet-libvirt-app and a build without --cfg madsim"
    )
}
