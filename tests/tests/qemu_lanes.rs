//! Issue 27 — per-host lanes on real libvirtd (and issue 41: `host_lanes_at_a_lower_limit`
//! runs the same load against a daemon at a lower `max_client_requests`, see
//! docs/testing.md): `host_lanes` puts 32 Creates and then 8
//! Deletes in flight across the tier's two zones (`qemu_zones`), whose libvirtd runs with
//! `max_client_requests = 5` and keepalive as shipped (scripts/qemu-tier/zones.sh writes
//! both into each zone's libvirtd.conf), and checks that
//!
//! - every call is accepted and every machine reaches its state (Idle, Speculative);
//! - neither the provider's log nor either libvirtd's log shows libvirt throttling the
//!   provider (libvirtd's "Client hit max requests limit" warning, "too many") or a
//!   keepalive disconnect while it runs;
//! - the Deletes overtake the queue: on each zone, every Delete reaches Speculative before
//!   three quarters of the Creates acked ahead of it reach Idle. A Delete queued behind the
//!   Creates would finish only after all 16; served at once, it finishes while the Creates
//!   already running (4 per host at the default budget) and those started beside it as
//!   slots free finish, about 4 to 8 (half was the bound while 2 Creates ran at once).
//!
//! Completion times come from polling each machine's Get every 20 ms from the moment its
//! call was acked. Needs the real-QEMU tier, so it is `#[ignore]`d in the ordinary suite;
//! `scripts/qemu-tier/run.sh ci` runs it. It leaves both hosts as it found them.

use std::path::PathBuf;
use std::time::Instant;

use bigfleet_libvirt_proto::v1alpha1 as pb;
use pb::MachineState as S;

use crate::harness::*;
use crate::qemu_zones::*;

/// Creates per zone, and the machines per zone Deleted while they are queued.
const CREATES: usize = 16;
const DELETES: usize = 4;

/// What libvirt says when a client is throttled or dropped for missed keepalives (lower
/// case; the logs are searched case-insensitively). libvirtd 9.0 warns "Client hit max
/// requests limit 5. This may result in keep-alive timeouts. …" when a client has
/// `max_client_requests` calls in flight; the client then sees "client socket is closed"
/// or "connection closed due to keepalive timeout".
const LIBVIRT_TROUBLE: &[&str] = &[
    "max requests limit",
    "too many",
    "keepalive",
    "keep-alive",
    "connection closed",
    "client socket is closed",
];

/// The part of a log file written since `offset`.
fn since(path: &PathBuf, offset: u64) -> String {
    let bytes = std::fs::read(path).unwrap_or_default();
    let start = usize::try_from(offset)
        .unwrap_or(usize::MAX)
        .min(bytes.len());
    String::from_utf8_lossy(&bytes[start..]).into_owned()
}

fn libvirtd_log(zone: &Zone) -> PathBuf {
    zone.root.join("var/log/libvirt/libvirtd.log")
}

/// The lines of `text` that name one of [`LIBVIRT_TROUBLE`].
fn trouble(text: &str) -> Vec<String> {
    text.lines()
        .filter(|line| {
            let line = line.to_lowercase();
            LIBVIRT_TROUBLE.iter().any(|t| line.contains(t))
        })
        .map(str::to_owned)
        .collect()
}

/// Sends `call` for every id at once; each task waits for `want` after its ack and returns
/// when it saw it.
async fn fire(c: &Client, ids: &[String], deleting: bool) -> Vec<tokio::task::JoinHandle<Instant>> {
    let mut acked = Vec::new();
    for id in ids {
        let (mut c, id) = (c.clone(), id.clone());
        acked.push(tokio::spawn(async move {
            let what = if deleting { "Delete" } else { "Create" };
            let result = if deleting {
                delete(&mut c, &id, None).await
            } else {
                create(&mut c, &id, None).await
            };
            result.unwrap_or_else(|e| panic!("{what} {id} was refused: {e}"));
            (c, id)
        }));
    }
    // Every call of this batch is acked before the next batch is sent.
    let mut waits = Vec::new();
    for task in acked {
        let (mut c, id) = task.await.expect("the call's task");
        let want = if deleting { S::Speculative } else { S::Idle };
        waits.push(tokio::spawn(async move {
            reach(&mut c, &id, want, BOOT).await;
            Instant::now()
        }));
    }
    waits
}

async fn joined(tasks: Vec<tokio::task::JoinHandle<Instant>>) -> Vec<Instant> {
    let mut out = Vec::new();
    for task in tasks {
        out.push(task.await.expect("a machine reached its state"));
    }
    out
}

#[tokio::test]
#[ignore = "needs the real-QEMU tier: run scripts/qemu-tier/run.sh ci"]
async fn host_lanes() {
    let tier = Tier::from_env();
    let (wrong, _server) = lanes(&tier, "e2e-lanes", &[]).await;
    assert!(wrong.is_empty(), "host_lanes: {wrong:#?}");
}

#[tokio::test]
#[ignore = "needs the real-QEMU tier: run scripts/qemu-tier/run.sh ci"]
async fn host_lanes_at_a_lower_limit() {
    let tier = Tier::from_env();
    let conf = tier.b.root.join("etc/libvirt/libvirtd.conf");
    let shipped = std::fs::read_to_string(&conf).expect("zone b's libvirtd.conf");

    // At 2 no spread fits (one call with its upload is two requests): the provider told so
    // refuses to start, naming the setting to raise.
    limit_zone_b(&tier, &shipped, 2);
    let dir = tempfile::tempdir().unwrap();
    let args = tier.provider_args(
        dir.path(),
        "e2e-limit2",
        (1, 1),
        &["--host-max-client-requests=2"],
    );
    let output = std::process::Command::new(binary())
        .args(&args)
        .output()
        .expect("run bigfleet-libvirt");
    let stderr = String::from_utf8_lossy(&output.stderr);
    let mut wrong = Vec::new();
    if output.status.success()
        || !stderr.contains("raise max_client_requests in the hosts' libvirtd.conf")
    {
        wrong.push(format!("told of a limit of 2, the provider must refuse to start and name the setting: {:?}, {stderr}", output.status));
    }

    // At 3 the provider opens one connection per call of its budget (7) and the lanes load
    // never makes the daemon throttle it.
    limit_zone_b(&tier, &shipped, 3);
    let (more, server) = lanes(&tier, "e2e-limit3", &["--host-max-client-requests=3"]).await;
    wrong.extend(more);
    let clients = tier.daemon_clients(&tier.b);
    println!(
        "host_lanes_at_a_lower_limit: zone b's libvirtd has {clients} clients at max_client_requests 3"
    );
    if clients != 7 {
        wrong.push(format!("at max_client_requests 3 the provider should keep 7 connections to zone b (one per call of --host-budget 7), the daemon lists {clients} clients"));
    }
    drop(server);
    std::fs::write(&conf, &shipped).unwrap();
    tier.libvirtd(&tier.b, "term");
    tier.libvirtd(&tier.b, "start");
    assert!(wrong.is_empty(), "host_lanes_at_a_lower_limit: {wrong:#?}");
}

/// Restarts zone b's libvirtd with `max_client_requests = limit` (the rest as shipped).
fn limit_zone_b(tier: &Tier, shipped: &str, limit: usize) {
    let conf = tier.b.root.join("etc/libvirt/libvirtd.conf");
    let lowered: Vec<String> = (shipped.lines())
        .map(|l| {
            if l.starts_with("max_client_requests ") {
                format!("max_client_requests = {limit}")
            } else {
                l.to_owned()
            }
        })
        .collect();
    std::fs::write(&conf, lowered.join("\n") + "\n").unwrap();
    tier.libvirtd(&tier.b, "term");
    tier.libvirtd(&tier.b, "start");
}

/// One run of the lanes load: what went wrong, and the provider (still running).
async fn lanes(tier: &Tier, label: &str, extra: &[&str]) -> (Vec<String>, Server) {
    let dir = tempfile::tempdir().unwrap();
    let per_zone = u32::try_from(CREATES + DELETES).unwrap();
    let mut flags = vec!["--cpu-allocation-ratio=64"];
    flags.extend_from_slice(extra);
    let server = tier.provider(dir.path(), label, (per_zone, per_zone), &flags);
    let mut c = server.client().await;
    let zones = [&tier.a, &tier.b];
    let mut ids = Vec::new();
    for zone in zones {
        ids.push(ids_in(&mut c, zone.label).await);
    }
    let offsets: Vec<u64> = (zones.iter())
        .map(|z| std::fs::metadata(libvirtd_log(z)).map_or(0, |m| m.len()))
        .collect();

    // The machines to delete, Idle first (not timed).
    let victims: Vec<String> = ids.iter().flat_map(|z| z[..DELETES].to_vec()).collect();
    joined(fire(&c, &victims, false).await).await;
    let started = Instant::now();
    let creates: Vec<String> = (ids.iter())
        .flat_map(|z| z[DELETES..DELETES + CREATES].to_vec())
        .collect();
    let created = fire(&c, &creates, false).await;
    let deleted = fire(&c, &victims, true).await;
    let (created, deleted) = (joined(created).await, joined(deleted).await);
    println!(
        "{label}: {} Creates and {} Deletes done in {:?}",
        creates.len(),
        victims.len(),
        started.elapsed()
    );
    let mut wrong = check_order(&created, &deleted);
    wrong.extend(check_logs(&server, &zones, &offsets));

    // Leave the hosts as they were, then report everything that went wrong.
    joined(fire(&c, &creates, true).await).await;
    (wrong, server)
}

/// Per zone (the Creates and Deletes are in zone order, a then b): every Delete finished
/// before three quarters of that zone's Creates. Returns what did not.
fn check_order(created: &[Instant], deleted: &[Instant]) -> Vec<String> {
    let mut wrong = Vec::new();
    for (zone, (creates, deletes)) in created
        .chunks(CREATES)
        .zip(deleted.chunks(DELETES))
        .enumerate()
    {
        let mut creates = creates.to_vec();
        creates.sort();
        let bound = creates[CREATES * 3 / 4 - 1];
        let last_delete = deletes.iter().max().expect("Deletes");
        let overtaken = creates.iter().filter(|c| *c < last_delete).count();
        println!(
            "host_lanes: zone {zone}: {overtaken} of {CREATES} queued Creates were Idle before the \
             last Delete was done"
        );
        if *last_delete >= bound {
            wrong.push(format!(
                "zone {zone}: the Deletes waited behind the Creates acked before them: \
                 {overtaken} of {CREATES} Creates were Idle before the last Delete was done \
                 (at most {} may be)",
                CREATES * 3 / 4 - 1
            ));
        }
    }
    wrong
}

/// The provider's log and each zone's libvirtd log since `offsets`: what shows throttling
/// or keepalive trouble.
fn check_logs(server: &Server, zones: &[&Zone], offsets: &[u64]) -> Vec<String> {
    let mut wrong = Vec::new();
    let provider = trouble(&server.log_text());
    if !provider.is_empty() {
        wrong.push(format!(
            "the provider's log shows libvirt throttling or keepalive trouble: {provider:#?}"
        ));
    }
    for (zone, offset) in zones.iter().zip(offsets) {
        let daemon = trouble(&since(&libvirtd_log(zone), *offset));
        if !daemon.is_empty() {
            wrong.push(format!(
                "zone {}'s libvirtd log shows throttling or keepalive trouble: {daemon:#?}",
                zone.label
            ));
        }
    }
    wrong
}

#[test]
fn trouble_finds_throttling_and_keepalive_lines() {
    let log = "ok line\n2026 warning : No response from client 0x1 after 5 keepalive messages\n\
               error: Too many active clients\nfine\n\
               2026-12-02 04:29:19.414+0000: 2065: warning : virNetServerClientDispatchRead:1267 : \
               Client hit max requests limit 5. This may result in keep-alive timeouts.\n\
               upload: internal error: client socket is closed (libvirt error 1)";
    assert_eq!(trouble(log).len(), 4);
    assert!(trouble("Create done\nDelete done").is_empty());
}
