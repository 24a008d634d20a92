//! The `bigfleet.v1alpha1.CapacityProvider` service over the Provider.
//!
//! Each handler opens one span (`rpc`, a child of the caller's span when the call carries
//! W3C trace context), converts the request, calls the provider, and maps the answer; a panicking handler is caught, counted and answered with INTERNAL
//! so the process keeps serving. Mutating calls log at info, reads at debug, errors at warn.
//! The bootstrap blob is never logged: it leaves this module only inside a `BootstrapBlob`.
//!
//! With `--client-identity=enforce` (mTLS), each handler first checks the caller's client
//! identity (read once per connection, see `identity`) against the call: a refused call is
//! counted, answered with PERMISSION_DENIED and logged once at warn by the rpc line, before
//! the provider sees it, so nothing is fenced, changed or persisted.

use std::future::Future;
use std::panic::AssertUnwindSafe;

use bigfleet_libvirt_domain::authorization::{self, Access, IdentityMode, Reason, Seen};
use bigfleet_libvirt_domain::{Ack, EchoField, ListPage, ListQuery, check_get_id};
use bigfleet_libvirt_ports::{Clock, Hypervisor, Provider, Spawner, StateStore};
use bigfleet_libvirt_proto::v1alpha1 as pb;
use bigfleet_libvirt_proto::wire::EncodedMachineList;
use futures::FutureExt;
use tonic::{Request, Response, Status};
use tracing::{Instrument, Level, debug, debug_span, error, info, info_span, warn};

use crate::identity::PeerIdentity;
use crate::list_budget::{
    Answer, DEFAULT_BUDGET_MIB, LARGE_ANSWER, ListBudget, Reservation, STREAM_WORKING,
};
use crate::list_stream::{DEFAULT_PROGRESS_TIMEOUT, StreamedList};
use crate::metrics::{AuthzLabels, GrpcLabels, GrpcMetrics, MethodLabels};
use crate::trace_context::{self, Received};
use crate::{convert, status};
use bigfleet_libvirt_observe::trace_context::adopt;
use bigfleet_libvirt_system::Stopwatch;

/// The RPCs the identity check guards, and whether each mutates.
const METHODS: [(&str, bool); 6] = [
    ("Create", true),
    ("Configure", true),
    ("Drain", true),
    ("Delete", true),
    ("Get", false),
    ("List", false),
];

/// Whether `method` changes machines (its rpc span is at info; a read's is at debug).
fn is_mutation(method: &str) -> bool {
    METHODS.iter().any(|&(m, mutating)| mutating && m == method)
}

/// The tonic service.
pub struct CapacityService<H, S, C, E> {
    provider: Provider<H, S, C, E>,
    metrics: GrpcMetrics,
    fault_hooks: bool,
    identity: IdentityMode,
    list_budget: ListBudget,
    list_progress_timeout: std::time::Duration,
    streamed_lists: bool,
}

/// With fault hooks on, a Get of this id panics inside the handler, so tests can prove a
/// panic is caught, counted and answered with INTERNAL while the process keeps serving.
pub const PANIC_HOOK_ID: &str = "conformance.fault/panic";

/// How the service answers: everything a host of it chooses. The binary sets each from its
/// flags (`app::serve`); the simulator takes [`ServiceSettings::default`]. Both build the
/// service the one way, through `app::capacity_server`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ServiceSettings {
    /// Honour the injected-panic hook ([`PANIC_HOOK_ID`]; `--fake-fault-hooks` only).
    pub fault_hooks: bool,
    /// Check every call against the caller's client identity (mTLS only: the connections
    /// must carry a [`PeerIdentity`], or every call is refused).
    pub client_identity: IdentityMode,
    /// MiB the List answers held for their readers may take (see `list_budget`).
    pub list_budget_mib: usize,
    /// How long a streamed List's reader may take nothing before the stream is cut (see
    /// `list_stream`).
    pub list_progress_timeout: std::time::Duration,
    /// Stream large List answers from the machines' own encodings under the List memory
    /// budget. Only for a server that serves through
    /// [`crate::list_stream::release_when_sent`]: without that layer such an answer would go
    /// out empty.
    pub streamed_lists: bool,
}

impl Default for ServiceSettings {
    /// No fault hooks, no identity check, the default List budget and progress deadline,
    /// and whole (not streamed) List answers: what a host without the release layer serves.
    fn default() -> Self {
        Self {
            fault_hooks: false,
            client_identity: IdentityMode::Off,
            list_budget_mib: DEFAULT_BUDGET_MIB,
            list_progress_timeout: DEFAULT_PROGRESS_TIMEOUT,
            streamed_lists: false,
        }
    }
}

impl<H, S, C, E> CapacityService<H, S, C, E> {
    /// Serves `provider` as `settings` say, recording into `metrics`. With the identity
    /// check on, every refusal series starts at 0, so the first refusal shows as an increase
    /// (an alert on `increase()` would miss a series that appears at 1).
    pub fn new(
        provider: Provider<H, S, C, E>,
        metrics: GrpcMetrics,
        settings: ServiceSettings,
    ) -> Self {
        if settings.client_identity == IdentityMode::Enforce {
            for (method, mutating) in METHODS {
                for reason in Reason::possible(mutating) {
                    let labels = AuthzLabels {
                        method: method.to_owned(),
                        reason: reason.label().to_owned(),
                    };
                    let _ = metrics.authz_denied.get_or_create(&labels);
                }
            }
        }
        Self {
            provider,
            metrics,
            fault_hooks: settings.fault_hooks,
            identity: settings.client_identity,
            list_budget: ListBudget::new(settings.list_budget_mib),
            list_progress_timeout: settings.list_progress_timeout,
            streamed_lists: settings.streamed_lists,
        }
    }
}

impl<H: Hypervisor, S: StateStore, C: Clock, E: Spawner> CapacityService<H, S, C, E> {
    /// Runs one handler body: span, panic guard, metrics and the rpc log line. The line is
    /// at info for an answer for which `changed` is true (a mutation that started a
    /// transition), at warn for a refusal, and at debug otherwise: reads, and idempotent
    /// replays that only repeat an earlier answer (a retrying caller must not cost a log
    /// write per retry).
    async fn observe<T>(
        &self,
        (method, subject): (&'static str, Option<&str>),
        span: tracing::Span,
        changed: fn(&T) -> bool,
        body: impl Future<Output = Result<T, Status>>,
    ) -> Result<T, Status> {
        let watch = Stopwatch::start();
        let result = AssertUnwindSafe(body)
            .catch_unwind()
            .instrument(span.clone())
            .await;
        let result = result.unwrap_or_else(|panic| {
            self.metrics.panics.inc();
            let cause = panic_message(panic.as_ref());
            error!(parent: &span, method, cause, "recovered panic in gRPC handler");
            Err(status::internal())
        });
        let code = status::outcome_name(result.as_ref().err());
        span.record("code", code);
        if let Err(e) = &result {
            span.record("outcome", "error");
            span.record("otel.status_code", "ERROR");
            span.record("otel.status_description", e.message());
        } else {
            span.record("outcome", "ok");
        }
        let labels = GrpcLabels { method, code };
        self.metrics.grpc_requests.get_or_create(&labels).inc();
        let seconds = watch.seconds();
        let method_labels = MethodLabels { method };
        self.metrics
            .grpc_duration
            .get_or_create(&method_labels)
            .observe(seconds);
        let dur_ms = seconds * 1000.0;
        match &result {
            // A read's span is at debug, so off at the default level: its warning names
            // the call itself.
            Err(e) if !is_mutation(method) => warn!(
                parent: &span,
                method,
                machine_id = subject.map(|id| tracing::field::display(EchoField(id))),
                code,
                error = e.message(),
                dur_ms,
                "rpc"
            ),
            Err(e) => warn!(parent: &span, code, error = e.message(), dur_ms, "rpc"),
            Ok(answer) if changed(answer) => info!(parent: &span, code, dur_ms, "rpc"),
            Ok(_) => debug!(parent: &span, code, dur_ms, "rpc"),
        }
        result
    }

    /// The span of one call (`rpc`), a child of the caller's span when the call carries W3C
    /// trace context (see `trace_context`). The ids are the caller's: the span (and so every
    /// log line in it) carries them bounded. A mutation's shard is given here, at creation,
    /// not recorded later: the JSON log layer rewrites a span's fields on every record.
    ///
    /// A read's span is at debug: a read logs nothing at info, and an info span would have
    /// its fields written for the log layer on every Get only to be dropped (a third of a
    /// Get's server CPU beyond a bare echo's). With an OTLP endpoint it is exported as
    /// before (the exporter takes the provider's spans from debug); a read's warning
    /// carries its method and machine id itself.
    fn rpc_span<T>(
        method: &'static str,
        (machine_id, shard_id): (&str, Option<&str>),
        request: &Request<T>,
    ) -> tracing::Span {
        macro_rules! rpc_span {
            ($span:ident) => {
                $span!(
                    "rpc",
                    method,
                    machine_id = %EchoField(machine_id),
                    operation_id = tracing::field::Empty,
                    shard_id = shard_id.map(|s| tracing::field::display(EchoField(s))),
                    zone = tracing::field::Empty,
                    identity = tracing::field::Empty,
                    code = tracing::field::Empty,
                    outcome = tracing::field::Empty,
                    otel.kind = "server",
                    otel.status_code = tracing::field::Empty,
                    otel.status_description = tracing::field::Empty,
                )
            };
        }
        let span = if is_mutation(method) {
            rpc_span!(info_span)
        } else {
            rpc_span!(debug_span)
        };
        adopt(&span, &trace_context::carrier(request.metadata()));
        span
    }

    /// The caller's identity, when identities are enforced.
    fn peer<T>(&self, request: &Request<T>) -> Option<PeerIdentity> {
        match self.identity {
            IdentityMode::Off => None,
            IdentityMode::Enforce => request
                .extensions()
                .get::<crate::identity::PeerConnection>()
                .map(|connection| connection.identity.clone()),
        }
    }

    /// Runs inside the rpc span: allows the call, or counts it and answers PERMISSION_DENIED.
    fn authorize(
        &self,
        method: &'static str,
        peer: Option<&PeerIdentity>,
        access: Access<'_>,
    ) -> Result<(), Status> {
        if self.identity == IdentityMode::Off {
            return Ok(());
        }
        // A connection without identity info (not served through mTLS) has no identity.
        let seen = peer.map_or(&Seen::Missing, PeerIdentity::seen);
        let span = tracing::Span::current();
        if let Seen::One { raw, .. } = seen {
            span.record("identity", authorization::escaped(raw).as_str());
        }
        authorization::authorize(seen, method, access).map_err(|denial| {
            span.record("identity", denial.identity.as_str());
            let labels = AuthzLabels {
                method: method.to_owned(),
                reason: denial.reason.label().to_owned(),
            };
            self.metrics.authz_denied.get_or_create(&labels).inc();
            status::permission_denied(&denial)
        })
    }

    async fn mutate(
        &self,
        method: &'static str,
        peer: Option<PeerIdentity>,
        mutation: bigfleet_libvirt_domain::Mutation,
        blob: bigfleet_libvirt_ports::BootstrapBlob,
    ) -> Result<Mutated, Status> {
        // Runs inside the rpc span (see `observe`): the span carries the shard (given when
        // it was made), and once answered the operation id and zone; the timeline the call
        // and its answer.
        let span = tracing::Span::current();
        let received = Received::arrive(&self.metrics.timeline, &mutation);
        let answer = self.decide(method, peer, mutation, blob).await;
        match &answer {
            Ok(mutated) => {
                let ack = mutated.response.get_ref();
                span.record("operation_id", ack.operation_id.as_str());
                if let Some(machine) = &ack.machine {
                    span.record("zone", machine.zone.as_str());
                }
                received.answered(Ok((ack.operation_id.as_str(), mutated.started)));
            }
            Err(e) => received.answered(Err(e)),
        }
        answer
    }

    async fn decide(
        &self,
        method: &'static str,
        peer: Option<PeerIdentity>,
        mutation: bigfleet_libvirt_domain::Mutation,
        blob: bigfleet_libvirt_ports::BootstrapBlob,
    ) -> Result<Mutated, Status> {
        let access = Access::Mutate {
            shard_id: &mutation.token.shard_id,
        };
        self.authorize(method, peer.as_ref(), access)?;
        let ack = self.provider.mutate(mutation, blob).await;
        ack.map(|ack| Mutated {
            started: ack.dispatch.is_some(),
            response: Response::new(transition_ack(&ack)),
        })
        .map_err(|e| status::for_provider_error(&e))
    }

    /// A mutating call through [`Self::observe`]: logged at info only when it started a
    /// transition.
    async fn observe_mutation(
        &self,
        method: &'static str,
        span: tracing::Span,
        body: impl Future<Output = Result<Mutated, Status>>,
    ) -> Result<Response<pb::TransitionAck>, Status> {
        let started = |m: &Mutated| m.started;
        let mutated = self.observe((method, None), span, started, body).await?;
        Ok(mutated.response)
    }
}

/// A query that lists no machine but the head revision (nothing is modified after the
/// largest revision), for a List that may join an answer being streamed.
const HEAD: ListQuery = ListQuery {
    states: None,
    max_results: None,
    since_revision: Some(i64::MAX),
};

impl<H: Hypervisor, S: StateStore, C: Clock, E: Spawner> CapacityService<H, S, C, E> {
    async fn list_page(&self, query: &ListQuery) -> Result<ListPage, Status> {
        let page = self
            .provider
            .list(query)
            .await
            .map_err(|e| status::for_store_error(&e))?;
        if tracing::enabled!(Level::DEBUG) {
            debug!(
                machines = page.machines.len(),
                revision = page.revision,
                "list"
            );
        }
        Ok(page)
    }

    /// A List that may be large, answered with the whole message (a server without the
    /// streaming layer): built in its turn, not counted.
    async fn list_whole(&self, query: &ListQuery) -> Result<Response<EncodedMachineList>, Status> {
        let _turn = self.list_budget.turn().await;
        let page = self.list_page(query).await?;
        let machines = page.machines.len();
        let answer = encode_off_the_workers(page).await;
        self.list_budget.observe(answer.encoded_len(), machines);
        Ok(Response::new(answer))
    }

    /// A List that may be large, streamed under the budget (see `list_budget`): it joins the
    /// answer being streamed for the same query at the head revision, or reserves room,
    /// builds its own in turn, and keeps only its stream's working bytes reserved once the
    /// answer is measured with the others.
    async fn list_streamed(
        &self,
        query: &ListQuery,
        bound: usize,
    ) -> Result<Response<EncodedMachineList>, Status> {
        let budget = &self.list_budget;
        if budget.sharing(query) {
            let head = self.list_page(&HEAD).await?.revision;
            if let Some(answer) = budget.shared(query, head) {
                let reservation = budget.reserve(STREAM_WORKING).await;
                return Ok(self.streamed(answer, reservation));
            }
        }
        let mut reservation = budget.reserve(ListBudget::estimate(bound)).await;
        let turn = budget.turn().await;
        let page = self.list_page(query).await?;
        if let Some(answer) = budget.shared(query, page.revision) {
            reservation.shrink_to(STREAM_WORKING);
            return Ok(self.streamed(answer, reservation));
        }
        let (machines, revision) = (page.machines.len(), page.revision);
        let list = encode_off_the_workers(page).await;
        drop(turn);
        let bytes = list.encoded_len();
        budget.observe(bytes, machines);
        if bytes <= LARGE_ANSWER {
            return Ok(Response::new(list));
        }
        let answer = budget.keep(list, query, revision);
        reservation.shrink_to(STREAM_WORKING);
        Ok(self.streamed(answer, reservation))
    }

    /// The response that has the streaming layer stream `answer`.
    fn streamed(
        &self,
        answer: std::sync::Arc<Answer>,
        reservation: Reservation,
    ) -> Response<EncodedMachineList> {
        let mut response = Response::new(EncodedMachineList::default());
        response.extensions_mut().insert(StreamedList::new(
            answer,
            reservation,
            self.list_progress_timeout,
            self.metrics.list_streams_cut.clone(),
        ));
        response
    }
}

/// A mutating call's answer, and whether it started a transition (`false` for an
/// idempotent replay of an earlier call).
struct Mutated {
    response: Response<pb::TransitionAck>,
    started: bool,
}

fn transition_ack(ack: &Ack) -> pb::TransitionAck {
    pb::TransitionAck {
        operation_id: ack.operation_id.to_string(),
        machine: Some(convert::machine(&ack.machine)),
    }
}

/// Builds a large List answer on tokio's blocking pool, so the async workers keep serving
/// other calls meanwhile (inline under the simulator, which has no such pool).
async fn encode_off_the_workers(page: bigfleet_libvirt_domain::ListPage) -> EncodedMachineList {
    #[cfg(not(madsim))]
    {
        let page = std::sync::Arc::new(page);
        let shared = std::sync::Arc::clone(&page);
        match tokio::task::spawn_blocking(move || convert::encoded_list(&shared)).await {
            Ok(answer) => answer,
            // The blocking pool refused (shutting down) or the build panicked: build it here,
            // where a panic is caught by the handler's guard like any other.
            Err(_) => convert::encoded_list(&page),
        }
    }
    #[cfg(madsim)]
    {
        convert::encoded_list(&page)
    }
}

fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "non-string panic payload".to_owned())
}

#[tonic::async_trait]
impl<H: Hypervisor, S: StateStore, C: Clock, E: Spawner>
    pb::capacity_provider_server::CapacityProvider for CapacityService<H, S, C, E>
{
    async fn create(
        &self,
        request: Request<pb::CreateRequest>,
    ) -> Result<Response<pb::TransitionAck>, Status> {
        let peer = self.peer(&request);
        let ids = (
            request.get_ref().machine_id.as_str(),
            Some(request.get_ref().shard_id.as_str()),
        );
        let span = Self::rpc_span("Create", ids, &request);
        let mutation = convert::create(request.into_inner());
        let blob = bigfleet_libvirt_ports::BootstrapBlob::default();
        let body = self.mutate("Create", peer, mutation, blob);
        self.observe_mutation("Create", span, body).await
    }

    async fn configure(
        &self,
        request: Request<pb::ConfigureRequest>,
    ) -> Result<Response<pb::TransitionAck>, Status> {
        let peer = self.peer(&request);
        let ids = (
            request.get_ref().machine_id.as_str(),
            Some(request.get_ref().shard_id.as_str()),
        );
        let span = Self::rpc_span("Configure", ids, &request);
        let (mutation, blob) = convert::configure(request.into_inner());
        let body = self.mutate("Configure", peer, mutation, blob);
        self.observe_mutation("Configure", span, body).await
    }

    async fn drain(
        &self,
        request: Request<pb::DrainRequest>,
    ) -> Result<Response<pb::TransitionAck>, Status> {
        let peer = self.peer(&request);
        let ids = (
            request.get_ref().machine_id.as_str(),
            Some(request.get_ref().shard_id.as_str()),
        );
        let span = Self::rpc_span("Drain", ids, &request);
        let mutation = convert::drain(request.into_inner());
        let blob = bigfleet_libvirt_ports::BootstrapBlob::default();
        let body = self.mutate("Drain", peer, mutation, blob);
        self.observe_mutation("Drain", span, body).await
    }

    async fn delete(
        &self,
        request: Request<pb::DeleteRequest>,
    ) -> Result<Response<pb::TransitionAck>, Status> {
        let peer = self.peer(&request);
        let ids = (
            request.get_ref().machine_id.as_str(),
            Some(request.get_ref().shard_id.as_str()),
        );
        let span = Self::rpc_span("Delete", ids, &request);
        let mutation = convert::delete(request.into_inner());
        let blob = bigfleet_libvirt_ports::BootstrapBlob::default();
        let body = self.mutate("Delete", peer, mutation, blob);
        self.observe_mutation("Delete", span, body).await
    }

    async fn get(&self, request: Request<pb::MachineRef>) -> Result<Response<pb::Machine>, Status> {
        let peer = self.peer(&request);
        let span = Self::rpc_span("Get", (&request.get_ref().id, None), &request);
        let id = request.into_inner().id;
        let body = async {
            self.authorize("Get", peer.as_ref(), Access::Read)?;
            check_get_id(&id).map_err(status::refused_get_id)?;
            assert!(
                !(self.fault_hooks && id == PANIC_HOOK_ID),
                "injected handler panic (fault hook)"
            );
            let found = self
                .provider
                .get(&id)
                .await
                .map_err(|e| status::for_store_error(&e))?;
            let machine = found.ok_or_else(|| status::unknown_machine(&id))?;
            tracing::Span::current().record("zone", machine.zone.as_str());
            Ok(Response::new(convert::machine(&machine)))
        };
        self.observe(("Get", Some(&id)), span, |_| false, body)
            .await
    }

    async fn list(
        &self,
        request: Request<pb::ListFilter>,
    ) -> Result<Response<EncodedMachineList>, Status> {
        let peer = self.peer(&request);
        let span = Self::rpc_span("List", ("", None), &request);
        let query = convert::list_query(&request.into_inner());
        let body = async {
            self.authorize("List", peer.as_ref(), Access::Read)?;
            let inventory = self.provider.machine_count();
            let bound = query
                .max_results
                .map_or(inventory, |max| max.min(inventory));
            if !self.list_budget.may_be_large(bound) {
                let page = self.list_page(&query).await?;
                let machines = page.machines.len();
                let answer = convert::encoded_list(&page);
                self.list_budget.observe(answer.encoded_len(), machines);
                return Ok(Response::new(answer));
            }
            if self.streamed_lists {
                self.list_streamed(&query, bound).await
            } else {
                self.list_whole(&query).await
            }
        };
        self.observe(("List", None), span, |_| false, body).await
    }
}
