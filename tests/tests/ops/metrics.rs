//! Part 1: Metrics: `/metrics` parsed with a Prometheus text parser follows RPCs, fencing,
//! hypervisor calls and machines.

use bigfleet_libvirt_proto::v1alpha1 as pb;
use pb::MachineState as S;
use tonic::Code;

use crate::harness::scrape::*;
use crate::harness::*;

use super::*;

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

/// Every `# HELP` and `# TYPE` line the binary's `/metrics` shows is one of the committed
/// catalog (`infra/app/src/metrics_catalog.txt`, which the root's unit test renders in full):
/// what the root wires is what the catalog names. A family only shows once it has a sample,
/// so this is a subset check; the shared server's other tests add samples meanwhile.
#[tokio::test]
async fn every_exposed_series_is_in_the_catalog() {
    let server = core();
    let http = server.metrics_addr.expect("a metrics address");
    let mut c = server.client().await;
    let _ = list_all(&mut c).await;
    let page = scrape_until(http, "the List counted", |p| {
        p.count(REQUESTS, &[("method", "List"), ("code", "OK")]) >= 1.0
    })
    .await;
    let catalog = include_str!("../../../infra/app/src/metrics_catalog.txt");
    let unknown: Vec<&str> = page
        .text
        .lines()
        .filter(|l| l.starts_with("# HELP ") || l.starts_with("# TYPE "))
        .filter(|l| !catalog.lines().any(|known| known == *l))
        .collect();
    assert!(
        unknown.is_empty(),
        "/metrics shows lines the catalog does not name: {unknown:#?}"
    );
    for series in [
        "bigfleet_libvirt_grpc_requests",
        "bigfleet_libvirt_ready",
        "process_open_fds",
    ] {
        let help = format!("# HELP {series} ");
        assert!(
            page.text.contains(&help),
            "{series} is exposed: {}",
            page.text
        );
    }
}
