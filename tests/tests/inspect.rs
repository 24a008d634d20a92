//! `bigfleet-libvirt state inspect`: the real binary writes a state file over gRPC (Creates,
//! a Configure with metadata, fenced calls), and the inspector, run as its own process,
//! must print exactly what Get served before the stop, refuse while the provider holds the
//! file, and leave the file byte-identical, also after the provider was killed.

use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use bigfleet_libvirt_proto::v1alpha1 as pb;
use pb::MachineState as S;
use serde_json::Value;
use tonic::Code;

use crate::harness::*;

const STATE: &str = "state.redb";

/// Starts the provider on `dir/state.redb` (fast fake, four slots).
fn start(dir: &Path) -> Server {
    let state = format!("--state={}", dir.join(STATE).display());
    Server::start(&[
        "--use-fake-backend",
        "--provider=inspect",
        "--seed-count=4",
        "--fake-delay-min=5ms",
        "--fake-delay-max=20ms",
        state.as_str(),
    ])
}

/// Runs `state inspect` in `dir` on `state.redb` with `args`.
fn inspect(dir: &Path, args: &[&str]) -> Output {
    Command::new(binary())
        .current_dir(dir)
        .args(["state", "inspect", "--state", STATE])
        .args(args)
        .env_remove("BIGFLEET_LIBVIRT_STATE")
        .output()
        .expect("run bigfleet-libvirt state inspect")
}

fn stdout(output: &Output) -> String {
    assert!(
        output.status.success(),
        "state inspect failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout.clone()).expect("UTF-8 output")
}

fn json(dir: &Path, args: &[&str]) -> Value {
    let mut all = vec!["--output=json"];
    all.extend_from_slice(args);
    serde_json::from_str(&stdout(&inspect(dir, &all))).expect("JSON output")
}

/// What the provider served before the stop, and the operation ids it answered.
struct Served {
    machines: Vec<pb::Machine>,
    operations: Vec<(String, &'static str, String)>,
    shard: String,
    bound: String,
}

/// Creates two machines (one unfenced, one fenced), configures the fenced one with
/// metadata, tries a stale call, and returns what Get then serves for every touched id.
async fn write_history(server: &Server) -> Served {
    let mut c = server.client().await;
    let ids = pick_n(server, &mut c, 2).await;
    let (plain, bound) = (ids[0].clone(), ids[1].clone());
    let shard = "shard-a".to_owned();
    let mut operations = Vec::new();
    let ack = create(&mut c, &plain, None).await.expect("unfenced Create");
    operations.push((plain.clone(), "create", ack.operation_id));
    let ack = create(&mut c, &bound, tok(&shard, 3, 1))
        .await
        .expect("fenced Create");
    operations.push((bound.clone(), "create", ack.operation_id));
    reach(&mut c, &plain, S::Idle, SETTLE).await;
    reach(&mut c, &bound, S::Idle, SETTLE).await;
    let ack = configure(
        &mut c,
        &bound,
        "cluster-1",
        &[("team", "blue"), ("note", "line\nbreak")],
        tok(&shard, 3, 2),
    )
    .await
    .expect("fenced Configure");
    operations.push((bound.clone(), "configure", ack.operation_id));
    reach(&mut c, &bound, S::Configured, SETTLE).await;
    let stale = drain(&mut c, &bound, 0, tok(&shard, 3, 1)).await;
    assert_eq!(code(&stale), Code::FailedPrecondition, "{stale:?}");
    let mut machines = Vec::new();
    for listed in list_all(&mut c).await.machines {
        machines.push(get(&mut c, &listed.id).await.expect("Get"));
    }
    assert_eq!(machines.len(), 4, "every slot is served");
    machines.sort_by(|a, b| a.id.cmp(&b.id));
    Served {
        machines,
        operations,
        shard,
        bound,
    }
}

/// SIGTERM and wait for the exit on a blocking thread, so this test's runtime stays free to
/// close the connections of the clients dropped before: the provider's graceful stop waits
/// for open connections (up to its 10 s drain period), and a runtime blocked in `wait`
/// would keep them open until then.
async fn stop(mut server: Server) {
    tokio::task::spawn_blocking(move || {
        server.terminate();
        assert!(
            server.wait(Duration::from_secs(30)).is_some(),
            "the provider stops on SIGTERM"
        );
    })
    .await
    .expect("the stopping thread");
}

fn text(value: &Value, key: &str) -> String {
    value[key].as_str().unwrap_or_default().to_owned()
}

/// Every field Get served is what the inspector shows for the stored record.
fn assert_matches(served: &pb::Machine, shown: &Value) {
    let context = format!("Get served {served:?}\ninspect showed {shown}");
    assert_eq!(text(shown, "id"), served.id, "{context}");
    assert_eq!(
        text(shown, "state"),
        format!("{:?}", state(served)),
        "{context}"
    );
    let host = served.host.clone().unwrap_or_default();
    assert_eq!(text(&shown["host"], "provider"), host.provider, "{context}");
    assert_eq!(text(&shown["host"], "reference"), host.r#ref, "{context}");
    assert_eq!(
        text(shown, "instance_type"),
        served.instance_type,
        "{context}"
    );
    assert_eq!(text(shown, "zone"), served.zone, "{context}");
    assert_eq!(text(shown, "cluster"), served.cluster, "{context}");
    assert_eq!(text(shown, "last_error"), served.last_error, "{context}");
    assert_eq!(
        shown["price_per_hour"].as_f64(),
        Some(served.price_per_hour),
        "{context}"
    );
    for (field, wire) in [
        ("shard_metadata", &served.shard_metadata),
        ("labels", &served.labels),
    ] {
        let stored: std::collections::HashMap<String, String> =
            serde_json::from_value(shown[field].clone()).expect(field);
        assert_eq!(&stored, wire, "{field}: {context}");
    }
}

#[tokio::test]
async fn inspect_shows_what_get_served_and_leaves_the_file_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path());
    let served = write_history(&server).await;

    // While the provider runs it holds the file: refused at once, naming the file.
    let running = inspect(dir.path(), &[]);
    assert!(!running.status.success(), "refused while the provider runs");
    let error = String::from_utf8_lossy(&running.stderr);
    assert!(error.contains(STATE), "names the file: {error}");
    assert!(
        error.contains("in use by another bigfleet-libvirt process"),
        "{error}"
    );
    assert!(running.stdout.is_empty(), "prints no partial report");

    stop(server).await;
    let before = std::fs::read(dir.path().join(STATE)).unwrap();
    let report = json(dir.path(), &[]);
    let table = stdout(&inspect(dir.path(), &[]));
    let one = json(dir.path(), &["--machine", &served.bound]);
    assert_eq!(
        std::fs::read(dir.path().join(STATE)).unwrap(),
        before,
        "the state file is byte-identical after three inspections"
    );

    assert_eq!(report["file"], STATE);
    assert_eq!(report["schema_version"], 2);
    assert_eq!(report["closed_cleanly"], true);
    assert!(report["revision"].as_i64().unwrap() > 0, "{report}");
    assert_eq!(report["next_operation"], 3, "three operations were minted");
    let machines = report["machines"].as_array().expect("machines");
    assert_eq!(machines.len(), served.machines.len(), "{report}");
    for (wire, stored) in served.machines.iter().zip(machines) {
        assert_matches(wire, stored);
    }
    assert_eq!(report["machines_by_state"]["Speculative"], 2, "{report}");
    assert_eq!(report["machines_by_state"]["Idle"], 1, "{report}");
    assert_eq!(report["machines_by_state"]["Configured"], 1, "{report}");

    assert_records(&report, &served);
    assert_table(&table, &served);

    // --machine narrows everything to that machine.
    let only = one["machines"].as_array().unwrap();
    assert_eq!(only.len(), 1);
    assert_eq!(only[0]["id"], served.bound.as_str());
    assert_eq!(one["fence_marks"].as_array().unwrap().len(), 1);
    assert_eq!(one["operations"].as_array().unwrap().len(), 2);
}

/// The fence marks and operation ids are exactly those the calls made.
fn assert_records(report: &Value, served: &Served) {
    let marks: Vec<(String, String, i64, i64)> = report["fence_marks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            (
                text(f, "shard_id"),
                text(f, "machine_id"),
                f["epoch"].as_i64().unwrap(),
                f["sequence"].as_i64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        marks,
        vec![(served.shard.clone(), served.bound.clone(), 3, 2)],
        "the stale Drain moved no mark; the unfenced Create set none"
    );
    let mut operations: Vec<(String, String, String)> = report["operations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| {
            (
                text(o, "machine_id"),
                text(o, "kind"),
                text(o, "operation_id"),
            )
        })
        .collect();
    operations.sort();
    let mut expected: Vec<(String, String, String)> = served
        .operations
        .iter()
        .map(|(m, k, o)| (m.clone(), (*k).to_owned(), o.clone()))
        .collect();
    expected.sort();
    assert_eq!(operations, expected, "the operation ids the calls answered");
}

/// The table shows the same records, with the metadata's newline escaped.
fn assert_table(table: &str, served: &Served) {
    for machine in &served.machines {
        assert!(table.contains(&machine.id), "{table}");
        if let Some(host) = machine.host.as_ref().filter(|h| !h.r#ref.is_empty()) {
            assert!(table.contains(host.r#ref.as_str()), "{table}");
        }
    }
    assert!(table.contains("note=line\\nbreak, team=blue"), "{table}");
    assert!(!table.contains("line\nbreak"), "no raw control character");
}

#[tokio::test]
async fn inspect_reads_a_killed_providers_file_without_repairing_it() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = start(dir.path());
    let served = write_history(&server).await;
    server.kill();
    let before = std::fs::read(dir.path().join(STATE)).unwrap();
    let report = json(dir.path(), &[]);
    assert_eq!(
        std::fs::read(dir.path().join(STATE)).unwrap(),
        before,
        "the killed provider's file is not repaired in place"
    );
    assert_eq!(report["closed_cleanly"], false, "{report}");
    let machines = report["machines"].as_array().unwrap();
    assert_eq!(machines.len(), served.machines.len(), "{report}");
    for (wire, stored) in served.machines.iter().zip(machines) {
        assert_matches(wire, stored);
    }
    let table = stdout(&inspect(dir.path(), &[]));
    assert!(table.contains("NOT cleanly"), "{table}");
}

#[tokio::test]
async fn inspect_table_snapshot() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path());
    write_history(&server).await;
    stop(server).await;
    let table = stdout(&inspect(dir.path(), &[]));
    insta::assert_snapshot!("state_inspect_table", table);
}

#[test]
fn inspect_refuses_bad_requests_clearly() {
    let dir = tempfile::tempdir().unwrap();
    // No file: nothing is created.
    let missing = inspect(dir.path(), &[]);
    assert!(!missing.status.success());
    let error = String::from_utf8_lossy(&missing.stderr);
    assert!(error.contains("no state file at state.redb"), "{error}");
    assert!(!dir.path().join(STATE).exists(), "inspect never creates");
    // No --state at all.
    let output = Command::new(binary())
        .args(["state", "inspect"])
        .env_remove("BIGFLEET_LIBVIRT_STATE")
        .output()
        .unwrap();
    assert!(!output.status.success());
    let error = String::from_utf8_lossy(&output.stderr);
    assert!(error.contains("needs --state FILE"), "{error}");
}

#[tokio::test]
async fn inspect_names_an_unknown_machine() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path());
    write_history(&server).await;
    stop(server).await;
    let output = inspect(dir.path(), &["--machine", "no/such\u{1b}id"]);
    assert!(!output.status.success());
    let error = String::from_utf8_lossy(&output.stderr);
    assert!(error.contains(r#"no machine "no/such\u{1b}id""#), "{error}");
    assert!(error.contains("4 machines stored"), "{error}");
}
