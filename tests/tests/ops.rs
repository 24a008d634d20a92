//! Issue 7 — the operations surface, black-box: `/metrics` parsed with a Prometheus text
//! parser, `/healthz` and `/readyz`, gRPC health across SIGTERM, TLS and mTLS with
//! certificates made here (rcgen), certificate rotation on disk and on SIGHUP, start-up
//! errors for bad TLS flags, spans at an in-process OTLP collector, no bootstrap blob in any
//! log line or span, and a handler panic answered with INTERNAL while the process serves on.

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bigfleet_libvirt_proto::v1alpha1 as pb;
use bigfleet_libvirt_proto::v1alpha1::capacity_provider_client::CapacityProviderClient;
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
use tokio_rustls::rustls;
use tonic::Code;
use tonic::transport::Endpoint;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

use crate::harness::logs::*;
use crate::harness::scrape::*;
use crate::harness::tls::*;
use crate::harness::*;

const FAST: [&str; 2] = ["--fake-delay-min=5ms", "--fake-delay-max=40ms"];
const REQUESTS: &str = "bigfleet_libvirt_grpc_requests_total";

// ---------------------------------------------------------------------------------------
// A provider process with a chosen environment and a known pid (the harness offers
// neither), for RUST_LOG runs and SIGHUP.

struct Proc {
    child: Option<Child>,
    pid: u32,
    addr: SocketAddr,
    log: Arc<Mutex<Vec<String>>>,
    reader: Option<std::thread::JoinHandle<()>>,
}

impl Proc {
    fn spawn(args: &[String], env: &[(&str, &str)]) -> Proc {
        let mut command = Command::new(binary());
        command
            .args([
                "--addr=127.0.0.1:0",
                "--metrics-addr=127.0.0.1:0",
                "--log-format=json",
            ])
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        for var in [
            "RUST_LOG",
            "OTEL_SERVICE_NAME",
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            "OTEL_SDK_DISABLED",
        ] {
            command.env_remove(var);
        }
        command.envs(env.iter().copied());
        let mut child = command.spawn().expect("spawn bigfleet-libvirt");
        let stderr = child.stderr.take().unwrap();
        let log = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&log);
        let (tx, rx) = std::sync::mpsc::channel();
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let serving = serde_json::from_str::<serde_json::Value>(&line)
                    .ok()
                    .filter(|v| v["fields"]["message"] == "serving CapacityProvider")
                    .and_then(|v| v["fields"]["addr"].as_str()?.parse::<SocketAddr>().ok());
                if let Some(addr) = serving {
                    let _ = tx.send(addr);
                }
                sink.lock().unwrap().push(line);
            }
        });
        let pid = child.id();
        let Ok(addr) = rx.recv_timeout(Duration::from_secs(30)) else {
            let _ = child.kill();
            panic!(
                "no serving line in 30s:\n{}",
                log.lock().unwrap().join("\n")
            );
        };
        Proc {
            child: Some(child),
            pid,
            addr,
            log,
            reader: Some(reader),
        }
    }

    fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(self.pid.to_string())
            .status()
            .unwrap();
        assert!(status.success(), "kill -{signal} {}", self.pid);
    }

    fn running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| c.try_wait().unwrap().is_none())
    }

    /// Waits for the exit code, then for the last log lines.
    async fn wait(&mut self, timeout: Duration) -> Option<i32> {
        let start = Instant::now();
        let child = self.child.as_mut()?;
        let code = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break status.code();
            }
            if start.elapsed() > timeout {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        self.child = None;
        if let Some(reader) = self.reader.take() {
            let _ = reader.join();
        }
        code
    }

    fn log_lines(&self) -> Vec<String> {
        self.log.lock().unwrap().clone()
    }

    async fn client(&self) -> Client {
        let channel = Endpoint::from_shared(format!("http://{}", self.addr))
            .unwrap()
            .connect_timeout(Duration::from_secs(5))
            .timeout(Duration::from_secs(30))
            .connect()
            .await
            .expect("connect");
        CapacityProviderClient::new(channel)
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

async fn first_speculative(c: &mut Client) -> String {
    list(c, &[S::Speculative], 0, b"")
        .await
        .machines
        .into_iter()
        .find(|m| !m.labels.contains_key(FAULT_LABEL))
        .expect("a Speculative machine")
        .id
}

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

async fn collector() -> (
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

fn any_text(value: Option<&AnyValue>) -> Option<String> {
    match value?.value.as_ref()? {
        any_value::Value::StringValue(s) => Some(s.clone()),
        any_value::Value::IntValue(i) => Some(i.to_string()),
        any_value::Value::BoolValue(b) => Some(b.to_string()),
        other => Some(format!("{other:?}")),
    }
}

fn attr_in(attrs: &[KeyValue], key: &str) -> Option<String> {
    attrs
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| any_text(kv.value.as_ref()))
}

fn attr(span: &Span, key: &str) -> Option<String> {
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
// 1. Metrics.

/// One Create moves `grpc_requests_total{Create,OK}` by exactly one; a stale fenced call adds
/// `code="FailedPrecondition"`; the transition leaves a CreateDomain success in
/// `api_calls_total`; machines by state sum to the seed count; process series are there.
#[tokio::test]
async fn metrics_follow_rpcs_fencing_hypervisor_calls_and_machines() {
    let server = core();
    let http = server.metrics_addr.expect("a metrics address");
    let mut c = server.client().await;
    let id = pick(&server, &mut c).await;
    let shard = unique_shard("ops-metrics");
    let create_ok = [("method", "Create"), ("code", "OK")];
    let create_fp = [("method", "Create"), ("code", "FailedPrecondition")];

    let before = scrape(http).await;
    assert!(
        before
            .parsed
            .docs
            .contains_key("bigfleet_libvirt_grpc_requests"),
        "HELP line"
    );
    create(&mut c, &id, tok(&shard, 3, 7))
        .await
        .expect("Create accepted");
    let after = scrape(http).await;
    assert_eq!(
        after.count(REQUESTS, &create_ok) - before.count(REQUESTS, &create_ok),
        1.0
    );
    assert_eq!(
        after.count(REQUESTS, &create_fp),
        before.count(REQUESTS, &create_fp)
    );

    reach(&mut c, &id, S::Idle, SETTLE).await;
    let stale = create(&mut c, &id, tok(&shard, 3, 6)).await;
    assert_eq!(
        code(&stale),
        Code::FailedPrecondition,
        "stale token: {stale:?}"
    );
    let page = scrape_until(
        http,
        "CreateDomain success and create transition counted",
        |p| {
            p.count(
                "bigfleet_libvirt_transitions_total",
                &[("kind", "create"), ("outcome", "success")],
            ) == 1.0
        },
    )
    .await;
    assert_eq!(
        page.count(REQUESTS, &create_fp) - before.count(REQUESTS, &create_fp),
        1.0
    );
    assert_eq!(
        page.count(REQUESTS, &create_ok) - before.count(REQUESTS, &create_ok),
        1.0
    );
    let api = [("op", "CreateDomain"), ("outcome", "success")];
    assert_eq!(
        page.count("bigfleet_libvirt_api_calls_total", &api),
        1.0,
        "{}",
        page.text
    );
    assert_eq!(
        page.count(
            "bigfleet_libvirt_api_duration_seconds_count",
            &[("op", "CreateDomain")]
        ),
        1.0
    );
    assert!(
        page.count(
            "bigfleet_libvirt_grpc_request_duration_seconds_count",
            &[("method", "Create")]
        ) >= 2.0
    );

    let machines = page.by_label("bigfleet_libvirt_machines", "state");
    let listed = list_all(&mut c).await.machines.len();
    assert_eq!(listed, 64, "seed count");
    assert_eq!(
        machines.values().sum::<f64>(),
        64.0,
        "machines by state: {machines:?}"
    );
    assert_eq!(machines.get("Idle"), Some(&1.0), "{machines:?}");
    assert_eq!(machines.get("Speculative"), Some(&63.0), "{machines:?}");

    // CPU time may still read 0 ticks in a young process; the others cannot be 0.
    let cpu = page.value("process_cpu_seconds_total", &[]);
    assert!(
        cpu.is_some_and(|v| v >= 0.0),
        "process_cpu_seconds_total = {cpu:?}"
    );
    for series in [
        "process_resident_memory_bytes",
        "process_virtual_memory_bytes",
        "process_start_time_seconds",
        "process_open_fds",
    ] {
        let value = page.value(series, &[]);
        assert!(value.is_some_and(|v| v > 0.0), "{series} = {value:?}");
    }
}

// ---------------------------------------------------------------------------------------
// 2. Liveness, readiness, gRPC health and graceful shutdown.

async fn health_status(
    health: &mut HealthClient<tonic::transport::Channel>,
    service: &str,
) -> Result<i32, tonic::Status> {
    let request = HealthCheckRequest {
        service: service.to_owned(),
    };
    health.check(request).await.map(|r| r.into_inner().status)
}

/// `/healthz` is `ok`; `/readyz` is `ready` once serving; on SIGTERM gRPC health goes
/// NOT_SERVING (seen on an open Watch), `/readyz` stops answering `ready`, and the process
/// exits 0 within the drain bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_and_health_flip_on_sigterm_then_exit_zero() {
    let mut server = core();
    let http = server.metrics_addr.expect("a metrics address");
    let (status, _, body) = http_get(http, "/healthz").await.unwrap();
    assert_eq!((status, body.as_str()), (200, "ok\n"));
    let (status, _, body) = http_get(http, "/readyz").await.unwrap();
    assert_eq!((status, body.as_str()), (200, "ready\n"));

    let channel = Endpoint::from_shared(format!("http://{}", server.addr))
        .unwrap()
        .connect_timeout(Duration::from_secs(5))
        .timeout(Duration::from_secs(5))
        .connect()
        .await
        .unwrap();
    let mut health = HealthClient::new(channel);
    let serving = ServingStatus::Serving as i32;
    assert_eq!(health_status(&mut health, "").await.unwrap(), serving);
    let named = health_status(&mut health, "bigfleet.v1alpha1.CapacityProvider").await;
    assert_eq!(named.unwrap(), serving);
    let mut watch = health
        .watch(HealthCheckRequest {
            service: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    let first = watch.message().await.unwrap().expect("a first status");
    assert_eq!(first.status, serving);

    server.terminate();
    let next = tokio::time::timeout(Duration::from_secs(5), watch.message()).await;
    let next = next
        .expect("a status within 5s of SIGTERM")
        .expect("the watch stays open");
    assert_eq!(
        next.map(|r| r.status),
        Some(ServingStatus::NotServing as i32),
        "health after SIGTERM"
    );
    // Readiness flipped before health did: the side server now answers `not ready` or has
    // already closed its port.
    match http_get(http, "/readyz").await {
        Ok((status, _, body)) => assert_eq!((status, body.as_str()), (503, "not ready\n")),
        Err(e) => println!("/readyz after SIGTERM: port closed ({e})"),
    }
    // A unary Check now sees NOT_SERVING, or is refused by a server that is going away.
    match health_status(&mut health, "").await {
        Ok(status) => assert_eq!(status, ServingStatus::NotServing as i32),
        Err(e) => println!("health Check after SIGTERM refused: {e:?}"),
    }
    drop(watch);
    drop(health);

    let start = Instant::now();
    let code = tokio::task::block_in_place(|| server.wait(Duration::from_secs(12)));
    assert_eq!(
        code,
        Some(0),
        "exit code after SIGTERM; log:\n{}",
        server.log_text()
    );
    assert!(
        start.elapsed() < Duration::from_secs(11),
        "drain took {:?}",
        start.elapsed()
    );
    logged(
        || lines_of(&server),
        Duration::from_secs(2),
        |m, _| m == "shutting down",
    )
    .await;
}

// ---------------------------------------------------------------------------------------
// 3. TLS and mTLS.

/// mTLS: no client certificate, an untrusted one, TLS 1.2 only and plaintext are refused;
/// a trusted client lists (TLS 1.3, ALPN h2), and the refusals do not hurt the server.
#[tokio::test]
async fn mtls_refuses_untrusted_clients_and_serves_trusted_ones() {
    let ca = Ca::new("ops test CA");
    let server_leaf = ca.server("ops server", 1);
    let trusted = ca.client_with_uris("ops shard", &["bigfleet://shard/ops"]);
    let rogue = Ca::new("rogue CA").client("rogue shard");
    let dir = tempfile::tempdir().unwrap();
    let args = [
        "--use-fake-backend".to_owned(),
        "--seed-count=4".to_owned(),
        arg(
            "--tls-cert",
            &write(dir.path(), "server.pem", &server_leaf.cert_pem),
        ),
        arg(
            "--tls-key",
            &write(dir.path(), "server.key", &server_leaf.key_pem),
        ),
        arg("--tls-ca", &write(dir.path(), "ca.pem", &ca.pem)),
    ];
    let server = Server::start(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert_eq!(serving_fields(&server)["security"], "mTLS");
    let addr = server.addr;

    let listed = tls_list(addr, &ca.pem, Some(&trusted)).await;
    assert!(
        listed.as_ref().is_ok_and(|n| *n > 0),
        "trusted client: {listed:?}"
    );
    let stream = handshake(addr, rustls_client(&ca.pem, Some(&trusted), false))
        .await
        .expect("TLS 1.3 handshake with a trusted client certificate");
    let (_, session) = stream.get_ref();
    assert_eq!(
        session.protocol_version(),
        Some(rustls::ProtocolVersion::TLSv1_3)
    );
    assert_eq!(session.alpn_protocol(), Some(&b"h2"[..]));
    assert_eq!(
        session.peer_certificates().unwrap()[0].as_ref(),
        server_leaf.der.as_slice()
    );
    drop(stream);

    let anonymous = tls_list(addr, &ca.pem, None).await;
    assert!(
        anonymous.is_err(),
        "a client without a certificate was served: {anonymous:?}"
    );
    let untrusted = tls_list(addr, &ca.pem, Some(&rogue)).await;
    assert!(
        untrusted.is_err(),
        "a client with an untrusted certificate was served"
    );
    let tls12 = handshake(addr, rustls_client(&ca.pem, Some(&trusted), true)).await;
    assert!(
        tls12.is_err(),
        "a TLS 1.2-only client completed a handshake"
    );
    let plain = plaintext_list(addr).await;
    assert!(plain.is_err(), "a plaintext client was served: {plain:?}");

    let again = tls_list(addr, &ca.pem, Some(&trusted)).await;
    assert!(
        again.is_ok(),
        "trusted client after the refusals: {again:?}"
    );
}

/// TLS without `--tls-ca`: a client without a certificate is served; plaintext is refused.
#[tokio::test]
async fn tls_without_ca_serves_anonymous_clients_and_refuses_plaintext() {
    let ca = Ca::new("ops test CA");
    let leaf = ca.server("ops server", 2);
    let dir = tempfile::tempdir().unwrap();
    let args = [
        "--use-fake-backend".to_owned(),
        "--seed-count=4".to_owned(),
        arg(
            "--tls-cert",
            &write(dir.path(), "server.pem", &leaf.cert_pem),
        ),
        arg("--tls-key", &write(dir.path(), "server.key", &leaf.key_pem)),
    ];
    let server = Server::start(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert_eq!(serving_fields(&server)["security"], "TLS");
    let listed = tls_list(server.addr, &ca.pem, None).await;
    assert!(
        listed.as_ref().is_ok_and(|n| *n > 0),
        "TLS client: {listed:?}"
    );
    let plain = plaintext_list(server.addr).await;
    assert!(plain.is_err(), "a plaintext client was served: {plain:?}");
    let tls12 = handshake(server.addr, rustls_client(&ca.pem, None, true)).await;
    assert!(
        tls12.is_err(),
        "a TLS 1.2-only client completed a handshake"
    );
}

// ---------------------------------------------------------------------------------------
// 4. Rotation.

async fn wait_for_cert(addr: SocketAddr, ca_pem: &str, want: &Leaf, within: Duration) -> Duration {
    let start = Instant::now();
    loop {
        let served = served_cert(addr, ca_pem).await;
        if served.as_deref() == Ok(want.der.as_slice()) {
            return start.elapsed();
        }
        assert!(
            start.elapsed() < within,
            "the new certificate was not served within {within:?}; last: {:?}",
            served.map(|d| d.len())
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn tls_server_files(dir: &Path, leaf: &Leaf) -> (PathBuf, PathBuf) {
    (
        write(dir, "server.pem", &leaf.cert_pem),
        write(dir, "server.key", &leaf.key_pem),
    )
}

/// A certificate replaced on disk is served to new connections within ~5 s without a
/// restart; a garbage certificate written after it is refused with a warning and the
/// previous certificate stays in service.
#[tokio::test]
async fn rotated_certificate_is_served_without_restart_and_garbage_keeps_the_last_good_one() {
    let ca = Ca::new("ops rotation CA");
    let (a, b) = (
        ca.server("ops server A", 0xA1),
        ca.server("ops server B", 0xB2),
    );
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = tls_server_files(dir.path(), &a);
    let args = [
        "--use-fake-backend".to_owned(),
        "--seed-count=4".to_owned(),
        arg("--tls-cert", &cert),
        arg("--tls-key", &key),
    ];
    let server = Server::start(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert_eq!(served_cert(server.addr, &ca.pem).await.unwrap(), a.der);

    replace(&key, &b.key_pem, None);
    replace(&cert, &b.cert_pem, None);
    let took = wait_for_cert(server.addr, &ca.pem, &b, Duration::from_secs(5)).await;
    println!("rotation served after {took:?}");
    let reload = |m: &str, _: &serde_json::Value| m == "reloaded TLS certificates";
    logged(|| lines_of(&server), Duration::from_secs(2), reload).await;

    replace(&cert, "this is not a certificate\n", None);
    let failed = |m: &str, _: &serde_json::Value| m.starts_with("TLS reload failed");
    let warning = logged(|| lines_of(&server), Duration::from_secs(6), failed).await;
    assert_eq!(warning["level"], "WARN", "{warning}");
    assert!(
        warning["fields"]["error"]
            .as_str()
            .unwrap()
            .contains("--tls-cert"),
        "{warning}"
    );
    assert_eq!(
        served_cert(server.addr, &ca.pem).await.unwrap(),
        b.der,
        "kept B"
    );
    let listed = tls_list(server.addr, &ca.pem, None).await;
    assert!(
        listed.is_ok(),
        "still serving after a bad rotation: {listed:?}"
    );
}

/// SIGHUP reloads at once, even when the files' modification times did not change (so the
/// poller cannot be what picked the new certificate up).
#[tokio::test]
async fn sighup_reloads_the_certificate() {
    let ca = Ca::new("ops sighup CA");
    let (a, b) = (
        ca.server("ops server A", 0xA3),
        ca.server("ops server B", 0xB4),
    );
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = tls_server_files(dir.path(), &a);
    let args = [
        "--use-fake-backend".to_owned(),
        "--seed-count=4".to_owned(),
        arg("--tls-cert", &cert),
        arg("--tls-key", &key),
    ];
    let mut provider = Proc::spawn(&args, &[]);
    assert_eq!(served_cert(provider.addr, &ca.pem).await.unwrap(), a.der);

    let mtime = |p: &Path| std::fs::metadata(p).unwrap().modified().unwrap();
    let (cert_time, key_time) = (mtime(&cert), mtime(&key));
    replace(&key, &b.key_pem, Some(key_time));
    replace(&cert, &b.cert_pem, Some(cert_time));
    assert_eq!((mtime(&cert), mtime(&key)), (cert_time, key_time));

    provider.signal("HUP");
    wait_for_cert(provider.addr, &ca.pem, &b, Duration::from_secs(3)).await;
    assert!(provider.running(), "SIGHUP must not end the process");
    let by_hangup = |m: &str, v: &serde_json::Value| {
        m == "reloaded TLS certificates" && v["fields"]["reason"] == "SIGHUP"
    };
    logged(|| provider.log_lines(), Duration::from_secs(2), by_hangup).await;
}

// ---------------------------------------------------------------------------------------
// 5. Start-up errors.

/// Half a TLS configuration, a CA without cert/key, unreadable files, files without PEM
/// material and a key that does not match the certificate each stop the binary before it
/// serves, with a non-zero exit and one stderr line naming the flag.
#[test]
fn bad_tls_flags_fail_at_startup_with_one_line_naming_the_flag() {
    let ca = Ca::new("ops startup CA");
    let (a, b) = (ca.server("ops server A", 5), ca.server("ops server B", 6));
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let cert = arg("--tls-cert", &write(d, "a.pem", &a.cert_pem));
    let key = arg("--tls-key", &write(d, "a.key", &a.key_pem));
    let other_key = arg("--tls-key", &write(d, "b.key", &b.key_pem));
    let ca_file = arg("--tls-ca", &write(d, "ca.pem", &ca.pem));
    let junk = write(d, "junk.pem", "hello, I am not PEM\n");
    let missing = d.join("missing.pem");
    let cases: Vec<(&str, Vec<String>, &str)> = vec![
        ("cert without key", vec![cert.clone()], "--tls-key"),
        ("key without cert", vec![key.clone()], "--tls-cert"),
        ("CA without cert and key", vec![ca_file.clone()], "--tls-ca"),
        (
            "CA and cert without key",
            vec![cert.clone(), ca_file.clone()],
            "--tls-key",
        ),
        (
            "missing cert file",
            vec![arg("--tls-cert", &missing), key.clone()],
            "--tls-cert",
        ),
        (
            "key is a directory",
            vec![cert.clone(), arg("--tls-key", d)],
            "--tls-key",
        ),
        (
            "missing CA file",
            vec![cert.clone(), key.clone(), arg("--tls-ca", &missing)],
            "--tls-ca",
        ),
        (
            "cert without PEM",
            vec![arg("--tls-cert", &junk), key.clone()],
            "--tls-cert",
        ),
        (
            "key without PEM",
            vec![cert.clone(), arg("--tls-key", &junk)],
            "--tls-key",
        ),
        (
            "CA without PEM",
            vec![cert.clone(), key.clone(), arg("--tls-ca", &junk)],
            "--tls-ca",
        ),
        (
            "key not matching the cert",
            vec![cert.clone(), other_key],
            "--tls-key",
        ),
    ];
    let children: Vec<Child> = cases
        .iter()
        .map(|(_, args, _)| {
            Command::new(binary())
                .args([
                    "--use-fake-backend",
                    "--addr=127.0.0.1:0",
                    "--metrics-addr=127.0.0.1:0",
                ])
                .args(args)
                .env_remove("RUST_LOG")
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    for ((case, args, flag), child) in cases.iter().zip(children) {
        let (status, stderr) = exit_within(child, Duration::from_secs(20));
        let status = status.unwrap_or_else(|| panic!("{case}: still running after 20s ({args:?})"));
        let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
        assert!(
            status.code().is_some_and(|c| c != 0),
            "{case}: exit {status:?}; {stderr}"
        );
        assert_eq!(
            lines.len(),
            1,
            "{case}: want one stderr line, got:\n{stderr}"
        );
        assert!(
            lines[0].contains(flag),
            "{case}: the line does not name {flag}: {}",
            lines[0]
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

// ---------------------------------------------------------------------------------------
// 8. Panics.

/// With fault hooks, a Get of `conformance.fault/panic` panics in the handler: the caller
/// gets INTERNAL "internal error", `panics_total` counts it, and the process serves on.
#[tokio::test]
async fn handler_panic_is_answered_internal_counted_and_survived() {
    let server = fault();
    let http = server.metrics_addr.expect("a metrics address");
    let mut c = server.client().await;
    assert_eq!(
        scrape(http)
            .await
            .value("bigfleet_libvirt_panics_total", &[]),
        Some(0.0)
    );
    let status = get(&mut c, "conformance.fault/panic")
        .await
        .expect_err("the injected panic must not answer OK");
    assert_eq!(status.code(), Code::Internal, "{status:?}");
    assert_eq!(status.message(), "internal error");
    let page = scrape(http).await;
    assert_eq!(page.value("bigfleet_libvirt_panics_total", &[]), Some(1.0));
    assert_eq!(
        page.count(REQUESTS, &[("method", "Get"), ("code", "Internal")]),
        1.0
    );
    assert!(
        !list_all(&mut c).await.machines.is_empty(),
        "List on the same connection"
    );
    let mut fresh = server.client().await;
    assert!(
        !list_all(&mut fresh).await.machines.is_empty(),
        "List on a new connection"
    );
    let recovered = |m: &str, _: &serde_json::Value| m == "recovered panic in gRPC handler";
    logged(|| lines_of(&server), Duration::from_secs(2), recovered).await;
}

/// A port already in use is fatal: the binary exits non-zero with an error naming the flag
/// whose address could not be bound, for the gRPC port and for the metrics port.
#[test]
fn a_busy_port_is_fatal_and_names_its_flag() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let busy = taken.local_addr().unwrap().to_string();
    let cases = [
        (
            "--addr",
            format!("--addr={busy}"),
            "--metrics-addr=127.0.0.1:0".to_owned(),
        ),
        (
            "--metrics-addr",
            "--addr=127.0.0.1:0".to_owned(),
            format!("--metrics-addr={busy}"),
        ),
    ];
    for (flag, addr, metrics) in cases {
        let output = Command::new(binary())
            .args([
                "--use-fake-backend",
                "--seed-count=4",
                addr.as_str(),
                metrics.as_str(),
            ])
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert!(
            !output.status.success(),
            "{flag}: a busy port must stop the binary"
        );
        let stderr = String::from_utf8_lossy(&output.stderr);
        let last = stderr.lines().last().unwrap_or_default();
        assert!(
            last.starts_with("bigfleet-libvirt: ") && last.contains(flag) && last.contains(&busy),
            "{flag}: the last stderr line must name the flag and the address: {stderr}"
        );
    }
    drop(taken);
}
