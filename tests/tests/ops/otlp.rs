//! Parts 6–7: OTLP spans and the bootstrap blob: an in-process OTLP/gRPC trace collector the
//! provider exports to, the spans it must receive, and no bootstrap blob (in any encoding)
//! in a log line or a span.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::Duration;

use bigfleet_libvirt_proto::v1alpha1 as pb;
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
use opentelemetry_proto::tonic::trace::v1::Span;
use pb::MachineState as S;
use prost::Message;
use tokio::net::TcpListener;

use crate::harness::*;

use super::*;

// ---------------------------------------------------------------------------------------
// An in-process OTLP/gRPC trace collector: the provider exports its spans here.

struct Capture(tokio::sync::mpsc::UnboundedSender<ExportTraceServiceRequest>);

#[tonic::async_trait]
impl TraceService for Capture {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let _ = self.0.send(request.into_inner());
        Ok(tonic::Response::new(ExportTraceServiceResponse {
            partial_success: None,
        }))
    }
}

pub(super) async fn collector() -> (
    SocketAddr,
    tokio::sync::mpsc::UnboundedReceiver<ExportTraceServiceRequest>,
) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let server = tonic::transport::Server::builder()
        .add_service(TraceServiceServer::new(Capture(tx)))
        .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener));
    tokio::spawn(server);
    (addr, rx)
}

pub(super) fn any_text(value: Option<&AnyValue>) -> Option<String> {
    match value?.value.as_ref()? {
        any_value::Value::StringValue(s) => Some(s.clone()),
        any_value::Value::IntValue(i) => Some(i.to_string()),
        any_value::Value::BoolValue(b) => Some(b.to_string()),
        other => Some(format!("{other:?}")),
    }
}

pub(super) fn attr_in(attrs: &[KeyValue], key: &str) -> Option<String> {
    attrs
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| any_text(kv.value.as_ref()))
}

pub(super) fn attr(span: &Span, key: &str) -> Option<String> {
    attr_in(&span.attributes, key)
}

/// What one OTLP run produced.
struct OtlpRun {
    requests: Vec<ExportTraceServiceRequest>,
    log: Vec<String>,
    machine: String,
    create_op: String,
    configure_op: String,
    exit: Option<i32>,
}

impl OtlpRun {
    fn spans(&self) -> Vec<&Span> {
        self.requests
            .iter()
            .flat_map(|r| &r.resource_spans)
            .flat_map(|r| &r.scope_spans)
            .flat_map(|s| &s.spans)
            .collect()
    }

    /// Spans named `name` whose attributes include every `(key, value)`.
    fn find(&self, name: &str, want: &[(&str, &str)]) -> Vec<&Span> {
        self.spans()
            .into_iter()
            .filter(|s| s.name == name)
            .filter(|s| want.iter().all(|(k, v)| attr(s, k).as_deref() == Some(*v)))
            .collect()
    }

    fn one(&self, name: &str, want: &[(&str, &str)]) -> &Span {
        let found = self.find(name, want);
        assert!(
            !found.is_empty(),
            "no `{name}` span with {want:?}; exported spans: {:#?}",
            self.spans()
                .iter()
                .map(|s| (&s.name, &s.attributes))
                .collect::<Vec<_>>()
        );
        found[0]
    }
}

/// Starts a provider exporting to a fresh collector, walks one machine through Create,
/// Configure (with `blob`) and Get, SIGTERMs it (it flushes spans on the way out) and
/// returns everything that arrived.
async fn otlp_run(env: &[(&str, &str)], blob: &[u8]) -> OtlpRun {
    let (endpoint, mut rx) = collector().await;
    let mut args: Vec<String> = ["--use-fake-backend", "--seed-count=8"]
        .into_iter()
        .chain(FAST)
        .map(str::to_owned)
        .collect();
    args.push(format!("--otlp-endpoint=http://{endpoint}"));
    let mut provider = Proc::spawn(&args, env);
    let mut c = provider.client().await;
    let machine = first_speculative(&mut c).await;
    let create_op = create(&mut c, &machine, None)
        .await
        .expect("Create accepted")
        .operation_id;
    reach(&mut c, &machine, S::Idle, SETTLE).await;
    let configure_op = configure_map(
        &mut c,
        &machine,
        "ops-cluster",
        HashMap::new(),
        blob.to_vec(),
        None,
    )
    .await
    .expect("Configure accepted")
    .operation_id;
    reach(&mut c, &machine, S::Configured, SETTLE).await;
    get(&mut c, &machine).await.expect("Get");
    drop(c);
    provider.signal("TERM");
    let exit = provider.wait(Duration::from_secs(15)).await;
    let mut requests = Vec::new();
    while let Ok(request) = rx.try_recv() {
        requests.push(request);
    }
    OtlpRun {
        requests,
        log: provider.log_lines(),
        machine,
        create_op,
        configure_op,
        exit,
    }
}

// ---------------------------------------------------------------------------------------
// The recognisable bootstrap blob and every encoding of it worth looking for.

const MARKER: &str = "SECRET-BLOB-";

/// 7200 bytes: the 12-byte marker repeated (12 is a multiple of 3, see `needles`).
fn secret_blob() -> Vec<u8> {
    MARKER.repeat(600).into_bytes()
}

fn base64(bytes: &[u8], url_safe: bool) -> String {
    let alphabet: &[u8; 64] = if url_safe {
        b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
    } else {
        b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
    };
    bytes
        .chunks(3)
        .flat_map(|chunk| {
            let n = chunk
                .iter()
                .enumerate()
                .fold(0u32, |n, (i, b)| n | u32::from(*b) << (16 - 8 * i));
            (0..=chunk.len()).map(move |i| alphabet[((n >> (18 - 6 * i)) & 63) as usize] as char)
        })
        .collect()
}

/// Text that would betray the blob: the marker itself (any case), its hex, its Debug byte
/// list, and its base64 at every phase (the blob has period 12, a multiple of 3, so any
/// base64 of any long slice of it contains one of these).
fn needles(blob: &[u8]) -> Vec<String> {
    let marker = &blob[..11];
    let hex: String = marker.iter().map(|b| format!("{b:02x}")).collect();
    let decimal = marker
        .iter()
        .map(u8::to_string)
        .collect::<Vec<_>>()
        .join(", ");
    let mut needles = vec![MARKER[..11].to_ascii_lowercase(), hex, decimal];
    for phase in 0..12 {
        for url_safe in [false, true] {
            needles.push(base64(&blob[phase..phase + 48], url_safe).to_ascii_lowercase());
        }
    }
    needles
}

/// The needles found in `haystack` (compared case-insensitively).
fn leaked(haystack: &str, needles: &[String]) -> Vec<String> {
    let haystack = haystack.to_ascii_lowercase();
    needles
        .iter()
        .filter(|n| haystack.contains(n.as_str()))
        .cloned()
        .collect()
}

fn assert_no_leak(what: &str, run: &OtlpRun, blob: &[u8]) {
    let needles = needles(blob);
    for line in &run.log {
        let found = leaked(line, &needles);
        assert!(
            found.is_empty(),
            "{what}: log line leaks the blob ({found:?}): {line}"
        );
    }
    let wire: Vec<u8> = run
        .requests
        .iter()
        .flat_map(Message::encode_to_vec)
        .collect();
    assert!(
        !wire.windows(11).any(|w| w == &blob[..11]),
        "{what}: an exported span carries the blob bytes"
    );
    for span in run.spans() {
        let found = leaked(&format!("{span:?}"), &needles);
        assert!(
            found.is_empty(),
            "{what}: span `{}` leaks the blob ({found:?}): {span:?}",
            span.name
        );
    }
}

// ---------------------------------------------------------------------------------------
// 6–7. OTLP spans and the bootstrap blob.

/// The Create RPC's span and the `create` transition span under it, checked.
fn create_rpc_and_transition(run: &OtlpRun) -> (&Span, &Span) {
    let id = run.machine.as_str();
    let rpc = run.one(
        "rpc",
        &[
            ("method", "Create"),
            ("machine_id", id),
            ("operation_id", run.create_op.as_str()),
            ("code", "OK"),
        ],
    );
    let create = [
        ("kind", "create"),
        ("machine_id", id),
        ("operation_id", run.create_op.as_str()),
    ];
    let transition = run.one("transition", &create);
    assert_eq!(
        transition.trace_id, rpc.trace_id,
        "transition in the Create trace"
    );
    assert_eq!(
        transition.parent_span_id, rpc.span_id,
        "transition under the Create rpc"
    );
    (rpc, transition)
}

/// The `hypervisor` CreateDomain span sits under the `create` transition, in the same trace.
fn assert_hypervisor_span(run: &OtlpRun) {
    let (rpc, transition) = create_rpc_and_transition(run);
    let id = run.machine.as_str();
    let op = [
        ("op", "CreateDomain"),
        ("machine_id", id),
        ("operation_id", run.create_op.as_str()),
    ];
    let call = run.one("hypervisor", &op);
    assert_eq!(
        call.trace_id, rpc.trace_id,
        "hypervisor call in the Create trace"
    );
    assert_eq!(
        call.parent_span_id, transition.span_id,
        "hypervisor call under its transition"
    );
    let id = run.machine.as_str();
    let configure = [
        ("op", "Configure"),
        ("machine_id", id),
        ("operation_id", run.configure_op.as_str()),
    ];
    run.one("hypervisor", &configure);
}

/// `rpc` spans (method, machine_id, code) and `transition` spans (kind, machine_id,
/// operation_id) parented by their RPC reach the collector under service.name =
/// bigfleet-libvirt, flushed by the SIGTERM shutdown.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn otlp_exports_rpc_and_transition_spans() {
    let run = otlp_run(&[], &secret_blob()).await;
    assert_eq!(
        run.exit,
        Some(0),
        "exit after SIGTERM; log:\n{}",
        run.log.join("\n")
    );
    assert!(
        !run.requests.is_empty(),
        "no export arrived; log:\n{}",
        run.log.join("\n")
    );
    for resource in run.requests.iter().flat_map(|r| &r.resource_spans) {
        let attrs = resource
            .resource
            .as_ref()
            .map_or(&[][..], |r| &r.attributes[..]);
        assert_eq!(
            attr_in(attrs, "service.name").as_deref(),
            Some("bigfleet-libvirt")
        );
    }
    let id = run.machine.as_str();
    create_rpc_and_transition(&run);
    run.one(
        "rpc",
        &[
            ("method", "Configure"),
            ("machine_id", id),
            ("operation_id", run.configure_op.as_str()),
            ("code", "OK"),
        ],
    );
    run.one(
        "rpc",
        &[("method", "Get"), ("machine_id", id), ("code", "OK")],
    );
    run.one("rpc", &[("method", "List"), ("code", "OK")]);
    let configure = [
        ("kind", "configure"),
        ("machine_id", id),
        ("operation_id", run.configure_op.as_str()),
    ];
    run.one("transition", &configure);
}

/// With OTLP export on and the default log level, every hypervisor call is exported as a
/// `hypervisor` span (op, machine_id, operation_id) under its transition.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn otlp_exports_hypervisor_spans_at_the_default_log_level() {
    let run = otlp_run(&[], &secret_blob()).await;
    assert_eq!(run.exit, Some(0));
    assert_hypervisor_span(&run);
}

/// A recognisable multi-kilobyte bootstrap blob sent in Configure shows up in no log line
/// and no exported span, in text, hex, byte-list or base64 form — at the default level and
/// with RUST_LOG=trace.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bootstrap_blob_appears_in_no_log_line_or_span() {
    let blob = secret_blob();
    // The needles themselves: known base64 answers, and they find the blob in every form.
    assert_eq!(base64(b"SECRET-BLOB-", false), "U0VDUkVULUJMT0It");
    assert_eq!(base64(&[251, 255], true), "-_8");
    let needles = needles(&blob);
    for form in [
        String::from_utf8_lossy(&blob).into_owned(),
        base64(&blob[5..], false),
        base64(&blob[7..], true),
        format!("{:?}", &blob[..40]),
    ] {
        assert!(
            !leaked(&form, &needles).is_empty(),
            "needles miss {form:.40}"
        );
    }
    for (what, env) in [
        ("default level", &[][..]),
        ("RUST_LOG=trace", &[("RUST_LOG", "trace")][..]),
    ] {
        let run = otlp_run(env, &blob).await;
        assert_eq!(run.exit, Some(0), "{what}: exit after SIGTERM");
        assert!(!run.requests.is_empty(), "{what}: no spans exported");
        assert!(
            run.log.iter().any(|l| l.contains("Configure")),
            "{what}: the Configure RPC was logged"
        );
        assert_no_leak(what, &run, &blob);
        if what != "default level" {
            let traced = run
                .log
                .iter()
                .filter(|l| l.contains(r#""level":"TRACE""#))
                .count();
            assert!(traced > 0, "{what}: RUST_LOG did not reach the binary");
            // At trace level the hypervisor spans exist, so they were searched too.
            assert_hypervisor_span(&run);
        }
    }
}
