//! Reading a state file without writing to it: `bigfleet-libvirt state inspect`, and the
//! check the provider makes before its own (read-write) open.
//!
//! An operator looking inside a state file during an incident must not make the incident
//! worse, and a file the provider then refuses (a newer schema, another program's file) must
//! be left as it was found: the file is only ever opened read-only, so it stays byte for
//! byte as it was. A running provider holds redb's exclusive lock, so the read-only open is
//! refused at once and that is reported as [`StoreError::Locked`] instead of waiting. A file
//! that was not closed cleanly (the provider was killed) cannot be read without redb's
//! repair, which writes; such a file is repaired in a private view whose writes stay in
//! memory (`view.rs`), so the original is still untouched.

use std::path::Path;

use bigfleet_libvirt_domain::Snapshot;
use bigfleet_libvirt_ports::StoreError;
use redb::{Database, DatabaseError, ReadOnlyDatabase, ReadableDatabase};

use super::{CACHE_BYTES, check_schema, io, open_error, read_all, unusable, view};

/// What a state file holds.
#[derive(Clone, Debug, PartialEq)]
pub struct Inspected {
    /// The schema version of every table.
    pub schema_version: i64,
    /// Whether the file was closed cleanly. When not, what was read comes from a repaired
    /// private view (the file itself was not changed).
    pub closed_cleanly: bool,
    /// Every record.
    pub snapshot: Snapshot,
}

/// Reads every record of the state file at `path` without modifying it.
///
/// # Errors
/// [`StoreError::Locked`] while a provider holds the file; [`StoreError::Unusable`] when it
/// is empty, corrupt, foreign or of an unknown schema version; [`StoreError::Io`] when it is
/// missing or cannot be read.
pub fn inspect(path: &Path) -> Result<Inspected, StoreError> {
    match std::fs::metadata(path) {
        Ok(meta) if meta.is_dir() => return Err(unusable(path, "it is a directory, not a file")),
        Ok(meta) if meta.len() == 0 => {
            return Err(unusable(
                path,
                "it is empty: no provider has written to it yet",
            ));
        }
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(StoreError::Io(format!(
                "there is no state file at {}; check the --state path",
                path.display()
            )));
        }
        Err(e) => return Err(io(&format!("inspect {}", path.display()), e)),
    }
    match open_unmodified(path)? {
        Unmodified::Clean(database) => read(path, &database, true),
        Unmodified::Repaired(database) => read(path, &database, false),
    }
}

fn read(
    path: &Path,
    database: &impl ReadableDatabase,
    closed_cleanly: bool,
) -> Result<Inspected, StoreError> {
    Ok(Inspected {
        schema_version: check_schema(path, database)?,
        closed_cleanly,
        snapshot: read_all(path, database)?,
    })
}

/// A state file opened without writing to it.
pub(crate) enum Unmodified {
    /// It was closed cleanly: opened read-only.
    Clean(ReadOnlyDatabase),
    /// It was not (a crash left it): repaired in a private view, the file unchanged.
    Repaired(Database),
}

/// Opens the file at `path` for reading without modifying it: read-only, or, when redb
/// must repair it first, as a private view.
///
/// # Errors
/// As [`super::RedbStateStore::open`]: locked, corrupt, truncated or foreign.
pub(crate) fn open_unmodified(path: &Path) -> Result<Unmodified, StoreError> {
    let corrupt = || unusable(path, "redb found it corrupt");
    // redb may panic on some corrupt layouts; treat that as corrupt.
    match std::panic::catch_unwind(|| Database::builder().open_read_only(path)) {
        Ok(Ok(database)) => Ok(Unmodified::Clean(database)),
        Ok(Err(DatabaseError::RepairAborted)) => {
            match std::panic::catch_unwind(|| view::open_repaired(path, CACHE_BYTES)) {
                Ok(Ok(database)) => Ok(Unmodified::Repaired(database)),
                Ok(Err(e)) => Err(open_error(path, e)),
                Err(_) => Err(corrupt()),
            }
        }
        Ok(Err(e)) => Err(open_error(path, e)),
        Err(_) => Err(corrupt()),
    }
}
