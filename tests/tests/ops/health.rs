//! Part 2: Liveness, readiness, gRPC health and graceful shutdown.

use std::time::{Duration, Instant};

use tonic::transport::Endpoint;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

use crate::harness::logs::*;
use crate::harness::*;

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
