//! The per-call `rpc` log line at the default level: one line at info for each mutating call
//! that starts a transition, a warning for each refusal, and nothing at info for reads or for
//! idempotent replays. A shard retrying a Create in a loop gets the recorded answer each time;
//! writing a log line for each of those answers would cost more than the answer itself.

use std::time::Duration;

use crate::harness::*;

/// The `rpc` lines logged so far at `level` for `method`.
fn rpc_lines(server: &Server, level: &str, method: &str) -> usize {
    server
        .log_text()
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|v| {
            v["fields"]["message"] == "rpc" && v["level"] == level && v["span"]["method"] == method
        })
        .count()
}

/// The warning line of a failed Get, if logged yet.
fn read_warning(log: &str) -> Option<serde_json::Value> {
    log.lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .find(|v| v["level"] == "WARN" && v["fields"]["method"] == "Get")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replays_and_reads_are_not_logged_at_info_and_changes_are() {
    let server = Server::start(&["--use-fake-backend", "--seed-count=4"]);
    let mut c = server.client().await;
    let id = pick(&server, &mut c).await;
    let first = create(&mut c, &id, None).await.expect("Create accepted");
    for _ in 0..20 {
        let again = create(&mut c, &id, None).await.expect("replay accepted");
        assert_eq!(
            again.operation_id, first.operation_id,
            "an idempotent replay"
        );
    }
    for _ in 0..5 {
        get(&mut c, &id).await.expect("Get");
    }
    let refused = create(&mut c, "no/such/machine", None).await;
    assert!(refused.is_err(), "{refused:?}");
    let unknown = get(&mut c, "no/such/get").await;
    assert!(unknown.is_err(), "{unknown:?}");
    // The log is read from the process's stderr by a thread: give the last line (the
    // failed Get's warning, logged after the refused Create's) time.
    let start = std::time::Instant::now();
    while read_warning(&server.log_text()).is_none() && start.elapsed() < Duration::from_secs(10) {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let counts = (
        rpc_lines(&server, "INFO", "Create"),
        rpc_lines(&server, "WARN", "Create"),
        rpc_lines(&server, "INFO", "Get"),
    );
    assert_eq!(
        counts,
        (1, 1, 0),
        "(info Create, warn Create, info Get); log:\n{}",
        server.log_text()
    );
    // The refusal's status message has its own field: the line's message stays `rpc` (one
    // `message` key per JSON line).
    let log = server.log_text();
    let warned = log
        .lines()
        .find(|l| l.contains("\"WARN\"") && l.contains("no/such/machine"))
        .expect("the refusal's line");
    assert_eq!(warned.matches("\"message\":").count(), 1, "{warned}");
    let warned: serde_json::Value = serde_json::from_str(warned).unwrap();
    assert!(
        warned["fields"]["error"]
            .as_str()
            .unwrap()
            .contains("not found"),
        "{warned}"
    );
    // A read's span is off at info; its warning names the call and the machine itself.
    let read =
        read_warning(&log).unwrap_or_else(|| panic!("the failed Get's warning; log:\n{log}"));
    assert_eq!(read["fields"]["machine_id"], "no/such/get", "{read}");
    assert_eq!(read["fields"]["message"], "rpc", "{read}");
    assert_eq!(read["fields"]["code"], "NotFound", "{read}");
}
