//! Full Lists that are fair to everyone (issue 37, part 4).
//!
//! 50,000 machines in use (each Created and Configured, with a cluster and metadata): a full
//! List is about 12 MB. As many clients as the old budget's charge for full answers would
//! fill (`--list-memory-budget-mib`, 64, over one answer's size, plus one: six) read full
//! Lists at 4 KB/s over their own HTTP/2 connections; then one more client's full List must
//! answer within 5 s (after one Drain, so it cannot join the readers' answer and is built
//! and charged on its own), and the provider's RSS must stay within the chart's memory limit
//! throughout. Before the fix each streamed answer was charged its whole size, the readers
//! filled the budget, and every further full List waited until one of them was completely
//! sent (about 50 minutes at 4 KB/s).
//!
//! And the send-progress deadline: a reader that stops reading loses its stream once
//! `--list-progress-timeout` passes without progress, counted in
//! `bigfleet_libvirt_list_streams_cut_total`.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bigfleet_libvirt_proto::v1alpha1 as pb;
use pb::MachineState as S;
use prost::Message;

use crate::harness::raw_list::{raw_list, read_slowly, rss_mib};
use crate::harness::scrape::{Scrape, scrape};
use crate::harness::*;

const MACHINES: usize = 50_000;
/// How fast each slow reader takes its answer in.
const READ_RATE: usize = 4096;
/// The provider's default List budget.
const BUDGET_MIB: usize = 64;
/// Connections that make the machines in use, each sending its calls one after the other.
const WORKERS: usize = 32;
/// The bound on the fair List: the caller gave up after 10 s.
const ANSWER_WITHIN: Duration = Duration::from_secs(5);

/// The chart's memory limit (`resources.limits.memory` in deploy/helm/values.yaml), in MiB.
fn chart_limit_mib() -> u64 {
    let values = std::fs::read_to_string(repo_root().join("deploy/helm/values.yaml"))
        .expect("deploy/helm/values.yaml");
    let limits = values
        .split("\nresources:")
        .nth(1)
        .and_then(|r| r.split("limits:").nth(1))
        .expect("resources.limits in the chart's values");
    let memory = limits
        .lines()
        .find_map(|l| l.trim().strip_prefix("memory:"))
        .expect("resources.limits.memory");
    memory
        .trim()
        .trim_matches('"')
        .strip_suffix("Mi")
        .and_then(|m| m.parse().ok())
        .unwrap_or_else(|| panic!("resources.limits.memory {memory:?} is not in Mi"))
}

/// Sends `call` for every id, from `WORKERS` connections each with a share of the ids.
async fn for_all<F, Fut>(server: &Server, ids: &[String], call: F)
where
    F: Fn(Client, String) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = Result<Client, tonic::Status>> + Send,
{
    let mut workers = Vec::new();
    for chunk in ids.chunks(ids.len().div_ceil(WORKERS)) {
        let chunk = chunk.to_vec();
        let mut c = server.client().await;
        let call = call.clone();
        workers.push(tokio::spawn(async move {
            for id in chunk {
                c = call(c, id).await.expect("call");
            }
        }));
    }
    for worker in workers {
        worker.await.expect("worker");
    }
}

/// Waits until no machine is in `state`.
async fn settled(c: &mut Client, state: S) {
    let start = Instant::now();
    while !list(c, &[state], 1, &[]).await.machines.is_empty() {
        assert!(
            start.elapsed() < Duration::from_secs(300),
            "machines still {state:?} after 300 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Creates and configures every machine.
async fn all_in_use(server: &Server, ids: &[String]) {
    let began = Instant::now();
    let mut c = server.client().await;
    for_all(server, ids, |mut c, id| async move {
        c.create(pb::CreateRequest {
            machine_id: id,
            shard_id: "fair".to_owned(),
            shard_epoch: 1,
            sequence_number: 1,
        })
        .await?;
        Ok(c)
    })
    .await;
    settled(&mut c, S::Creating).await;
    let created = began.elapsed();
    for_all(server, ids, |mut c, id| async move {
        c.configure(pb::ConfigureRequest {
            machine_id: id,
            cluster_id: "fair-cluster".to_owned(),
            shard_id: "fair".to_owned(),
            shard_epoch: 1,
            sequence_number: 2,
            shard_metadata: [("bigfleet.io/node-pool".to_owned(), "pool-a".to_owned())].into(),
            ..Default::default()
        })
        .await?;
        Ok(c)
    })
    .await;
    settled(&mut c, S::Configuring).await;
    println!(
        "{} machines Created in {created:.1?}, then Configured in {:.1?}",
        ids.len(),
        began.elapsed() - created
    );
}

/// A full List read at `READ_RATE` until `stop`; the bytes read, and when the first came.
async fn slow_list(addr: SocketAddr, stop: Instant) -> (usize, Option<Duration>) {
    let start = Instant::now();
    let Ok((body, connection)) =
        tokio::time::timeout_at(stop.into(), raw_list(addr, READ_RATE as u32)).await
    else {
        return (0, None);
    };
    read_slowly(body, connection, READ_RATE, start, stop).await
}

/// A provider with `MACHINES` machines, every one Created and Configured (quiet logs: the
/// 100,000 calls would write as many lines).
async fn in_use_server() -> Server {
    let seed = format!("--seed-count={MACHINES}");
    let server = Server::start(&[
        "--use-fake-backend",
        &seed,
        "--fake-delay-min=0",
        "--fake-delay-max=0",
        "--log-level=info,bigfleet_libvirt_grpc=warn,bigfleet_libvirt_ports=warn",
    ]);
    let mut c = server.client().await;
    let all = list_all(&mut c).await.machines;
    let ids: Vec<String> = all.into_iter().map(|m| m.id).collect();
    assert_eq!(ids.len(), MACHINES);
    all_in_use(&server, &ids).await;
    server
}

/// A full List read as fast as it comes (no decoding: the time is the provider's); the
/// message's length, checked against the bytes received.
async fn whole_list(addr: SocketAddr) -> usize {
    let (mut body, connection) = raw_list(addr, 16 << 20).await;
    let mut message = Vec::new();
    while let Some(chunk) = body.data().await {
        let chunk = chunk.expect("List body");
        let _ = body.flow_control().release_capacity(chunk.len());
        message.extend_from_slice(&chunk);
    }
    let status = body.trailers().await.expect("trailers").expect("trailers");
    assert_eq!(status["grpc-status"], "0");
    connection.abort();
    let len = u32::from_be_bytes(message[1..5].try_into().unwrap()) as usize;
    assert_eq!(message.len(), 5 + len, "the whole message");
    len
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_list_answers_at_once_while_slow_readers_hold_theirs() {
    let began = Instant::now();
    let server = in_use_server().await;
    let in_use = began.elapsed();
    let pid = server.pid().expect("running");
    let mut c = server.client().await;
    // One full List first: every record's encoding is made once, as in a running fleet.
    let t = Instant::now();
    let size = list_all(&mut c).await.encoded_len();
    let warm = t.elapsed();
    let readers = (BUDGET_MIB << 20) / size + 1;
    assert!(
        readers >= 5,
        "a full List of {size} bytes: only {readers} readers"
    );
    let limit = chart_limit_mib();
    let baseline = rss_mib(pid);
    println!(
        "{MACHINES} machines in use in {in_use:.1?}; a full List is {size} bytes ({warm:.1?} \
         warm); {readers} slow readers; RSS {baseline} MiB, chart limit {limit} MiB"
    );
    let stop = Instant::now() + Duration::from_secs(20);
    let slow: Vec<_> = (0..readers)
        .map(|_| tokio::spawn(slow_list(server.addr, stop)))
        .collect();
    // Let every reader be answered (or queued) before the fair List is asked.
    tokio::time::sleep(Duration::from_secs(3)).await;
    // The head moves on, so the fair List cannot join the readers' answer: it builds its own.
    let id = list(&mut c, &[S::Configured], 1, &[]).await.machines[0]
        .id
        .clone();
    drain(&mut c, &id, 0, tok("fair", 1, 3))
        .await
        .expect("Drain");
    let mut peak = rss_mib(pid);
    let t = Instant::now();
    let fair = tokio::time::timeout(ANSWER_WITHIN, whole_list(server.addr)).await;
    let took = t.elapsed();
    peak = peak.max(rss_mib(pid));
    let fair = fair.unwrap_or_else(|_| {
        panic!("a full List behind {readers} slow readers was not answered within {took:.1?}")
    });
    assert!(
        fair.abs_diff(size) < 1024,
        "the fair List is {fair} bytes, not about {size}"
    );
    while Instant::now() < stop {
        peak = peak.max(rss_mib(pid));
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let mut firsts = Vec::new();
    for reader in slow {
        let (read, first) = reader.await.expect("reader");
        assert!(read > 0, "a slow reader was never answered");
        firsts.push(first.expect("answered"));
    }
    println!(
        "the fair List answered in {took:.2?}; the slow readers' first bytes after {:?}; RSS \
         peak {peak} MiB (baseline {baseline}); test wall time {:.1?}",
        firsts.iter().max().unwrap(),
        began.elapsed()
    );
    assert!(
        peak <= limit,
        "RSS peaked at {peak} MiB, above the chart's {limit} MiB limit"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_that_stops_reading_loses_its_stream_after_the_progress_deadline() {
    // 20,000 slots: a full List of about 3 MB, streamed.
    let server = Server::start(&[
        "--use-fake-backend",
        "--seed-count=20000",
        "--list-progress-timeout=2s",
    ]);
    let metrics = server.metrics_addr.expect("metrics");
    const CUT: &str = "bigfleet_libvirt_list_streams_cut_total";
    let cut = |page: &Scrape| page.count(CUT, &[]);
    assert_eq!(
        scrape(metrics).await.value(CUT, &[]),
        Some(0.0),
        "the series exists"
    );
    // The provider's last progress on the stream comes after this.
    let asked = Instant::now();
    let (mut body, connection) = raw_list(server.addr, 4096).await;
    let first = body
        .data()
        .await
        .expect("a first piece")
        .expect("List body");
    let mut read = first.len();
    let _ = body.flow_control().release_capacity(first.len());
    // Stop reading: take what the window let through, release nothing more.
    let stopped = Instant::now();
    let page = loop {
        let page = scrape(metrics).await;
        if cut(&page) >= 1.0 {
            break page;
        }
        assert!(
            stopped.elapsed() < Duration::from_secs(60),
            "the stopped reader was not cut within 60 s; last page:\n{}",
            page.text
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let after = stopped.elapsed();
    assert_eq!(cut(&page), 1.0);
    assert!(
        asked.elapsed() >= Duration::from_secs(2),
        "cut {:?} after the List was asked, before the 2 s deadline",
        asked.elapsed()
    );
    // Reading again: what HTTP/2 already held, then the reset, never the whole answer.
    let error = loop {
        match body.data().await {
            Some(Ok(chunk)) => {
                read += chunk.len();
                let _ = body.flow_control().release_capacity(chunk.len());
            }
            Some(Err(error)) => break error,
            None => panic!("the whole answer ({read} bytes) arrived: the stream was not cut"),
        }
    };
    assert_eq!(
        error.reason(),
        Some(h2::Reason::CANCEL),
        "reset with CANCEL after {read} bytes: {error}"
    );
    connection.abort();
    // A reader that keeps reading is not cut, and the provider serves on.
    let mut c = server.client().await;
    assert_eq!(list_all(&mut c).await.machines.len(), 20_000);
    assert_eq!(cut(&scrape(metrics).await), 1.0, "only the stopped reader");
    println!("the stopped reader was cut {after:.1?} after it stopped, having read {read} bytes");
}
