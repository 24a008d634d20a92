//! Issue 24, the per-machine timeline, black-box: `GET /timeline?machine=ID` on the metrics
//! port of the real binary. A Create → Configure → Drain → Delete walk reads back in order
//! with its shard, tokens, operation ids, phases and durations and the caller's trace id; a
//! failed Configure's error is there; a machine keeps its newest 16 events; no bootstrap
//! blob is ever in it; unknown machines are 404.

use std::net::SocketAddr;

use serde_json::Value;

use super::*;

const KEPT: usize = 16;
const CALLER_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";

async fn timeline(metrics: SocketAddr, id: &str) -> (u16, String) {
    let path = format!("/timeline?machine={}", query_encoded(id));
    let (status, _, body) = http_get(metrics, &path).await.expect("GET /timeline");
    (status, body)
}

async fn events(metrics: SocketAddr, id: &str) -> Vec<Value> {
    let (status, body) = timeline(metrics, id).await;
    assert_eq!(status, 200, "{body}");
    let page: Value = serde_json::from_str(&body).expect("JSON");
    assert_eq!(page["machine_id"], id);
    assert_eq!(page["kept_at_most"], KEPT);
    page["events"].as_array().expect("events").clone()
}

/// Each event as `event kind/op answer state`, for an order check that reads like the walk.
fn summary(event: &Value) -> String {
    let field = |k: &str| event[k].as_str().unwrap_or("").to_owned();
    match field("event").as_str() {
        "received" => format!("received {} {}", field("kind"), field("answer")),
        "phase" => format!("phase {}", field("op")),
        other => format!("{other} {} {}", field("kind"), field("state")),
    }
}

/// A provider with fault hooks; `traced`: with an OTLP endpoint (a closed port: the spans
/// are dropped, but they have trace ids), without one otherwise.
fn server(traced: bool) -> Server {
    let mut args = vec![
        "--use-fake-backend".to_owned(),
        "--seed-count=8".to_owned(),
        "--fake-fault-hooks".to_owned(),
    ];
    args.extend(FAST.map(str::to_owned));
    if traced {
        let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = closed.local_addr().unwrap();
        drop(closed);
        args.push(format!("--otlp-endpoint=http://{addr}"));
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    Server::start(&args)
}

/// Walks `id` through Create (in a caller's trace) → Configure → Drain → Delete with
/// `shard`'s tokens (epoch 3, sequences 1 to 4); the Create's and Configure's operation ids.
async fn walk(c: &mut Client, id: &str, shard: &str) -> (String, String) {
    let mut request = tonic::Request::new(pb::CreateRequest {
        machine_id: id.to_owned(),
        shard_id: shard.to_owned(),
        shard_epoch: 3,
        sequence_number: 1,
    });
    let parent = format!("00-{CALLER_TRACE}-00f067aa0ba902b7-01");
    request
        .metadata_mut()
        .insert("traceparent", parent.parse().unwrap());
    let create_op = c.create(request).await.expect("Create").into_inner();
    reach(c, id, S::Idle, SETTLE).await;
    let configure_op = configure(c, id, "tl", &[], tok(shard, 3, 2)).await;
    reach(c, id, S::Configured, SETTLE).await;
    drain(c, id, 0, tok(shard, 3, 3)).await.expect("Drain");
    reach(c, id, S::Idle, SETTLE).await;
    delete(c, id, tok(shard, 3, 4)).await.expect("Delete");
    reach(c, id, S::Speculative, SETTLE).await;
    let configure_op = configure_op.expect("Configure").operation_id;
    (create_op.operation_id, configure_op)
}

/// A full walk with a fenced shard, the Create sent in a caller's trace, tracing on: every
/// call, phase and end in order, with the token, operation ids, durations and trace ids.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_full_walk_reads_back_in_order() {
    let server = server(true);
    let metrics = server.metrics_addr.expect("metrics port");
    let mut c = server.client().await;
    let id = pick(&server, &mut c).await;
    let shard = unique_shard("timeline");
    let (create_op, configure_op) = walk(&mut c, &id, &shard).await;
    let events = events(metrics, &id).await;
    let walk: Vec<String> = events.iter().map(summary).collect();
    let want = [
        "received create transition started",
        "phase CreateDomain",
        "transition completed create Idle",
        "received configure transition started",
        "phase Configure",
        "phase NodeReady",
        "transition completed configure Configured",
        "received drain transition started",
        "phase Drain",
        "transition completed drain Idle",
        "received delete transition started",
        "phase DeleteDomain",
        "transition completed delete Speculative",
    ];
    assert_eq!(walk, want, "{events:#?}");
    let calls: Vec<&Value> = events.iter().filter(|e| e["event"] == "received").collect();
    for (sequence, call) in (1..).zip(&calls) {
        assert_eq!(call["shard_id"], shard.as_str());
        assert_eq!(call["epoch"], 3);
        assert_eq!(call["sequence"], sequence);
    }
    assert_eq!(calls[0]["operation_id"], create_op.as_str());
    assert_eq!(calls[1]["operation_id"], configure_op.as_str());
    for event in &events {
        let duration = event["duration_ms"].as_u64();
        if event["event"] != "received" {
            assert!(duration.is_some(), "a duration: {event}");
        }
        assert!(event["trace_id"].as_str().is_some(), "a trace id: {event}");
        assert!(event["at"].as_str().is_some_and(|at| at.ends_with('Z')));
    }
    // The Create's call, phase and end are in the caller's trace; the others are not.
    let traced: Vec<&str> = events[..3]
        .iter()
        .map(|e| e["trace_id"].as_str().unwrap())
        .collect();
    assert_eq!(traced, [CALLER_TRACE; 3]);
    assert_ne!(events[3]["trace_id"], CALLER_TRACE);
    let at: Vec<u64> = events
        .iter()
        .map(|e| e["at_unix_nanos"].as_u64().unwrap())
        .collect();
    assert!(at.is_sorted(), "in time order: {at:?}");
}

/// A Configure that fails: its phase and its end carry the error, which is the machine's
/// `last_error`; a call refused afterwards shows its code and message. (No OTLP endpoint
/// here: no trace ids.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_failed_configure_says_why() {
    let server = server(false);
    let metrics = server.metrics_addr.expect("metrics port");
    let mut c = server.client().await;
    let id = pick(&server, &mut c).await;
    create(&mut c, &id, None).await.expect("Create");
    reach(&mut c, &id, S::Idle, SETTLE).await;
    configure(&mut c, &id, "fault-error", &[], None)
        .await
        .expect("Configure accepted");
    let failed = reach(&mut c, &id, S::Failed, SETTLE).await;
    let refused = drain(&mut c, &id, 0, None).await;
    assert_eq!(code(&refused), tonic::Code::Aborted);

    let events = events(metrics, &id).await;
    let end = events
        .iter()
        .find(|e| e["event"] == "transition failed")
        .unwrap_or_else(|| panic!("no failure in {events:#?}"));
    assert_eq!(end["kind"], "configure");
    assert_eq!(end["state"], "Failed");
    assert_eq!(
        end["error"],
        failed.last_error.as_str(),
        "the machine's last_error"
    );
    let phase = events
        .iter()
        .find(|e| e["event"] == "phase" && e["op"] == "Configure")
        .expect("the Configure phase");
    assert!(
        phase["error"].as_str().is_some_and(|e| !e.is_empty()),
        "{phase}"
    );
    // Without an OTLP endpoint no span has a trace id, so no event names one.
    assert!(
        events.iter().all(|e| e.get("trace_id").is_none()),
        "{events:#?}"
    );
    let last = events.last().unwrap();
    assert_eq!(last["event"], "received");
    assert_eq!(last["kind"], "drain");
    assert_eq!(last["answer"], "refused");
    assert_eq!(last["code"], "Aborted");
    assert!(
        last["error"].as_str().is_some_and(|e| e.contains("Failed")),
        "{last}"
    );
}

/// A machine keeps its newest 16 events: 20 refused calls leave the last 16, newest last;
/// the bootstrap blob of a Configure is in none; unknown ids and a missing id are refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn each_machine_keeps_its_newest_events() {
    let server = server(false);
    let metrics = server.metrics_addr.expect("metrics port");
    let mut c = server.client().await;
    let id = pick(&server, &mut c).await;
    let shard = unique_shard("bound");
    for sequence in 1..=20 {
        // A Drain of a Speculative machine: refused (ABORTED), one event each.
        let refused = drain(&mut c, &id, 0, tok(&shard, 1, sequence)).await;
        assert_eq!(code(&refused), tonic::Code::Aborted);
    }
    let blob = b"TIMELINE-SECRET-BLOB".repeat(50);
    let configure = configure_map(
        &mut c,
        &id,
        "x",
        Default::default(),
        blob,
        tok(&shard, 1, 21),
    );
    assert_eq!(code(&configure.await), tonic::Code::Aborted);
    let events = events(metrics, &id).await;
    assert_eq!(events.len(), KEPT, "{events:#?}");
    let sequences: Vec<i64> = events
        .iter()
        .map(|e| e["sequence"].as_i64().unwrap())
        .collect();
    assert_eq!(
        sequences,
        (6..=21).collect::<Vec<_>>(),
        "the newest, in order"
    );
    let (_, body) = timeline(metrics, &id).await;
    assert!(
        !body.contains("TIMELINE-SECRET"),
        "the blob is never on the timeline"
    );

    let (status, body) = timeline(metrics, "no/such/machine").await;
    assert_eq!(status, 404, "{body}");
    let (status, _, _) = http_get(metrics, "/timeline").await.unwrap();
    assert_eq!(status, 400);
}
