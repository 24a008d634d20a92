//! Issue 24, the export path with the collector down, black-box: 10,000 Gets against a
//! provider without tracing and against one whose `--otlp-endpoint` port is closed. Every
//! call is answered (none waits for the collector); the latencies of both runs and the
//! second one's resident memory are printed (measurements, not bounds); the dropped spans
//! are counted in `bigfleet_libvirt_otlp_spans_dropped_total` and none is counted exported.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use super::*;

const CALLS: usize = 10_000;
const CLIENTS: usize = 16;
/// The bound on spans waiting for export (the spec's default queue size).
const QUEUE: f64 = 2048.0;
const DROPPED: &str = "bigfleet_libvirt_otlp_spans_dropped_total";
const EXPORTED: &str = "bigfleet_libvirt_otlp_spans_exported_total";

/// A loopback port nothing listens on.
fn closed_port() -> SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    addr
}

fn resident_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// User and system CPU seconds `pid` has used.
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command name (which may hold spaces) start after the last `)`.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map_or(vec![], |(_, rest)| rest.split_whitespace().collect());
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    // utime and stime are fields 14 and 15 of stat, 12 and 13 after the name; 100 Hz.
    (ticks(11) + ticks(12)) / 100.0
}

/// `calls` Gets of `id` from [`CLIENTS`] connections; every latency, sorted.
async fn gets(server: &Server, id: &str, calls: usize) -> Vec<Duration> {
    let mut tasks = Vec::new();
    for _ in 0..CLIENTS {
        let mut c = server.client().await;
        let id = id.to_owned();
        tasks.push(tokio::spawn(async move {
            let mut took = Vec::with_capacity(calls / CLIENTS);
            for _ in 0..calls / CLIENTS {
                let start = Instant::now();
                get(&mut c, &id).await.expect("every Get is answered");
                took.push(start.elapsed());
            }
            took
        }));
    }
    let mut all = Vec::with_capacity(calls);
    for task in tasks {
        all.extend(task.await.unwrap());
    }
    all.sort();
    all
}

fn describe(what: &str, took: &[Duration]) {
    let at = |q: f64| took[((took.len() as f64 - 1.0) * q) as usize];
    println!(
        "{what}: {} Gets, p50 {:?}, p99 {:?}, max {:?}",
        took.len(),
        at(0.5),
        at(0.99),
        took[took.len() - 1]
    );
}

async fn provider(extra: &[String]) -> (Server, String) {
    let mut args: Vec<&str> = vec!["--use-fake-backend", "--seed-count=8"];
    args.extend(extra.iter().map(String::as_str));
    let server = Server::start(&args);
    let mut c = server.client().await;
    let id = pick(&server, &mut c).await;
    (server, id)
}

/// With the collector's port closed, 10,000 calls are answered as without tracing, memory
/// stays put, and the spans that could not be sent are counted as dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_collector_that_is_down_costs_no_call_and_is_counted() {
    let (plain, id) = provider(&[]).await;
    let cpu = cpu_seconds(plain.pid().unwrap());
    let untraced = gets(&plain, &id, CALLS).await;
    let untraced_cpu = cpu_seconds(plain.pid().unwrap()) - cpu;
    drop(plain);

    let endpoint = format!("--otlp-endpoint=http://{}", closed_port());
    let (traced, id) = provider(&[endpoint]).await;
    let metrics = traced.metrics_addr.expect("metrics port");
    let pid = traced.pid().unwrap();
    let warm = gets(&traced, &id, CALLS / 5).await;
    let rss_warm = resident_kib(pid);
    let cpu = cpu_seconds(pid);
    let down = gets(&traced, &id, CALLS).await;
    let down_cpu = cpu_seconds(pid) - cpu;
    let rss_after = resident_kib(pid);
    describe("without tracing", &untraced);
    describe("collector down", &down);
    println!(
        "provider CPU for {CALLS} Gets: {untraced_cpu:.2} s without tracing, {down_cpu:.2} s \
         with the collector down"
    );
    println!(
        "collector down: RSS {rss_warm} KiB after {} Gets, {rss_after} KiB after {} more",
        warm.len(),
        down.len()
    );
    // At most QUEUE spans wait for export; the rest were sent (and failed) or were turned
    // away at the gate: both are counted, so the count reaches (calls - QUEUE).
    let calls = (warm.len() + down.len()) as f64;
    let dropped = |s: &crate::harness::scrape::Scrape| {
        let reason = |r: &str| s.count(DROPPED, &[("reason", r)]);
        (reason("export_failed"), reason("queue_full"))
    };
    let start = Instant::now();
    let scrape = loop {
        let page = crate::harness::scrape::scrape(metrics).await;
        let (failed, full) = dropped(&page);
        if failed + full >= calls - QUEUE {
            break page;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "dropped spans not counted: {failed} + {full} after {calls} calls:\n{}",
            page.text
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let (failed, full) = dropped(&scrape);
    println!(
        "collector down: dropped {} (export_failed {failed}, queue_full {full}) of {calls} \
         calls' spans, exported {}, counted within {:?}",
        failed + full,
        scrape.count(EXPORTED, &[]),
        start.elapsed()
    );
    assert_eq!(
        scrape.count(EXPORTED, &[]),
        0.0,
        "nothing reached a closed port"
    );
}
