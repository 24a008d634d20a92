//! [`capacity_server`]: the one way the gRPC service is built. The binary's `serve` hosts it
//! on tonic (with the identity check, the List budget and streamed Lists its flags set) and
//! the simulator on madsim-tonic (with [`ServiceSettings::default`]); neither builds a
//! `CapacityService` itself.

use bigfleet_libvirt_grpc::{CapacityService, ServiceSettings};
use bigfleet_libvirt_ports::{Clock, Hypervisor, Provider, Spawner, StateStore};
use bigfleet_libvirt_proto::v1alpha1::capacity_provider_server::CapacityProviderServer;

use crate::metrics::Metrics;

/// The largest request the gRPC server decodes.
const MAX_DECODING_MESSAGE_SIZE: usize = 16 * 1024 * 1024;

/// The generated `CapacityProvider` server over the real handlers ([`CapacityService`]),
/// answering as `settings` say and recording into `metrics`' gRPC series.
pub fn capacity_server<H: Hypervisor, S: StateStore, C: Clock, E: Spawner>(
    provider: Provider<H, S, C, E>,
    metrics: &Metrics,
    settings: ServiceSettings,
) -> CapacityProviderServer<CapacityService<H, S, C, E>> {
    let service = CapacityService::new(provider, metrics.grpc.clone(), settings);
    CapacityProviderServer::new(service).max_decoding_message_size(MAX_DECODING_MESSAGE_SIZE)
}
