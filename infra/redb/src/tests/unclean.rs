//! Files a crash left behind (the process died with the file open, so redb must repair it
//! before it can be read): a newer schema, another program's file and a corrupt one are
//! refused byte for byte untouched, because the repair is tried on a private view first;
//! this build's own file is repaired in place and loads everything it held.

use std::path::Path;

use bigfleet_libvirt_ports::StateStore;
use redb::{Database, DatabaseError, TableDefinition, WriteTransaction};

use super::super::RedbStateStore;
use super::super::tables::meta;
use super::{downgrade_to_schema_1, refuse, write_some_state};

/// Commits `change` to the file at `path` and leaves there what a crash right after that
/// commit leaves: the bytes on disk while redb still has the file open (its commit is
/// durable, its "needs recovery" mark is set). Asserts that redb would repair it.
fn crash_after(path: &Path, change: impl FnOnce(&WriteTransaction)) {
    let live = path.with_extension("live");
    std::fs::rename(path, &live).unwrap();
    let database = Database::open(&live).unwrap();
    let txn = database.begin_write().unwrap();
    change(&txn);
    txn.commit().unwrap();
    std::fs::copy(&live, path).unwrap();
    drop(database);
    std::fs::remove_file(&live).unwrap();
    assert_needs_repair(path);
}

fn assert_needs_repair(path: &Path) {
    let opened = Database::builder().open_read_only(path);
    assert!(
        matches!(opened, Err(DatabaseError::RepairAborted)),
        "the file must need redb's repair: {:?}",
        opened.map(|_| ())
    );
}

fn set_schema(version: i64) -> impl FnOnce(&WriteTransaction) {
    move |txn| {
        txn.open_table(meta::TABLE)
            .unwrap()
            .insert(meta::SCHEMA_VERSION_KEY, version)
            .unwrap();
    }
}

#[tokio::test]
async fn a_newer_schema_left_by_a_crash_is_refused_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.redb");
    write_some_state(&path).await;
    crash_after(&path, set_schema(3));
    refuse(
        &path,
        "schema version is 3 but this build reads only 2 and 1",
    );
    assert_needs_repair(&path);
}

#[test]
fn a_redb_file_of_another_program_left_by_a_crash_is_refused_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("other.redb");
    drop(Database::create(&path).unwrap());
    crash_after(&path, |txn| {
        let def: TableDefinition<&str, &str> = TableDefinition::new("things");
        txn.open_table(def).unwrap().insert("a", "b").unwrap();
    });
    refuse(&path, "not a bigfleet-libvirt state file");
    assert_needs_repair(&path);
}

#[tokio::test]
async fn a_corrupt_file_left_by_a_crash_is_refused_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.redb");
    write_some_state(&path).await;
    crash_after(&path, set_schema(meta::SCHEMA_VERSION));
    let mut bytes = std::fs::read(&path).unwrap();
    // Scribble over every page after the header: both commit slots point at garbage.
    for (i, byte) in bytes.iter_mut().enumerate().skip(4096) {
        *byte = (i % 251) as u8;
    }
    std::fs::write(&path, &bytes).unwrap();
    refuse(&path, "corrupt");
}

#[tokio::test]
async fn this_builds_file_left_by_a_crash_is_repaired_and_loads_everything() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.redb");
    write_some_state(&path).await;
    let expected = RedbStateStore::open(&path).unwrap().load().await.unwrap();
    crash_after(&path, set_schema(meta::SCHEMA_VERSION));
    let before = std::fs::read(&path).unwrap();
    let store = RedbStateStore::open(&path).unwrap();
    assert_eq!(store.load().await.unwrap(), expected);
    drop(store);
    // Repaired in place (and closed cleanly), as before this build checked first.
    let after = std::fs::read(&path).unwrap();
    assert!(before != after, "the repair writes the file");
    Database::builder()
        .open_read_only(&path)
        .expect("a repaired file opens read-only");
}

#[tokio::test]
async fn a_schema_1_file_left_by_a_crash_is_repaired_and_migrated() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.redb");
    write_some_state(&path).await;
    let expected = RedbStateStore::open(&path).unwrap().load().await.unwrap();
    downgrade_to_schema_1(&path);
    crash_after(&path, set_schema(meta::MIGRATES_FROM));
    let store = RedbStateStore::open(&path).unwrap();
    assert_eq!(store.load().await.unwrap(), expected);
}
