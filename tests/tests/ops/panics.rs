//! Part 8: Panics: a handler panic is answered INTERNAL, counted and survived; and a busy port
//! is fatal at start-up.

use std::process::{Command, Stdio};
use std::time::Duration;

use tonic::Code;

use crate::harness::logs::*;
use crate::harness::scrape::*;
use crate::harness::*;

use super::*;

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
