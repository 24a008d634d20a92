//! Part 8: a state file written by the release before the compact record format (schema 1,
//! JSON machine records) is migrated when the provider opens it: every record, fence mark,
//! operation id and counter reads back exactly as before, and the file is schema 2 after.
//!
//! The fixture `tests/testdata/state-schema1.redb` was written by that release's binary through
//! gRPC, by the ignored test below (run it with `BIGFLEET_LIBVIRT_BIN` naming such a build
//! to write it again).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use bigfleet_libvirt_proto::v1alpha1 as pb;
use pb::MachineState as S;
use serde_json::Value;

use super::*;
use crate::harness::*;

const SHARD: &str = "fixture-shard";
const CLUSTER: &str = "fixture-cluster";

fn fixture() -> PathBuf {
    repo_root().join("tests/testdata/state-schema1.redb")
}

fn args(state: &Path) -> Vec<String> {
    lane_args(state, 4, &[])
}

/// `state inspect --output=json` of `state`.
fn inspect(state: &Path) -> Value {
    let output = Command::new(binary())
        .args(["state", "inspect", "--output=json", "--state"])
        .arg(state)
        .env_remove("BIGFLEET_LIBVIRT_STATE")
        .output()
        .expect("run state inspect");
    assert!(
        output.status.success(),
        "state inspect: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).expect("JSON report")
}

/// Writes the fixture with the binary under test: one machine Configured with metadata, one
/// Idle by a fenced Create, two Speculative; then a clean SIGTERM.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "writes testdata/state-schema1.redb; run with BIGFLEET_LIBVIRT_BIN set to an older build"]
async fn write_the_schema_1_fixture() {
    let path = fixture();
    let _ = std::fs::remove_file(&path);
    let mut server = boot(&args(&path));
    let mut c = server.client().await;
    let ids: Vec<String> = c
        .list(pb::ListFilter::default())
        .await
        .expect("List")
        .into_inner()
        .machines
        .into_iter()
        .map(|m| m.id)
        .collect();
    create(&mut c, &ids[0], tok(SHARD, 1, 1))
        .await
        .expect("Create");
    reach(&mut c, &ids[0], S::Idle, WALK).await;
    let metadata = [("fixture/k", "v"), ("fixture/empty", "")];
    configure(&mut c, &ids[0], CLUSTER, &metadata, tok(SHARD, 1, 2))
        .await
        .expect("Configure");
    reach(&mut c, &ids[0], S::Configured, WALK).await;
    create(&mut c, &ids[1], tok(SHARD, 2, 1))
        .await
        .expect("Create");
    reach(&mut c, &ids[1], S::Idle, WALK).await;
    server.terminate();
    assert_eq!(server.wait(Duration::from_secs(30)), Some(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schema_1_file_is_migrated_on_open_and_reads_back_exactly() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("old.redb");
    std::fs::copy(fixture(), &path).expect("copy the fixture");
    // Read-only, the old file is read as it is (and not migrated: inspect never writes).
    let before = inspect(&path);
    assert_eq!(before["schema_version"], 1, "{before:#}");
    assert_eq!(before["machines_by_state"]["Configured"], 1, "{before:#}");
    assert_eq!(before["machines_by_state"]["Idle"], 1, "{before:#}");
    let untouched = std::fs::read(fixture()).expect("read the fixture");
    assert_eq!(std::fs::read(&path).expect("read the copy"), untouched);

    let mut server = boot(&args(&path));
    let mut c = server.client().await;
    let listed = c
        .list(pb::ListFilter::default())
        .await
        .expect("List")
        .into_inner()
        .machines;
    let configured: Vec<&pb::Machine> = listed
        .iter()
        .filter(|m| state(m) == S::Configured)
        .collect();
    let [bound] = configured.as_slice() else {
        panic!("one Configured machine: {listed:#?}");
    };
    assert_eq!(bound.cluster, CLUSTER);
    assert_eq!(
        bound.shard_metadata.get("fixture/k").map(String::as_str),
        Some("v")
    );
    assert_eq!(
        bound
            .shard_metadata
            .get("fixture/empty")
            .map(String::as_str),
        Some("")
    );
    assert!(bound.host.is_some(), "{bound:?}");
    let logged = server.log_text();
    assert!(
        logged.contains("migrated the state file to the current schema"),
        "{logged}"
    );
    drop(c);
    server.terminate();
    assert_eq!(server.wait(Duration::from_secs(30)), Some(0));

    let after = inspect(&path);
    assert_eq!(after["schema_version"], 2, "{after:#}");
    for field in [
        "machines",
        "fence_marks",
        "operations",
        "revision",
        "next_operation",
    ] {
        assert_eq!(
            after[field], before[field],
            "{field} changed in the migration"
        );
    }
}
