//! Many full Lists of a large inventory, read slowly, next to a normal caller: the Lists
//! must neither stall other calls nor hold unbounded memory. 100,000 machines; 50 clients
//! each ask for the full List over their own HTTP/2 connection and read the answer at
//! 4 KB/s (their flow-control windows opened 4 KiB a second), while a Get is sent every
//! 20 ms on the intended schedule (its latency counted from the intended send time, so a
//! stall is not hidden by the sender waiting: coordinated omission corrected). Every Get
//! must answer within its 1 s deadline; the provider's RSS must stay within its documented
//! List memory budget above the baseline while the readers hold their answers, and come
//! back near the baseline within 30 s after they disconnect. The Get latency percentiles
//! are printed (the provider benchmark reports the same figures).

use std::time::{Duration, Instant};

use bigfleet_libvirt_proto::v1alpha1 as pb;

use crate::harness::raw_list::{raw_list, read_slowly, rss_mib};
use crate::harness::*;

const MACHINES: usize = 100_000;
const READERS: usize = 50;
/// How fast each slow reader takes the answer in.
const READ_RATE: usize = 4096;
/// How long the readers hold their answers.
const HOLD: Duration = Duration::from_secs(20);
/// The provider's default budget for List answers held for readers (`--list-memory-budget`).
const BUDGET_MIB: u64 = 64;
/// Allowance above baseline + budget: connection buffers, the answers being built, allocator
/// slack.
const SLACK_MIB: u64 = 48;
/// How far above the baseline RSS may stay once the readers are gone.
const BACK_NEAR_MIB: u64 = 24;

/// A full List over a raw HTTP/2 connection whose windows open `READ_RATE` bytes a second;
/// returns how many bytes it read before `stop`.
async fn slow_list(addr: std::net::SocketAddr, stop: Instant) -> usize {
    let (body, connection) = raw_list(addr, READ_RATE as u32).await;
    read_slowly(body, connection, READ_RATE, Instant::now(), stop)
        .await
        .0
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_lists_read_slowly_neither_stall_gets_nor_hold_unbounded_memory() {
    let seed = format!("--seed-count={MACHINES}");
    let server = Server::start(&["--use-fake-backend", &seed]);
    let pid = server.pid().expect("running");
    let mut c = server.client().await;
    // One full List first: every record's encoding is made once, as in a running fleet.
    let id = list_all(&mut c).await.machines[0].id.clone();
    let baseline = rss_mib(pid);
    let stop = Instant::now() + HOLD;
    let readers: Vec<_> = (0..READERS)
        .map(|_| tokio::spawn(slow_list(server.addr, stop)))
        .collect();
    let mut peak = baseline;
    let mut latencies = Vec::new();
    let period = Duration::from_millis(20);
    let start = Instant::now();
    let mut next_sample = start;
    for i in 0u32.. {
        let intended = start + period * i;
        if intended >= stop {
            break;
        }
        tokio::time::sleep_until(intended.into()).await;
        let mut request = tonic::Request::new(pb::MachineRef { id: id.clone() });
        request.set_timeout(Duration::from_secs(1));
        let answer = c.get(request).await;
        let latency = intended.elapsed();
        assert!(
            answer.is_ok(),
            "Get {i} missed its 1 s deadline after {latency:?}: {answer:?}"
        );
        latencies.push(latency);
        if Instant::now() >= next_sample {
            peak = peak.max(rss_mib(pid));
            next_sample = Instant::now() + Duration::from_millis(250);
        }
    }
    let mut read = 0;
    for reader in readers {
        read += reader.await.expect("reader");
    }
    latencies.sort();
    let pct = |p: usize| latencies[(latencies.len() * p / 100).min(latencies.len() - 1)];
    println!(
        "{} Gets: p50 {:?} p99 {:?} max {:?}; RSS baseline {baseline} MiB, peak {peak} MiB; \
         readers read {read} bytes",
        latencies.len(),
        pct(50),
        pct(99),
        latencies.last().unwrap()
    );
    assert!(
        peak <= baseline + BUDGET_MIB + SLACK_MIB,
        "RSS peaked at {peak} MiB: more than the {BUDGET_MIB} MiB List budget above the \
         baseline of {baseline} MiB (+{SLACK_MIB} MiB slack)"
    );
    let gone = Instant::now();
    let mut now = rss_mib(pid);
    while now > baseline + BACK_NEAR_MIB && gone.elapsed() < Duration::from_secs(30) {
        tokio::time::sleep(Duration::from_millis(500)).await;
        now = rss_mib(pid);
    }
    println!("RSS {now} MiB {:?} after the readers left", gone.elapsed());
    assert!(
        now <= baseline + BACK_NEAR_MIB,
        "RSS still {now} MiB 30 s after the readers left (baseline {baseline} MiB)"
    );
}
