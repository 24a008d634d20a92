//! A state file of a newer schema is refused and left byte for byte as it was, whether it
//! was closed cleanly or a crash left it needing redb's repair (issue 37). The crash is
//! real: the provider is SIGKILLed on its file; that file, its schema version then raised by
//! redb directly (as a newer release would have written it), is captured while redb still
//! has it open, which is what a crash right after that commit leaves.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use redb::{Database, DatabaseError, TableDefinition};

use super::*;
use crate::harness::*;

/// The state file's schema table, as the provider lays it out (infra/redb/src/tables/meta.rs).
const META: TableDefinition<&str, i64> = TableDefinition::new("meta");
/// A schema version no build has written yet.
const NEWER: i64 = 3;
/// The refusal, as the provider words it today.
const REFUSAL: &str = "its schema version is 3 but this build reads only 2 and 1 (which it \
                       migrates); run the bigfleet-libvirt release that wrote it";

/// Whether redb must repair the file before it can be read (it was not closed cleanly).
fn needs_repair(path: &Path) -> bool {
    matches!(
        Database::builder().open_read_only(path),
        Err(DatabaseError::RepairAborted)
    )
}

/// Writes `crashed` (a newer-schema file a crash left open) and `clean` (the same, closed)
/// from `killed`, a file the provider was SIGKILLed on.
fn newer_schema_files(killed: &Path, crashed: &Path, clean: &Path) {
    let live = killed.with_extension("live");
    std::fs::copy(killed, &live).unwrap();
    let database = Database::open(&live).expect("redb repairs the killed provider's file");
    let txn = database.begin_write().unwrap();
    txn.open_table(META)
        .unwrap()
        .insert("schema_version", NEWER)
        .unwrap();
    txn.commit().unwrap();
    std::fs::copy(&live, crashed).unwrap();
    drop(database);
    std::fs::copy(&live, clean).unwrap();
}

/// Runs `command` (the binary, expected to refuse the file at once); its stderr.
fn refused(mut command: Command) -> String {
    let child = command
        .env_remove("RUST_LOG")
        .env_remove("BIGFLEET_LIBVIRT_STATE")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn bigfleet-libvirt");
    let (status, stderr) = exit_within(child, Duration::from_secs(60));
    let status = status.unwrap_or_else(|| panic!("still running after 60 s: {stderr}"));
    assert!(!status.success(), "the file must be refused: {stderr}");
    stderr
}

/// Starts the provider on `path` and `state inspect`s it: both refuse it with today's
/// message naming the file, and the file is byte-identical afterwards.
fn assert_refused_untouched(path: &Path) {
    let before = std::fs::read(path).unwrap();
    let mut serve = Command::new(binary());
    serve
        .args(lane_args(path, 4, &[]))
        .args(["--addr=127.0.0.1:0", "--metrics-addr=127.0.0.1:0"]);
    let mut inspect = Command::new(binary());
    inspect.args(["state", "inspect", "--state"]).arg(path);
    for (what, command) in [("the provider", serve), ("state inspect", inspect)] {
        let stderr = refused(command);
        assert!(
            stderr.contains(REFUSAL) && stderr.contains(&path.display().to_string()),
            "{what} must refuse {} with {REFUSAL:?}; it said: {stderr}",
            path.display()
        );
        let after = std::fs::read(path).unwrap();
        let changed: Vec<usize> = before
            .chunks(4096)
            .zip(after.chunks(4096))
            .enumerate()
            .filter(|(_, (a, b))| a != b)
            .map(|(page, _)| page)
            .collect();
        assert!(
            before == after,
            "{what} changed the refused file: pages {changed:?} differ, {} bytes before, {} after",
            before.len(),
            after.len()
        );
    }
}

#[tokio::test]
async fn a_newer_schema_file_is_refused_untouched_also_when_a_crash_left_it() {
    let dir = tempfile::tempdir().unwrap();
    let killed = dir.path().join("killed.redb");
    let mut server = boot(&lane_args(&killed, 4, &[]));
    let mut c = server.client().await;
    let id = pick(&server, &mut c).await;
    create(&mut c, &id, None).await.expect("Create");
    drop(c);
    sigkill(&mut server);
    assert!(
        needs_repair(&killed),
        "a SIGKILLed provider leaves its file open"
    );

    let crashed = dir.path().join("newer-crashed.redb");
    let clean = dir.path().join("newer-clean.redb");
    newer_schema_files(&killed, &crashed, &clean);
    assert!(needs_repair(&crashed), "the crash image needs repair");
    assert!(!needs_repair(&clean), "the closed file does not");

    assert_refused_untouched(&crashed);
    assert!(needs_repair(&crashed), "still as the crash left it");
    assert_refused_untouched(&clean);

    // This build's own file, left by the same crash, is still repaired and served.
    let server = boot(&lane_args(&killed, 4, &[]));
    let mut c = server.client().await;
    get(&mut c, &id)
        .await
        .expect("the acknowledged Create survived");
}
