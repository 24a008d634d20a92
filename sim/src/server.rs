//! The provider process: what the provider node runs each time it (re)starts.
//!
//! It builds the provider through the binary's composition root (`bigfleet_libvirt_app::assemble`)
//! from the simulated adapters (the root wraps the hypervisor in the same
//! `InstrumentedHypervisor` decorator, and does the same restore hand-off, as for the
//! binary), and serves the generated `CapacityProviderServer` over the real
//! `CapacityService` (`bigfleet_libvirt_app::capacity_server`: proto conversion, the status module,
//! the panic guard, metrics) on a madsim-tonic `Server` at [`PROVIDER_ADDR`], on madsim's
//! simulated network. `app::serve` itself is compiled out of this build: it runs tonic,
//! health, reflection, TLS and axum on real sockets. The background reconcile pass is the
//! binary's own (`app::reconcile_every`), on the simulated clock, tracing each outcome.
//!
//! Like the fakes, it only records what it saw in the history, for the checkers: the
//! process starting, the records it holds once started, and every answer as it leaves.

use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use bigfleet_libvirt_app as app;
use bigfleet_libvirt_app::Metrics;
use bigfleet_libvirt_domain::{ListQuery, Policy, Timeouts};
use bigfleet_libvirt_ports::ProviderConfig;
use bigfleet_libvirt_proto::v1alpha1 as pb;
use bigfleet_libvirt_proto::wire::EncodedMachineList;
use futures::future::Either;
use futures::{FutureExt, StreamExt};
use madsim_tonic::codegen::http::uri::PathAndQuery;
use madsim_tonic::codegen::{BoxFuture, BoxMessage, BoxMessageStream, Service};
use madsim_tonic::transport::{NamedService, Server};
use madsim_tonic::{Request, Response, Status};
use tracing::Instrument as _;

use crate::fakes::clock::{SimClock, SimSpawner};
use crate::fakes::hypervisor::SimHypervisor;
use crate::fakes::store::SimStateStore;
use crate::history::Event;
use crate::net::{Answer, PROVIDER_ADDR, Reply, Rpc};
use crate::rpc::{CALLER_GAVE_UP, decode_list};
use crate::spans;
use crate::world::World;

/// The provider under test, as the composition root builds it.
pub type SimProvider = app::Assembled<SimHypervisor, SimStateStore, SimClock, SimSpawner>;

/// The provider process that serves, if one does: published by [`run_provider`] once it
/// started, withdrawn by the supervisor when it kills the process. The final checks look
/// into it.
#[derive(Clone, Default)]
pub struct Serving(Arc<Mutex<Option<SimProvider>>>);

impl Serving {
    /// The serving process, if any.
    #[must_use]
    pub fn get(&self) -> Option<SimProvider> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Publishes (or withdraws) the serving process.
    pub fn set(&self, provider: Option<SimProvider>) {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) = provider;
    }
}

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

/// Runs one provider process until the simulator kills it; publishes it in `serving` once
/// it started.
pub async fn run_provider(world: Arc<World>, serving: Serving) {
    let incarnation = world.next_incarnation();
    world.trace(format!("provider #{incarnation} starting"));
    world.record(Event::Starting);
    let metrics = Metrics::new();
    let started = app::assemble(app::Parts {
        config: config(&world),
        hypervisor: SimHypervisor::new(Arc::clone(&world)),
        store: SimStateStore::open(Arc::clone(&world), incarnation),
        clock: SimClock,
        spawner: SimSpawner,
        metrics: metrics.clone(),
        observers: Vec::new(),
    })
    .instrument(tracing::info_span!(spans::START_SPAN, incarnation))
    .await;
    let provider = match started {
        Ok(provider) => provider,
        Err(e) => {
            world.trace(format!("provider #{incarnation} failed to start: {e}"));
            world.request_restart("start failed");
            return;
        }
    };
    let machines = provider.peek(&ListQuery::default()).machines;
    world.record(Event::Started(machines));
    serving.set(Some(provider.clone()));
    // The binary's one constructor, with the settings of a host without TLS or the release
    // layer streamed Lists need: no identity check, whole List answers.
    let service = app::capacity_server(provider.clone(), &metrics, app::ServiceSettings::default());
    world.trace(format!("provider #{incarnation} serving"));
    drop(madsim::task::spawn(reconcile_loop(
        Arc::clone(&world),
        provider,
    )));
    // Returns only if the address cannot be bound or accepting fails; a kill drops it.
    let served = Server::builder()
        .add_service(Observed {
            inner: service,
            world: Arc::clone(&world),
        })
        .serve(PROVIDER_ADDR)
        .await;
    panic!("provider #{incarnation} stopped serving: {served:?}");
}

/// The generated server, recording every answer in the history as it leaves the provider
/// (also those whose caller is gone or whose reply the network will drop).
///
/// madsim-tonic hands messages over as values: a unary request stream holds the one
/// request, already there, and the answer stream the one answer.
struct Observed<S> {
    inner: S,
    world: Arc<World>,
}

impl<S: NamedService> NamedService for Observed<S> {
    const NAME: &'static str = S::NAME;
}

type Call = (PathAndQuery, Request<BoxMessageStream>);

impl<S> Service<Call> for Observed<S>
where
    S: Service<
            Call,
            Response = Response<BoxMessageStream>,
            Error = Status,
            Future = BoxFuture<Response<BoxMessageStream>, Status>,
        >,
{
    type Response = Response<BoxMessageStream>;
    type Error = Status;
    type Future = BoxFuture<Response<BoxMessageStream>, Status>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Status>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, (path, request): Call) -> Self::Future {
        let (metadata, extensions, mut messages) = request.into_parts();
        let message = messages
            .next()
            .now_or_never()
            .flatten()
            .expect("a unary call carries its request")
            .expect("the request arrived");
        let rpc = rpc_of(&message);
        let give_up = give_up(&self.world);
        let request = Request::from_parts(metadata, extensions, one(message));
        let answer = self.inner.call((path, request));
        let world = Arc::clone(&self.world);
        Box::pin(async move {
            let answer = match give_up {
                None => answer.await,
                Some(GiveUp::BeforeStart) => {
                    drop(answer);
                    return Err(caller_gone(&world, &rpc, "before its handler ran"));
                }
                Some(GiveUp::After(wait)) => {
                    let waited = Box::pin(madsim::time::sleep(wait));
                    // `select` polls the handler first, so a zero wait still lets it decide.
                    match futures::future::select(answer, waited).await {
                        Either::Left((answer, _)) => answer,
                        Either::Right(((), handler)) => {
                            drop(handler);
                            return Err(caller_gone(&world, &rpc, "with the call in hand"));
                        }
                    }
                }
            };
            let (answer, reply) = match answer {
                Ok(response) => {
                    let (metadata, mut messages, extensions) = response.into_parts();
                    let message = messages.next().await.expect("a unary call has an answer")?;
                    let reply = answer_of(&message);
                    let response = Response::from_parts(metadata, one(message), extensions);
                    (Ok(response), reply)
                }
                Err(status) => (Err(status.clone()), Err(status)),
            };
            world.record(Event::Answered(rpc, reply));
            answer
        })
    }
}

/// When the caller of a call gives up, if it does.
#[derive(Clone, Copy, Debug)]
enum GiveUp {
    /// Before the provider's handler first runs (a stream reset with its request).
    BeforeStart,
    /// After the handler has run for this long: before, during or after its commit.
    After(Duration),
}

/// Draws whether the caller of the call arriving now gives up on it, and when. The wait
/// ranges over twice the slowest fsync of the run, so that the drop lands before, during
/// and after the decision's commit alike.
fn give_up(world: &World) -> Option<GiveUp> {
    if world.calm() {
        return None;
    }
    let mut rng = world.cancel_rng();
    if !rng.chance(world.plan.net.cancel) {
        return None;
    }
    if rng.chance(crate::rng::Ratio::new(1, 8)) {
        return Some(GiveUp::BeforeStart);
    }
    let slowest = world.plan.store.fsync.1.max(Duration::from_millis(1));
    Some(GiveUp::After(rng.duration(Duration::ZERO, slowest * 2)))
}

/// Records a call whose handler was dropped (as tonic drops it when the client resets the
/// stream) and the status that ends it. The history records no answer: none left the
/// provider.
fn caller_gone(world: &World, rpc: &Rpc, when: &str) -> Status {
    world.stats().cancelled += 1;
    let (method, id) = match rpc {
        Rpc::Create(r) => ("Create", r.machine_id.as_str()),
        Rpc::Configure(r) => ("Configure", r.machine_id.as_str()),
        Rpc::Drain(r) => ("Drain", r.machine_id.as_str()),
        Rpc::Delete(r) => ("Delete", r.machine_id.as_str()),
        Rpc::Get(r) => ("Get", r.id.as_str()),
        Rpc::List(_) => ("List", ""),
    };
    world.trace(format!("caller gave up {when}: {method} {id}"));
    Status::cancelled(CALLER_GAVE_UP)
}

fn one(message: BoxMessage) -> BoxMessageStream {
    futures::stream::once(async move { Ok(message) }).boxed()
}

/// The request as the history records it.
fn rpc_of(message: &BoxMessage) -> Rpc {
    if let Some(r) = message.downcast_ref::<pb::CreateRequest>() {
        Rpc::Create(r.clone())
    } else if let Some(r) = message.downcast_ref::<pb::ConfigureRequest>() {
        Rpc::Configure(r.clone())
    } else if let Some(r) = message.downcast_ref::<pb::DrainRequest>() {
        Rpc::Drain(r.clone())
    } else if let Some(r) = message.downcast_ref::<pb::DeleteRequest>() {
        Rpc::Delete(r.clone())
    } else if let Some(r) = message.downcast_ref::<pb::MachineRef>() {
        Rpc::Get(r.clone())
    } else if let Some(r) = message.downcast_ref::<pb::ListFilter>() {
        Rpc::List(r.clone())
    } else {
        unreachable!("every CapacityProvider request type is listed")
    }
}

/// The answer as the history records it: for List, what a client decodes from the spliced
/// encodings (so the memo of each record's encoding is exercised here too).
fn answer_of(message: &BoxMessage) -> Reply {
    if let Some(a) = message.downcast_ref::<pb::TransitionAck>() {
        Ok(Answer::Ack(a.clone()))
    } else if let Some(m) = message.downcast_ref::<pb::Machine>() {
        Ok(Answer::Machine(m.clone()))
    } else if let Some(l) = message.downcast_ref::<EncodedMachineList>() {
        decode_list(l)
    } else {
        unreachable!("every CapacityProvider answer type is listed")
    }
}

/// The background reconcile pass, the same loop the binary runs (`app::reconcile_every`).
async fn reconcile_loop(world: Arc<World>, provider: SimProvider) {
    let interval = world.plan.reconcile_interval;
    app::reconcile_every(provider, interval, |outcome| match outcome {
        Ok(report) => world.trace(format!(
            "reconcile added={} refreshed={}",
            report.added.len(),
            report.refreshed.len()
        )),
        Err(e) => world.trace(format!("reconcile failed: {e}")),
    })
    .await;
}
