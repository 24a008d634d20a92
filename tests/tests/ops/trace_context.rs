//! Issue 24, inbound W3C trace context, black-box: calls sent with `traceparent`,
//! `tracestate` and `baggage` in their gRPC metadata, spans caught by the in-process OTLP
//! collector of `otlp.rs`. A traced Create and Configure continue the caller's trace (the
//! rpc span's parent is the caller's span, the tracestate kept), and their background
//! transition and hypervisor spans are in that trace too; a Get without context and one with
//! a malformed `traceparent` start new traces; an unsampled caller gets nothing exported; and
//! `OTEL_TRACES_SAMPLER` / `OTEL_TRACES_SAMPLER_ARG` work as the OpenTelemetry spec says.

use std::time::Duration;

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::trace::v1::Span;
use opentelemetry_proto::tonic::trace::v1::status::StatusCode;
use tokio::sync::mpsc::UnboundedReceiver;

use super::otlp::{attr, collector};
use super::*;

/// The caller's trace and the spans it sends its calls from.
const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CREATE_PARENT: &str = "00f067aa0ba902b7";
const CONFIGURE_PARENT: &str = "00f067aa0ba902b8";
const TRACESTATE: &str = "bigfleet=shard-7,vendor=x";
/// A second caller, whose sampled flag is off.
const UNSAMPLED_TRACE: &str = "5cf92f3577b34da6a3ce929d0e0e4799";
const SHARD: &str = "trace-shard";

fn traceparent(trace: &str, span: &str, sampled: bool) -> String {
    format!("00-{trace}-{span}-{:02x}", u8::from(sampled))
}

/// `message` as a request carrying `headers` in its metadata.
fn with_headers<T>(message: T, headers: &[(&'static str, String)]) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    for (name, value) in headers {
        let value = value.parse().expect("an ASCII header value");
        request.metadata_mut().insert(*name, value);
    }
    request
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn create_request(id: &str, sequence: i64) -> pb::CreateRequest {
    pb::CreateRequest {
        machine_id: id.to_owned(),
        shard_id: SHARD.to_owned(),
        shard_epoch: 1,
        sequence_number: sequence,
    }
}

/// What one traced run produced.
struct Run {
    spans: Vec<Span>,
    log: Vec<String>,
    /// The machine walked with trace context.
    traced: String,
    /// The machine created under an unsampled parent.
    other: String,
    /// The machine asked for once, with a malformed traceparent.
    malformed: String,
    create_op: String,
    configure_op: String,
}

impl Run {
    fn find(&self, name: &str, want: &[(&str, &str)]) -> Vec<&Span> {
        self.spans
            .iter()
            .filter(|s| s.name == name)
            .filter(|s| want.iter().all(|(k, v)| attr(s, k).as_deref() == Some(*v)))
            .collect()
    }

    fn one(&self, name: &str, want: &[(&str, &str)]) -> &Span {
        let found = self.find(name, want);
        assert_eq!(
            found.len(),
            1,
            "`{name}` spans with {want:?}: {found:#?}\nall: {:#?}",
            self.spans
                .iter()
                .map(|s| (&s.name, hex(&s.trace_id), &s.attributes))
                .collect::<Vec<_>>()
        );
        found[0]
    }

    fn in_trace(&self, trace: &str) -> Vec<&Span> {
        self.spans
            .iter()
            .filter(|s| hex(&s.trace_id) == trace)
            .collect()
    }
}

/// Three Speculative machines without fault labels.
async fn three_machines(c: &mut Client) -> [String; 3] {
    let mut ids = list(c, &[S::Speculative], 0, b"")
        .await
        .machines
        .into_iter()
        .filter(|m| !m.labels.contains_key(FAULT_LABEL))
        .map(|m| m.id);
    [(); 3].map(|()| ids.next().expect("three machines"))
}

/// Walks one machine through a traced Create and Configure, asks for it with a Get without
/// context and for another with a malformed traceparent, creates that other one under an
/// unsampled parent, then SIGTERMs the provider (which flushes its spans).
async fn traced_run(env: &[(&str, &str)]) -> Run {
    let (endpoint, mut rx) = collector().await;
    let mut args: Vec<String> = ["--use-fake-backend", "--seed-count=8"]
        .into_iter()
        .chain(FAST)
        .map(str::to_owned)
        .collect();
    args.push(format!("--otlp-endpoint=http://{endpoint}"));
    let mut provider = Proc::spawn(&args, env);
    let mut c = provider.client().await;
    let [traced, other, malformed] = three_machines(&mut c).await;
    let headers = [
        ("traceparent", traceparent(TRACE, CREATE_PARENT, true)),
        ("tracestate", TRACESTATE.to_owned()),
        ("baggage", "bigfleet.request_id=req-42,other=x".to_owned()),
    ];
    let request = with_headers(create_request(&traced, 1), &headers);
    let create_op = c.create(request).await.expect("Create").into_inner();
    reach(&mut c, &traced, S::Idle, SETTLE).await;
    let configure = pb::ConfigureRequest {
        machine_id: traced.clone(),
        cluster_id: "trace-cluster".to_owned(),
        bootstrap_blob: b"#cloud-config\n".to_vec(),
        shard_id: SHARD.to_owned(),
        shard_epoch: 1,
        sequence_number: 2,
        shard_metadata: Default::default(),
    };
    let parent = [("traceparent", traceparent(TRACE, CONFIGURE_PARENT, true))];
    let configure_op = c.configure(with_headers(configure, &parent)).await;
    let configure_op = configure_op.expect("Configure").into_inner();
    reach(&mut c, &traced, S::Configured, SETTLE).await;
    get(&mut c, &traced).await.expect("Get without context");
    let header = [("traceparent", "00-not-a-trace-id-01".to_owned())];
    let request = with_headers(
        pb::MachineRef {
            id: malformed.clone(),
        },
        &header,
    );
    c.get(request)
        .await
        .expect("a malformed traceparent is ignored");
    let unsampled = [(
        "traceparent",
        traceparent(UNSAMPLED_TRACE, CREATE_PARENT, false),
    )];
    let request = with_headers(create_request(&other, 3), &unsampled);
    c.create(request).await.expect("unsampled Create");
    reach(&mut c, &other, S::Idle, SETTLE).await;
    drop(c);
    provider.signal("TERM");
    let exit = provider.wait(Duration::from_secs(15)).await;
    assert_eq!(exit, Some(0), "log:\n{}", provider.log_lines().join("\n"));
    Run {
        spans: received(&mut rx),
        log: provider.log_lines(),
        traced,
        other,
        malformed,
        create_op: create_op.operation_id,
        configure_op: configure_op.operation_id,
    }
}

/// Every span the collector has received.
fn received(rx: &mut UnboundedReceiver<ExportTraceServiceRequest>) -> Vec<Span> {
    let mut spans = Vec::new();
    while let Ok(request) = rx.try_recv() {
        let all = request
            .resource_spans
            .into_iter()
            .flat_map(|r| r.scope_spans);
        spans.extend(all.flat_map(|s| s.spans));
    }
    spans
}

/// The rpc span of a traced call: in the caller's trace, under the caller's span.
fn assert_child_of_caller(rpc: &Span, parent: &str) {
    assert_eq!(hex(&rpc.trace_id), TRACE, "in the caller's trace: {rpc:?}");
    assert_eq!(hex(&rpc.parent_span_id), parent, "under the caller's span");
}

/// `child` is in `parent`'s trace, directly under it.
fn assert_under(child: &Span, parent: &Span) {
    assert_eq!(
        child.trace_id, parent.trace_id,
        "{} in the trace",
        child.name
    );
    assert_eq!(
        child.parent_span_id, parent.span_id,
        "{} under {}",
        child.name, parent.name
    );
}

/// A Create and a Configure sent with a sampled traceparent: their rpc spans are children of
/// the caller's spans (tracestate kept, the documented baggage entry an attribute, the rest
/// of the baggage not), and the background transition and hypervisor spans they started are
/// in the same trace, each under the one that started it, with the operation id.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_traced_create_and_configure_continue_the_callers_trace() {
    let run = traced_run(&[]).await;
    let id = run.traced.as_str();
    let create_op = run.create_op.as_str();
    let create = [("method", "Create"), ("machine_id", id)];
    let rpc = run.one("rpc", &create);
    assert_child_of_caller(rpc, CREATE_PARENT);
    assert_eq!(rpc.trace_state, TRACESTATE, "tracestate kept");
    for (key, want) in [
        ("operation_id", Some(create_op)),
        ("shard_id", Some(SHARD)),
        ("outcome", Some("ok")),
        ("baggage.bigfleet.request_id", Some("req-42")),
        ("baggage.other", None),
    ] {
        assert_eq!(attr(rpc, key).as_deref(), want, "rpc attribute {key}");
    }
    assert!(attr(rpc, "zone").is_some_and(|z| !z.is_empty()), "zone");
    let transition = run.one("transition", &[("kind", "create"), ("machine_id", id)]);
    assert_under(transition, rpc);
    assert_eq!(attr(transition, "operation_id").as_deref(), Some(create_op));
    assert_eq!(attr(transition, "outcome").as_deref(), Some("succeeded"));
    let call = run.one("hypervisor", &[("op", "CreateDomain"), ("machine_id", id)]);
    assert_under(call, transition);
    assert_eq!(attr(call, "operation_id").as_deref(), Some(create_op));
    for child in [transition, call] {
        assert_eq!(
            child.trace_state, TRACESTATE,
            "{} keeps the tracestate",
            child.name
        );
    }

    let configure_op = run.configure_op.as_str();
    let rpc = run.one("rpc", &[("method", "Configure"), ("machine_id", id)]);
    assert_child_of_caller(rpc, CONFIGURE_PARENT);
    assert_eq!(attr(rpc, "operation_id").as_deref(), Some(configure_op));
    let transition = run.one("transition", &[("kind", "configure"), ("machine_id", id)]);
    assert_under(transition, rpc);
    for op in ["Configure", "NodeReady"] {
        let call = run.one("hypervisor", &[("op", op), ("machine_id", id)]);
        assert_under(call, transition);
        assert_eq!(attr(call, "operation_id").as_deref(), Some(configure_op));
    }
}

/// A Get without trace context starts a new trace (a root span; the harness's polling Gets
/// of the traced machine are such calls), and so does a Get whose traceparent is malformed,
/// which is answered as if it had none.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_call_without_context_or_with_a_malformed_one_starts_a_new_trace() {
    let run = traced_run(&[]).await;
    let plain = run.find("rpc", &[("method", "Get"), ("machine_id", &run.traced)]);
    assert!(
        !plain.is_empty(),
        "Gets of the traced machine were exported"
    );
    let malformed = run.one("rpc", &[("method", "Get"), ("machine_id", &run.malformed)]);
    let mut traces = std::collections::BTreeSet::new();
    for rpc in plain.iter().copied().chain([malformed]) {
        assert!(rpc.parent_span_id.is_empty(), "a root: {rpc:?}");
        assert_ne!(hex(&rpc.trace_id), TRACE, "a trace of its own");
        assert_eq!(attr(rpc, "code").as_deref(), Some("OK"));
        traces.insert(rpc.trace_id.clone());
    }
    assert_eq!(traces.len(), plain.len() + 1, "every Get a new trace");
    assert!(
        !run.log
            .iter()
            .any(|l| l.contains("not-a-trace-id") && l.contains("WARN")),
        "no warning for a malformed header"
    );
}

/// A Create whose caller's sampled flag is off exports nothing: no rpc, transition or
/// hypervisor span of it, in its trace or any other (the sampled calls of the same run are
/// exported, so export itself worked).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_unsampled_caller_gets_nothing_exported() {
    let run = traced_run(&[]).await;
    assert!(
        !run.in_trace(TRACE).is_empty(),
        "the sampled calls were exported"
    );
    assert!(
        run.in_trace(UNSAMPLED_TRACE).is_empty(),
        "spans of the unsampled call: {:#?}",
        run.in_trace(UNSAMPLED_TRACE)
    );
    let other = run.other.as_str();
    for name in ["transition", "hypervisor"] {
        assert!(
            run.find(name, &[("machine_id", other)]).is_empty(),
            "{name}"
        );
    }
    let creates = run.find("rpc", &[("method", "Create"), ("machine_id", other)]);
    assert!(creates.is_empty(), "{creates:#?}");
}

/// `OTEL_TRACES_SAMPLER=parentbased_traceidratio` with ratio 0 still follows a sampled
/// caller (its Create and Configure, background work included, are exported) and samples no
/// root (neither Get is); `always_off` exports nothing at all, whatever the caller says.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_sampler_variables_work_as_the_spec_says() {
    let ratio = [
        ("OTEL_TRACES_SAMPLER", "parentbased_traceidratio"),
        ("OTEL_TRACES_SAMPLER_ARG", "0"),
    ];
    let run = traced_run(&ratio).await;
    let id = run.traced.as_str();
    let rpc = run.one("rpc", &[("method", "Create"), ("machine_id", id)]);
    assert_child_of_caller(rpc, CREATE_PARENT);
    run.one("transition", &[("kind", "configure"), ("machine_id", id)]);
    assert!(
        run.find("rpc", &[("method", "Get")]).is_empty(),
        "roots sampled"
    );
    assert!(run.in_trace(UNSAMPLED_TRACE).is_empty());

    let run = traced_run(&[("OTEL_TRACES_SAMPLER", "always_off")]).await;
    assert!(run.spans.is_empty(), "always_off exported {:#?}", run.spans);
}

/// A failed call's rpc span and a failed transition's span carry an error status.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn failures_carry_an_error_status() {
    let (endpoint, mut rx) = collector().await;
    let mut args: Vec<String> = ["--use-fake-backend", "--seed-count=8", "--fake-fault-hooks"]
        .into_iter()
        .chain(FAST)
        .map(str::to_owned)
        .collect();
    args.push(format!("--otlp-endpoint=http://{endpoint}"));
    let mut provider = Proc::spawn(&args, &[]);
    let mut c = provider.client().await;
    let machine = first_speculative(&mut c).await;
    create(&mut c, &machine, None).await.expect("Create");
    reach(&mut c, &machine, S::Idle, SETTLE).await;
    configure(&mut c, &machine, "fault-error", &[], None)
        .await
        .expect("Configure accepted");
    reach(&mut c, &machine, S::Failed, SETTLE).await;
    let refused = drain(&mut c, &machine, 0, None).await;
    assert!(refused.is_err(), "Drain on a Failed machine is refused");
    drop(c);
    provider.signal("TERM");
    assert_eq!(provider.wait(Duration::from_secs(15)).await, Some(0));
    let spans = received(&mut rx);
    let status = |name: &str, key: &str, value: &str| {
        let span = spans
            .iter()
            .find(|s| s.name == name && attr(s, key).as_deref() == Some(value))
            .unwrap_or_else(|| panic!("no {name} span with {key}={value}"));
        let status = span.status.clone().unwrap_or_default();
        (status.code, status.message, attr(span, "outcome"))
    };
    let (code, message, outcome) = status("transition", "kind", "configure");
    assert_eq!(
        code,
        StatusCode::Error as i32,
        "failed transition: {message}"
    );
    assert!(!message.is_empty());
    assert_eq!(outcome.as_deref(), Some("failed"));
    let (code, _, outcome) = status("rpc", "method", "Drain");
    assert_eq!(code, StatusCode::Error as i32, "refused call");
    assert_eq!(outcome.as_deref(), Some("error"));
    let (code, _, _) = status("rpc", "method", "Create");
    assert_ne!(code, StatusCode::Error as i32, "an accepted call");
}
