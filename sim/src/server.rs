//! The provider process: what the provider node runs each time it (re)starts.
//!
//! It builds the provider through the binary's composition root (`infra::app::assemble`)
//! with the simulated adapters, wrapped in the same `InstrumentedHypervisor` decorator the
//! binary uses, and serves the real `CapacityService` (the generated `CapacityProvider`
//! trait: proto conversion and the status module included) to connections accepted on
//! madsim's simulated network at [`PROVIDER_ADDR`]. `app::serve` itself is not used: it
//! binds tonic, health, reflection and axum on real sockets. Its background reconcile loop is mirrored here on the simulated clock.

use std::sync::Arc;
use std::time::Duration;

use bigfleet_libvirt_domain::{Policy, Timeouts};
use bigfleet_libvirt_infra::app;
use bigfleet_libvirt_infra::grpc::CapacityService;
use bigfleet_libvirt_infra::instrumented::InstrumentedHypervisor;
use bigfleet_libvirt_infra::metrics::Metrics;
use bigfleet_libvirt_ports::{Clock, Provider, ProviderConfig};
use bigfleet_libvirt_proto::v1alpha1::capacity_provider_server::CapacityProvider;
use madsim::net::Endpoint;
use tonic::Request;

use crate::checkers;
use crate::fakes::clock::{SimClock, SimSpawner};
use crate::fakes::hypervisor::SimHypervisor;
use crate::fakes::store::SimStateStore;
use crate::net::{Answer, PROVIDER_ADDR, Reply, Rpc};
use crate::world::World;

/// The hypervisor as the provider sees it.
pub type SimHost = InstrumentedHypervisor<SimHypervisor>;
/// The provider under test.
pub type SimProvider = Provider<SimHost, SimStateStore, SimClock, SimSpawner>;
type Service = CapacityService<SimHost, SimStateStore, SimClock, SimSpawner>;

/// The provider's configuration in the simulation.
#[must_use]
pub fn config(world: &World) -> ProviderConfig {
    ProviderConfig {
        policy: Policy {
            timeouts: Timeouts::uniform(world.plan.transition_timeout),
            ..Policy::default()
        },
        seed_timeout: Duration::from_secs(30),
    }
}

/// Runs one provider process until the simulator kills it.
pub async fn run_provider(world: Arc<World>) {
    let incarnation = world.next_incarnation();
    world.trace(format!("provider #{incarnation} starting"));
    let before = checkers::restart::before_start(&world);
    let metrics = Metrics::new();
    let hypervisor =
        InstrumentedHypervisor::new(SimHypervisor::new(Arc::clone(&world)), metrics.clone());
    let store = SimStateStore::open(Arc::clone(&world), incarnation);
    let started = app::assemble(
        config(&world),
        hypervisor,
        store,
        SimClock,
        SimSpawner,
        &metrics,
    )
    .await;
    let provider = match started {
        Ok(provider) => provider,
        Err(e) => {
            world.trace(format!("provider #{incarnation} failed to start: {e}"));
            world.request_restart("start failed");
            return;
        }
    };
    checkers::restart::after_start(&world, &provider, &before);
    world.set_provider(Some(provider.clone()));
    let service = Arc::new(CapacityService::new(provider.clone(), metrics));
    let listener = Endpoint::bind(PROVIDER_ADDR)
        .await
        .expect("the provider node owns its address");
    world.trace(format!("provider #{incarnation} serving"));
    drop(madsim::task::spawn(reconcile_loop(
        Arc::clone(&world),
        provider,
    )));
    while let Ok((tx, mut rx, _peer)) = listener.accept1().await {
        let service = Arc::clone(&service);
        let world = Arc::clone(&world);
        drop(madsim::task::spawn(async move {
            // A caller that gave up before its request arrived leaves nothing to answer.
            let Ok(payload) = rx.recv().await else {
                return;
            };
            let rpc = *payload.downcast::<Rpc>().expect("callers send an Rpc");
            let reply = handle(&service, rpc.clone()).await;
            checkers::online::on_answer(&world, &rpc, &reply);
            // The caller may be gone (deadline passed): its loss, as with a real reset.
            let _ = tx.send(Box::new(reply)).await;
        }));
    }
}

/// Calls the generated trait method for `rpc`.
async fn handle(service: &Service, rpc: Rpc) -> Reply {
    match rpc {
        Rpc::Create(r) => service
            .create(Request::new(r))
            .await
            .map(|a| Answer::Ack(a.into_inner())),
        Rpc::Configure(r) => service
            .configure(Request::new(r))
            .await
            .map(|a| Answer::Ack(a.into_inner())),
        Rpc::Drain(r) => service
            .drain(Request::new(r))
            .await
            .map(|a| Answer::Ack(a.into_inner())),
        Rpc::Delete(r) => service
            .delete(Request::new(r))
            .await
            .map(|a| Answer::Ack(a.into_inner())),
        Rpc::Get(r) => service
            .get(Request::new(r))
            .await
            .map(|m| Answer::Machine(m.into_inner())),
        // The answer is what a client would decode from the wire: the spliced encodings
        // (so the memo of each record's encoding is exercised under the simulation too).
        Rpc::List(r) => service.list(Request::new(r)).await.and_then(|l| {
            l.into_inner()
                .to_list()
                .map(Answer::List)
                .map_err(|e| tonic::Status::internal(format!("List answer does not decode: {e}")))
        }),
    }
}

/// The binary's background reconcile loop (`app::serve`), on the simulated clock.
async fn reconcile_loop(world: Arc<World>, provider: SimProvider) {
    let clock = SimClock;
    loop {
        let next = clock.now().saturating_add(world.plan.reconcile_interval);
        clock.sleep_until(next).await;
        match provider.reconcile().await {
            Ok(report) => world.trace(format!(
                "reconcile added={} refreshed={}",
                report.added.len(),
                report.refreshed.len()
            )),
            Err(e) => world.trace(format!("reconcile failed: {e}")),
        }
    }
}
