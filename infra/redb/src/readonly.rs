//! Reading a state file without serving it (`bigfleet-libvirt state inspect`).
//!
//! An operator looking inside a state file during an incident must not make the incident
//! worse: the file is only ever opened read-only, so it stays byte for byte as it was. A
//! running provider holds redb's exclusive lock, so the read-only open is refused at once
//! and that is reported as [`StoreError::Locked`] instead of waiting. A file that was not
//! closed cleanly (the provider was killed) cannot be read without redb's repair, which
//! writes; such a file is copied to a private temporary file and the copy is repaired and
//! read, so the original is still untouched.

use std::path::Path;

use bigfleet_libvirt_domain::Snapshot;
use bigfleet_libvirt_ports::StoreError;
use redb::{Database, DatabaseError};

use super::{check_schema, io, open_error, read_all, unusable};

/// What a state file holds.
#[derive(Clone, Debug, PartialEq)]
pub struct Inspected {
    /// The schema version of every table.
    pub schema_version: i64,
    /// Whether the file was closed cleanly. When not, what was read comes from a repaired
    /// private copy (the file itself was not changed).
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
    let opened = std::panic::catch_unwind(|| Database::builder().open_read_only(path));
    match opened {
        Ok(Ok(database)) => {
            let schema_version = check_schema(path, &database)?;
            Ok(Inspected {
                schema_version,
                closed_cleanly: true,
                snapshot: read_all(path, &database)?,
            })
        }
        Ok(Err(DatabaseError::RepairAborted)) => read_repaired_copy(path),
        Ok(Err(e)) => Err(open_error(path, e)),
        Err(_) => Err(unusable(path, "redb found it corrupt")),
    }
}

/// Copies `path` to a private temporary file, lets redb repair the copy, and reads it.
fn read_repaired_copy(path: &Path) -> Result<Inspected, StoreError> {
    let copy = tempfile::Builder::new()
        .prefix("bigfleet-libvirt-inspect-")
        .suffix(".redb")
        .tempfile()
        .map_err(|e| io("create a temporary copy of the state file", e))?;
    std::fs::copy(path, copy.path())
        .map_err(|e| io(&format!("copy {} to read it", path.display()), e))?;
    let mut builder = Database::builder();
    builder.set_check_integrity_on_open(true);
    let opened =
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| builder.open(copy.path())));
    let database = match opened {
        Ok(Ok(database)) => database,
        Ok(Err(e)) => return Err(open_error(path, e)),
        Err(_) => return Err(unusable(path, "redb found it corrupt")),
    };
    let schema_version = check_schema(path, &database)?;
    let snapshot = read_all(path, &database)?;
    drop(database);
    copy.close()
        .map_err(|e| io("remove the temporary copy of the state file", e))?;
    Ok(Inspected {
        schema_version,
        closed_cleanly: false,
        snapshot,
    })
}
