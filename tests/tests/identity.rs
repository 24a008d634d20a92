//! Issue 15 — shard identity under mTLS, black-box: the real binary with `--tls-ca` and
//! client certificates made here (rcgen), each carrying chosen `bigfleet://` URI SANs. One
//! test per row of the identity table (both columns), one per column (every identity), then
//! the fence mark a refused call must not move, two SANs, no SAN with health and reflection
//! still answering, `--client-identity=off`, the refusal counter and log line, the flag
//! without `--tls-ca`, and certificate reload with enforcement on.

use std::collections::BTreeMap;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use bigfleet_libvirt_proto::v1alpha1 as pb;
use pb::MachineState as S;
use tonic::Code;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_reflection::pb::v1::ServerReflectionRequest;
use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;

use crate::harness::logs::{lines_of, logged, serving_fields};
use crate::harness::scrape::{Scrape, scrape};
use crate::harness::tls::{
    Ca, Leaf, arg, handshake, replace, rustls_client, tls_channel, tls_client, tls_list, write,
};
use crate::harness::*;

const ALPHA: &str = "bigfleet://shard/alpha";
const BETA: &str = "bigfleet://shard/beta";
const ADMIN: &str = "bigfleet://admin";
const READONLY: &str = "bigfleet://readonly";
const CLUSTER: &str = "bigfleet://cluster/prod-1";
const DENIED: &str = "bigfleet_libvirt_authz_denied_total";

/// A provider serving mTLS (fake backend) and the CA its clients' certificates come from.
struct Mtls {
    server: Server,
    ca: Ca,
    dir: tempfile::TempDir,
}

impl Mtls {
    fn start(extra: &[&str]) -> Mtls {
        let ca = Ca::new("identity test CA");
        let leaf = ca.server("identity server", 1);
        let dir = tempfile::tempdir().unwrap();
        let mut args = vec![
            "--use-fake-backend".to_owned(),
            "--seed-count=48".to_owned(),
            "--fake-delay-min=5ms".to_owned(),
            "--fake-delay-max=40ms".to_owned(),
            arg(
                "--tls-cert",
                &write(dir.path(), "server.pem", &leaf.cert_pem),
            ),
            arg("--tls-key", &write(dir.path(), "server.key", &leaf.key_pem)),
            arg("--tls-ca", &write(dir.path(), "ca.pem", &ca.pem)),
        ];
        args.extend(extra.iter().map(|a| (*a).to_owned()));
        let server = Server::start(&args.iter().map(String::as_str).collect::<Vec<_>>());
        Mtls { server, ca, dir }
    }

    /// A client certificate whose only URI SANs are `uris`.
    fn cert(&self, uris: &[&str]) -> Leaf {
        self.ca.client_with_uris("identity client", uris)
    }

    /// A client presenting a certificate with these URI SANs.
    async fn client(&self, uris: &[&str]) -> Client {
        tls_client(self.server.addr, &self.ca.pem, &self.cert(uris)).await
    }
}

/// The refusal of a call made by `identity`: PERMISSION_DENIED naming it and the need.
#[track_caller]
fn assert_denied<T: std::fmt::Debug>(result: Result<T, tonic::Status>, identity: &str) {
    let status = result.expect_err("the call was allowed");
    assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");
    assert!(
        status.message().contains(identity) && status.message().contains("needs"),
        "the message names neither {identity:?} nor the need: {}",
        status.message()
    );
}

async fn state_of(c: &mut Client, id: &str) -> S {
    state(&get(c, id).await.expect("Get"))
}

/// A machine the admin walked to Idle.
async fn idle(mtls: &Mtls, admin: &mut Client) -> String {
    walk_to_idle(&mtls.server, admin).await
}

// ---------------------------------------------------------------------------------------
// Rows of the table.

/// `shard/alpha`: every mutation under shard_id `alpha` goes through; under `beta` or with
/// an empty shard_id each is refused and changes nothing; Get and List are allowed.
#[tokio::test]
async fn row_shard_mutates_only_under_its_own_shard_id_and_reads() {
    let mtls = Mtls::start(&[]);
    let mut alpha = mtls.client(&[ALPHA]).await;
    let id = pick(&mtls.server, &mut alpha).await;

    assert_denied(create(&mut alpha, &id, tok("beta", 1, 1)).await, ALPHA);
    assert_denied(create(&mut alpha, &id, None).await, ALPHA);
    assert_eq!(state_of(&mut alpha, &id).await, S::Speculative);
    create(&mut alpha, &id, tok("alpha", 1, 1))
        .await
        .expect("own Create");
    reach(&mut alpha, &id, S::Idle, SETTLE).await;

    assert_denied(
        configure(&mut alpha, &id, "c1", &[], tok("beta", 1, 2)).await,
        ALPHA,
    );
    assert_denied(configure(&mut alpha, &id, "c1", &[], None).await, ALPHA);
    assert_eq!(state_of(&mut alpha, &id).await, S::Idle);
    configure(&mut alpha, &id, "c1", &[], tok("alpha", 1, 2))
        .await
        .expect("own Configure");
    reach(&mut alpha, &id, S::Configured, SETTLE).await;

    assert_denied(drain(&mut alpha, &id, 0, tok("beta", 1, 3)).await, ALPHA);
    assert_denied(drain(&mut alpha, &id, 0, None).await, ALPHA);
    assert_eq!(state_of(&mut alpha, &id).await, S::Configured);
    drain(&mut alpha, &id, 0, tok("alpha", 1, 3))
        .await
        .expect("own Drain");
    reach(&mut alpha, &id, S::Idle, SETTLE).await;

    assert_denied(delete(&mut alpha, &id, tok("beta", 1, 4)).await, ALPHA);
    assert_denied(delete(&mut alpha, &id, None).await, ALPHA);
    assert_eq!(state_of(&mut alpha, &id).await, S::Idle);
    delete(&mut alpha, &id, tok("alpha", 1, 4))
        .await
        .expect("own Delete");
    reach(&mut alpha, &id, S::Speculative, SETTLE).await;

    assert!(!list_all(&mut alpha).await.machines.is_empty());
}

/// `admin`: every mutation, fenced under any shard or unfenced, and every read.
#[tokio::test]
async fn row_admin_mutates_fenced_or_not_and_reads() {
    let mtls = Mtls::start(&[]);
    let mut admin = mtls.client(&[ADMIN]).await;
    let id = pick(&mtls.server, &mut admin).await;
    create(&mut admin, &id, None)
        .await
        .expect("unfenced Create");
    reach(&mut admin, &id, S::Idle, SETTLE).await;
    configure(&mut admin, &id, "c1", &[], tok("beta", 1, 1))
        .await
        .expect("Configure for beta");
    reach(&mut admin, &id, S::Configured, SETTLE).await;
    drain(&mut admin, &id, 0, tok("gamma", 1, 1))
        .await
        .expect("Drain for gamma");
    reach(&mut admin, &id, S::Idle, SETTLE).await;
    delete(&mut admin, &id, None)
        .await
        .expect("unfenced Delete");
    reach(&mut admin, &id, S::Speculative, SETTLE).await;
    assert!(!list_all(&mut admin).await.machines.is_empty());
}

/// `readonly` and `cluster/…`: every mutation refused, whatever the shard_id, with nothing
/// changed; Get and List allowed.
#[tokio::test]
async fn row_readonly_and_cluster_identities_only_read() {
    let mtls = Mtls::start(&[]);
    let mut admin = mtls.client(&[ADMIN]).await;
    let idle_id = idle(&mtls, &mut admin).await;
    let spare = pick(&mtls.server, &mut admin).await;
    for identity in [READONLY, CLUSTER] {
        let mut c = mtls.client(&[identity]).await;
        for token in [None, tok("prod-1", 1, 1), tok("alpha", 9, 9)] {
            assert_denied(create(&mut c, &spare, token.clone()).await, identity);
            assert_denied(
                configure(&mut c, &idle_id, "prod-1", &[], token.clone()).await,
                identity,
            );
            assert_denied(drain(&mut c, &idle_id, 0, token.clone()).await, identity);
            assert_denied(delete(&mut c, &idle_id, token).await, identity);
        }
        assert_eq!(state_of(&mut c, &spare).await, S::Speculative, "{identity}");
        assert_eq!(state_of(&mut c, &idle_id).await, S::Idle, "{identity}");
        assert!(!list_all(&mut c).await.machines.is_empty(), "{identity}");
    }
}

/// No `bigfleet://` SAN (no SAN at all, or only other schemes), two of them, or one that is
/// not a known identity: every call refused, reads included.
#[tokio::test]
async fn row_no_several_or_unknown_identities_are_refused_everything() {
    let mtls = Mtls::start(&[]);
    let mut admin = mtls.client(&[ADMIN]).await;
    let idle_id = idle(&mtls, &mut admin).await;
    let spare = pick(&mtls.server, &mut admin).await;
    let cases: [(&[&str], &str); 4] = [
        (&[], "no bigfleet:// URI SAN"),
        (
            &["spiffe://example.org/shard/alpha"],
            "no bigfleet:// URI SAN",
        ),
        (&[ALPHA, ADMIN], "2 bigfleet:// URI SANs"),
        (&["bigfleet://superuser"], "bigfleet://superuser"),
    ];
    for (uris, seen) in cases {
        let mut c = mtls.client(uris).await;
        assert_denied(get(&mut c, &idle_id).await, seen);
        assert_denied(c.list(pb::ListFilter::default()).await, seen);
        assert_denied(create(&mut c, &spare, None).await, seen);
        assert_denied(create(&mut c, &spare, tok("alpha", 1, 1)).await, seen);
        assert_denied(configure(&mut c, &idle_id, "c", &[], None).await, seen);
        assert_denied(drain(&mut c, &idle_id, 0, None).await, seen);
        assert_denied(delete(&mut c, &idle_id, None).await, seen);
    }
    assert_eq!(state_of(&mut admin, &spare).await, S::Speculative);
    assert_eq!(state_of(&mut admin, &idle_id).await, S::Idle);
}

// ---------------------------------------------------------------------------------------
// Columns of the table.

/// Get / List: allowed for every single valid identity, refused without one.
#[tokio::test]
async fn column_reads_are_open_to_every_single_valid_identity() {
    let mtls = Mtls::start(&[]);
    let mut admin = mtls.client(&[ADMIN]).await;
    let id = pick(&mtls.server, &mut admin).await;
    for identity in [ALPHA, BETA, ADMIN, READONLY, CLUSTER] {
        let mut c = mtls.client(&[identity]).await;
        let machine = get(&mut c, &id).await;
        assert_eq!(
            machine.map(|m| m.id).ok().as_deref(),
            Some(id.as_str()),
            "{identity}"
        );
        let listed = c.list(pb::ListFilter::default()).await;
        assert!(
            listed.is_ok_and(|l| !l.into_inner().machines.is_empty()),
            "{identity}"
        );
    }
    let mut nobody = mtls.client(&[]).await;
    assert_denied(get(&mut nobody, &id).await, "no bigfleet:// URI SAN");
    assert_denied(
        nobody.list(pb::ListFilter::default()).await,
        "no bigfleet:// URI SAN",
    );
}

/// Create / Configure / Drain / Delete: for each identity and request shard_id, allowed
/// exactly when the table says so (Create on a fresh slot stands for the column; the rows
/// above cover the other three methods).
#[tokio::test]
async fn column_mutations_need_the_matching_shard_or_admin() {
    let mtls = Mtls::start(&[]);
    let mut admin = mtls.client(&[ADMIN]).await;
    let cases: [(&[&str], &str, bool); 12] = [
        (&[ALPHA], "alpha", true),
        (&[ALPHA], "beta", false),
        (&[ALPHA], "", false),
        (&[ALPHA], "alpha2", false),
        (&[ADMIN], "alpha", true),
        (&[ADMIN], "", true),
        (&[READONLY], "alpha", false),
        (&[READONLY], "", false),
        (&[CLUSTER], "prod-1", false),
        (&[], "alpha", false),
        (&[ALPHA, BETA], "alpha", false),
        (&[ALPHA, ALPHA], "alpha", false),
    ];
    for (uris, shard, allowed) in cases {
        let id = pick(&mtls.server, &mut admin).await;
        let mut c = mtls.client(uris).await;
        let token = (!shard.is_empty()).then(|| (shard.to_owned(), 1, 1));
        let result = create(&mut c, &id, token).await;
        let want = if allowed {
            Code::Ok
        } else {
            Code::PermissionDenied
        };
        assert_eq!(
            code(&result),
            want,
            "{uris:?} for shard {shard:?}: {result:?}"
        );
        let after = state_of(&mut admin, &id).await;
        assert_eq!(
            after == S::Speculative,
            !allowed,
            "{uris:?} {shard:?}: {after:?}"
        );
    }
}

// ---------------------------------------------------------------------------------------
// What a refusal must not touch, and the certificates the issue names.

/// `shard/alpha` sending a Create with a high token for shard `beta` is refused before
/// fencing: beta's mark does not move, so beta's own `(1,1)` is then accepted.
#[tokio::test]
async fn a_refused_create_for_another_shard_leaves_its_fence_mark_untouched() {
    let mtls = Mtls::start(&[]);
    let mut alpha = mtls.client(&[ALPHA]).await;
    let mut beta = mtls.client(&[BETA]).await;
    let id = pick(&mtls.server, &mut alpha).await;
    let high = tok("beta", i64::MAX / 2, 1_000_000);
    assert_denied(create(&mut alpha, &id, high).await, ALPHA);
    assert_eq!(state_of(&mut beta, &id).await, S::Speculative);
    let ack = create(&mut beta, &id, tok("beta", 1, 1)).await;
    assert!(ack.is_ok(), "beta's (1,1) after the refused call: {ack:?}");
    reach(&mut beta, &id, S::Idle, SETTLE).await;
}

/// A certificate with two `bigfleet://` SANs, even two that would each be allowed alone,
/// has no identity.
#[tokio::test]
async fn a_certificate_with_two_bigfleet_sans_is_refused() {
    let mtls = Mtls::start(&[]);
    let mut two = mtls.client(&[ALPHA, ADMIN]).await;
    let mut admin = mtls.client(&[ADMIN]).await;
    let id = pick(&mtls.server, &mut admin).await;
    let refused = create(&mut two, &id, tok("alpha", 1, 1)).await;
    assert_denied(refused.clone(), "2 bigfleet:// URI SANs");
    let message = refused.unwrap_err().message().to_owned();
    assert!(
        message.contains(ALPHA) && message.contains(ADMIN),
        "{message}"
    );
    assert_denied(get(&mut two, &id).await, "2 bigfleet:// URI SANs");
}

async fn reflected_services(channel: tonic::transport::Channel) -> Vec<String> {
    let request = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut client = ServerReflectionClient::new(channel);
    let mut answers = client
        .server_reflection_info(futures::stream::iter([request]))
        .await
        .expect("reflection answers")
        .into_inner();
    let answer = answers
        .message()
        .await
        .expect("a reflection answer")
        .expect("one");
    match answer.message_response {
        Some(MessageResponse::ListServicesResponse(list)) => {
            list.service.into_iter().map(|s| s.name).collect()
        }
        other => panic!("unexpected reflection answer: {other:?}"),
    }
}

/// A verified certificate without any SAN is refused for Get, while gRPC health answers
/// SERVING and reflection lists the services on the same connection.
#[tokio::test]
async fn no_san_is_refused_for_get_while_health_and_reflection_answer() {
    let mtls = Mtls::start(&[]);
    let leaf = mtls.cert(&[]);
    let channel = tls_channel(mtls.server.addr, &mtls.ca.pem, &leaf).await;
    let mut c = pb::capacity_provider_client::CapacityProviderClient::new(channel.clone());
    assert_denied(get(&mut c, "any").await, "no bigfleet:// URI SAN");
    let mut health = HealthClient::new(channel.clone());
    for service in ["", "bigfleet.v1alpha1.CapacityProvider"] {
        let status = health
            .check(HealthCheckRequest {
                service: service.to_owned(),
            })
            .await
            .expect("health answers a certificate without identity");
        assert_eq!(
            status.into_inner().status,
            ServingStatus::Serving as i32,
            "{service:?}"
        );
    }
    let services = reflected_services(channel).await;
    assert!(
        services
            .iter()
            .any(|s| s == "bigfleet.v1alpha1.CapacityProvider"),
        "{services:?}"
    );
    assert_eq!(serving_fields(&mtls.server)["client_identity"], "enforce");
}

// ---------------------------------------------------------------------------------------
// The opt-out, the counter and the log line.

/// `--client-identity=off`: every verified client calls everything for any shard, as
/// before; the serving line says so, a warning says what that means, nothing is counted.
#[tokio::test]
async fn off_mode_lets_every_verified_client_through() {
    let mtls = Mtls::start(&["--client-identity=off"]);
    let fields = serving_fields(&mtls.server);
    assert_eq!(
        (
            fields["security"].as_str(),
            fields["client_identity"].as_str()
        ),
        (Some("mTLS"), Some("off"))
    );
    logged(
        || lines_of(&mtls.server),
        Duration::from_secs(2),
        |m, v| m.starts_with("--client-identity=off") && v["level"] == "WARN",
    )
    .await;
    for uris in [&[][..], &[READONLY][..], &[ALPHA, ADMIN][..], &[ALPHA][..]] {
        let mut c = mtls.client(uris).await;
        let id = pick(&mtls.server, &mut c).await;
        create(&mut c, &id, tok("beta", 1, 1))
            .await
            .expect("Create for another shard");
        reach(&mut c, &id, S::Idle, SETTLE).await;
        delete(&mut c, &id, None).await.expect("unfenced Delete");
    }
    let page = scrape(mtls.server.metrics_addr.unwrap()).await;
    assert!(denials(&page).is_empty(), "{:?}", denials(&page));
}

/// Every `bigfleet_libvirt_authz_denied_total{method,reason}` sample.
fn denials(page: &Scrape) -> BTreeMap<(String, String), f64> {
    page.parsed
        .samples
        .iter()
        .filter(|s| s.metric == DENIED)
        .filter_map(|s| {
            let key = (
                s.labels.get("method")?.to_owned(),
                s.labels.get("reason")?.to_owned(),
            );
            match s.value {
                prometheus_parse::Value::Counter(v) | prometheus_parse::Value::Untyped(v) => {
                    Some((key, v))
                }
                _ => None,
            }
        })
        .collect()
}

fn warn_lines(mtls: &Mtls) -> Vec<serde_json::Value> {
    lines_of(&mtls.server)
        .iter()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["level"] == "WARN" && v["fields"]["code"] == "PermissionDenied")
        .collect()
}

/// Runs one call and checks what it did to the refusal counter: a refusal (`Some((method,
/// reason))`) adds exactly one to that series and nothing else; an allowed call adds nothing.
async fn counted(
    metrics: std::net::SocketAddr,
    refusal: Option<(&str, &str)>,
    call: impl std::future::Future<Output = Code>,
) {
    let before = denials(&scrape(metrics).await);
    let got = call.await;
    let after = denials(&scrape(metrics).await);
    let mut want = before;
    match refusal {
        Some((method, reason)) => {
            assert_eq!(got, Code::PermissionDenied, "{method} {reason}");
            *want
                .entry((method.to_owned(), reason.to_owned()))
                .or_default() += 1.0;
        }
        None => assert_eq!(got, Code::Ok, "an allowed call"),
    }
    assert_eq!(after, want, "{refusal:?}");
}

/// Each refusal adds exactly one to its (method, reason) series and nothing else; allowed
/// calls add nothing. Each refusal is logged once at warn with the identity, and no request
/// payload (blob, metadata) reaches the log.
#[tokio::test]
async fn the_refusal_counter_moves_by_exactly_one_per_refusal_and_each_is_logged_once() {
    let mtls = Mtls::start(&[]);
    let metrics = mtls.server.metrics_addr.unwrap();
    let mut admin = mtls.client(&[ADMIN]).await;
    let mut alpha = mtls.client(&[ALPHA]).await;
    let mut readonly = mtls.client(&[READONLY]).await;
    let mut nobody = mtls.client(&[]).await;
    let mut two = mtls.client(&[ALPHA, BETA]).await;
    let idle_id = idle(&mtls, &mut admin).await;
    let spare = pick(&mtls.server, &mut admin).await;
    // Every series a refusal can move exists from the start, at 0 (so an alert on
    // increase() sees the first refusal): 7 reasons for each of the 4 mutations, 4 for
    // each of the 2 reads.
    let start = denials(&scrape(metrics).await);
    assert_eq!(start.len(), 4 * 7 + 2 * 4, "{start:?}");
    assert!(start.values().all(|v| *v == 0.0), "{start:?}");
    let secret = "identity-test-secret-7f3a91";
    let refusal = Some(("Create", "shard_mismatch"));
    counted(metrics, refusal, async {
        code(&create(&mut alpha, &spare, tok("beta", 5, 5)).await)
    })
    .await;
    counted(metrics, refusal, async {
        code(&create(&mut alpha, &spare, tok("beta", 6, 6)).await)
    })
    .await;
    let refusal = Some(("Create", "unfenced"));
    counted(metrics, refusal, async {
        code(&create(&mut alpha, &spare, None).await)
    })
    .await;
    let refusal = Some(("Configure", "not_a_shard"));
    counted(metrics, refusal, async {
        let metadata = md(&[("k", secret)]);
        let blob = secret.as_bytes().to_vec();
        code(&configure_map(&mut readonly, &idle_id, "c", metadata, blob, None).await)
    })
    .await;
    let refusal = Some(("Drain", "no_identity"));
    counted(metrics, refusal, async {
        code(&drain(&mut nobody, &idle_id, 0, None).await)
    })
    .await;
    let refusal = Some(("Delete", "several_identities"));
    counted(metrics, refusal, async {
        code(&delete(&mut two, &idle_id, tok("alpha", 1, 1)).await)
    })
    .await;
    let refusal = Some(("Get", "no_identity"));
    counted(metrics, refusal, async {
        code(&get(&mut nobody, &idle_id).await)
    })
    .await;
    let refusal = Some(("List", "several_identities"));
    counted(metrics, refusal, async {
        code(&two.list(pb::ListFilter::default()).await)
    })
    .await;
    counted(metrics, None, async {
        code(&get(&mut readonly, &idle_id).await)
    })
    .await;
    counted(metrics, None, async {
        code(&create(&mut alpha, &spare, tok("alpha", 1, 1)).await)
    })
    .await;
    let refusals = 8;

    let page = scrape(metrics).await;
    let denied_rpcs: f64 = ["Create", "Configure", "Drain", "Delete", "Get", "List"]
        .iter()
        .map(|m| {
            page.count(
                "bigfleet_libvirt_grpc_requests_total",
                &[("method", m), ("code", "PermissionDenied")],
            )
        })
        .sum();
    assert_eq!(denied_rpcs, f64::from(refusals));
    let start = Instant::now();
    while warn_lines(&mtls).len() < refusals as usize && start.elapsed() < Duration::from_secs(5) {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let warns = warn_lines(&mtls);
    assert_eq!(
        warns.len(),
        refusals as usize,
        "one warn line per refusal:\n{warns:#?}"
    );
    let first = &warns[0];
    assert!(
        first["fields"]["error"].as_str().unwrap().contains(ALPHA),
        "{first}"
    );
    assert_eq!(first["span"]["identity"], ALPHA, "{first}");
    assert_eq!(warns[3]["span"]["identity"], READONLY, "{}", warns[3]);
    let log = mtls.server.log_text();
    assert!(!log.contains(secret), "a request payload reached the log");
}

// ---------------------------------------------------------------------------------------
// Start-up and reload.

/// Arguments and environment of one launch.
type Launch<'a> = (Vec<String>, Vec<(&'a str, &'a str)>);

/// Runs the binary expecting it to refuse to start; returns its stderr.
fn startup_error(args: &[String], env: &[(&str, &str)]) -> String {
    let child = Command::new(binary())
        .args([
            "--addr=127.0.0.1:0",
            "--metrics-addr=127.0.0.1:0",
            "--use-fake-backend",
        ])
        .args(args)
        .envs(env.iter().copied())
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (status, stderr) = exit_within(child, Duration::from_secs(20));
    let status = status.unwrap_or_else(|| panic!("still running after 20s: {args:?} {env:?}"));
    assert!(
        status.code().is_some_and(|c| c != 0),
        "{args:?}: exit {status:?}; {stderr}"
    );
    stderr
}

/// `--client-identity` (flag or variable) without `--tls-ca` stops start-up with one line
/// naming both flags; an unknown value is refused naming the flag and its values.
#[test]
fn the_flag_without_tls_ca_fails_startup_naming_both_flags() {
    let ca = Ca::new("identity startup CA");
    let leaf = ca.server("identity server", 2);
    let dir = tempfile::tempdir().unwrap();
    let cert = arg("--tls-cert", &write(dir.path(), "s.pem", &leaf.cert_pem));
    let key = arg("--tls-key", &write(dir.path(), "s.key", &leaf.key_pem));
    let ca_file = arg("--tls-ca", &write(dir.path(), "ca.pem", &ca.pem));
    let cases: [Launch<'_>; 4] = [
        (vec!["--client-identity=enforce".into()], vec![]),
        (
            vec!["--client-identity=off".into(), cert.clone(), key.clone()],
            vec![],
        ),
        (
            vec![],
            vec![("BIGFLEET_LIBVIRT_CLIENT_IDENTITY", "enforce")],
        ),
        (
            vec![cert.clone(), key.clone()],
            vec![("BIGFLEET_LIBVIRT_CLIENT_IDENTITY", "off")],
        ),
    ];
    for (args, env) in cases {
        let stderr = startup_error(&args, &env);
        let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
        assert_eq!(lines.len(), 1, "{args:?} {env:?}: {stderr}");
        assert!(
            lines[0].contains("--client-identity") && lines[0].contains("--tls-ca"),
            "{args:?} {env:?}: {}",
            lines[0]
        );
    }
    let bad = startup_error(&["--client-identity=maybe".into(), cert, key, ca_file], &[]);
    assert!(
        bad.contains("--client-identity must be enforce or off") && bad.contains("maybe"),
        "{bad}"
    );
}

/// A server certificate rotated on disk is picked up without a restart, and identities are
/// still enforced on the connections made after the reload.
#[tokio::test]
async fn reload_keeps_identity_enforcement() {
    let mtls = Mtls::start(&[]);
    let admin = mtls.cert(&[ADMIN]);
    let next = mtls.ca.server("identity server B", 0xB7);
    replace(&mtls.dir.path().join("server.key"), &next.key_pem, None);
    replace(&mtls.dir.path().join("server.pem"), &next.cert_pem, None);
    let start = Instant::now();
    loop {
        let stream = handshake(
            mtls.server.addr,
            rustls_client(&mtls.ca.pem, Some(&admin), false),
        )
        .await;
        let served = stream
            .ok()
            .and_then(|s| s.get_ref().1.peer_certificates().map(|c| c[0].to_vec()));
        if served.as_deref() == Some(next.der.as_slice()) {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "the rotated certificate was not served"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    println!("rotation served after {:?}", start.elapsed());
    logged(
        || lines_of(&mtls.server),
        Duration::from_secs(2),
        |m, _| m == "reloaded TLS certificates",
    )
    .await;
    let mut alpha = mtls.client(&[ALPHA]).await;
    let id = pick(&mtls.server, &mut alpha).await;
    assert_denied(create(&mut alpha, &id, tok("beta", 1, 1)).await, ALPHA);
    create(&mut alpha, &id, tok("alpha", 1, 1))
        .await
        .expect("own Create after the reload");
    let mut nobody = mtls.client(&[]).await;
    assert_denied(get(&mut nobody, &id).await, "no bigfleet:// URI SAN");

    // A rotated client CA: its certificates are verified and their identities enforced.
    let client_ca = Ca::new("identity client CA 2");
    replace(&mtls.dir.path().join("ca.pem"), &client_ca.pem, None);
    let reader = client_ca.client_with_uris("reader", &[READONLY]);
    let start = Instant::now();
    while tls_list(mtls.server.addr, &mtls.ca.pem, Some(&reader))
        .await
        .is_err()
    {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "the new client CA was not used"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    println!("client CA rotation used after {:?}", start.elapsed());
    let beta = client_ca.client_with_uris("beta", &[BETA]);
    let mut beta = tls_client(mtls.server.addr, &mtls.ca.pem, &beta).await;
    let spare = pick(&mtls.server, &mut beta).await;
    assert_denied(create(&mut beta, &spare, tok("alpha", 1, 1)).await, BETA);
    create(&mut beta, &spare, tok("beta", 1, 1))
        .await
        .expect("beta's own Create under the new CA");
}
