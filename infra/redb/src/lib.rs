//! The durable `StateStore` on redb (`--state PATH`).
//!
//! Opening refuses anything that is not this provider's state, without writing to it: a
//! second process gets a "locked" error at once (redb's file lock), a foreign or truncated
//! file and an unknown schema version are named and left untouched, and the file is opened
//! with redb's integrity check so a corrupt page is an error instead of a later panic.
//!
//! Commits go to one writer thread that applies every change set queued since its last
//! commit in a single write transaction with one fsync (group commit). It never waits to
//! fill a batch: while one fsync runs, the next batch forms, so an ack waits for at most one
//! commit besides its own. A commit that grows the file costs one more fsync (redb makes the
//! new length durable first); the file grows by doubling, so that happens a few times over its
//! life, mostly while it is new. A failed commit fails its batch and is retried by the next one, against the
//! reopened file (see `writer.rs`); failures name the file, its filesystem and free space.

mod readonly;
mod space;
mod tables;
mod view;
mod writer;

pub use readonly::{Inspected, inspect};

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bigfleet_libvirt_domain::{
    ChangeSet, FenceKey, FenceMark, Interner, MachineId, OperationId, Snapshot,
};
use bigfleet_libvirt_ports::{StateStore, StoreError};
use redb::{
    Database, DatabaseError, ReadableDatabase, ReadableTable, ReadableTableMetadata, StorageError,
};

use tables::{fences, machines, meta, operations};

/// redb's page cache. Its default (1 GiB) kept every page of the file written at seeding or
/// read at start-up resident for the life of the process, about as much memory again as the
/// inventory itself; the provider reads the file once, at start-up, and each commit touches
/// a few pages per record, so a small cache holds what commits reuse (the upper levels of
/// the trees) and the OS page cache has the rest.
const CACHE_BYTES: usize = 8 * 1024 * 1024;

/// redb-backed durable state. Clones share one database; dropping the last clone stops the
/// writer thread and closes the file cleanly.
#[derive(Clone)]
pub struct RedbStateStore {
    path: PathBuf,
    writer: Arc<writer::Writer>,
}

impl std::fmt::Debug for RedbStateStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedbStateStore")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

fn unusable(path: &Path, reason: impl Into<String>) -> StoreError {
    StoreError::Unusable {
        path: path.display().to_string(),
        reason: reason.into(),
    }
}

fn io(context: &str, error: impl std::fmt::Display) -> StoreError {
    StoreError::Io(format!("{context}: {error}"))
}

/// A failure to create or write the state file at start-up, with the filesystem it is on,
/// how much room is left there and what to do (a restart alone would fail the same way).
fn unwritable(path: &Path, what: &str, error: impl std::fmt::Display) -> StoreError {
    StoreError::Io(format!(
        "cannot {what} state file {}: {error}; {}; free space there, grow the volume or make \
         it writable (or point --state at a filesystem that is), then start the provider again",
        path.display(),
        space::describe(path),
    ))
}

impl RedbStateStore {
    /// Opens (or, when the file is missing or empty, creates) the state file at `path`.
    ///
    /// # Errors
    /// [`StoreError::Locked`] when another process holds it; [`StoreError::Unusable`] when
    /// it is corrupt, truncated, foreign or of an unknown schema version (the file is not
    /// modified); [`StoreError::Io`] when it cannot be read or created.
    pub fn open(path: &Path) -> Result<Self, StoreError> {
        let fresh = match std::fs::metadata(path) {
            Ok(meta) if meta.is_dir() => {
                return Err(unusable(path, "it is a directory, not a file"));
            }
            Ok(meta) => meta.len() == 0,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => true,
            Err(e) => return Err(io(&format!("inspect {}", path.display()), e)),
        };
        if fresh {
            if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
                std::fs::create_dir_all(parent)
                    .map_err(|e| unwritable(path, "create the directory of the", e))?;
            }
        }
        if !fresh {
            // Look before writing: neither a read-only open nor a private view writes, so a
            // foreign file or an unknown schema is refused byte for byte untouched, also
            // when a crash left it needing repair.
            precheck(path)?;
        }
        let mut builder = Database::builder();
        builder.set_check_integrity_on_open(true);
        builder.set_cache_size(CACHE_BYTES);
        // redb may panic on some corrupt layouts even with the check; treat that as corrupt.
        let opened = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            if fresh {
                builder.create(path)
            } else {
                builder.open(path)
            }
        }));
        let mut database = match opened {
            Ok(Ok(database)) => database,
            Ok(Err(e)) => return Err(open_error(path, e)),
            Err(_) => return Err(unusable(path, "redb found it corrupt")),
        };
        if fresh {
            initialise(&database).map_err(|e| unwritable(path, "initialise the", e))?;
        } else if check_schema(path, &database)? == meta::MIGRATES_FROM {
            migrate(path, &mut database)?;
        }
        let writer = Arc::new(writer::Writer::start(path.to_owned(), database));
        Ok(Self {
            path: path.to_owned(),
            writer,
        })
    }

    /// Writes every change set queued so far, stops the writer and closes the file cleanly,
    /// for every clone at once. Commits after it fail as they do once the writer has stopped.
    /// (Dropping the last clone does the same; this is for a process that exits without
    /// dropping what holds the store.)
    pub fn close(&self) {
        self.writer.close();
    }
}

/// Everything durable in the open database.
fn read_all(path: &Path, database: &impl ReadableDatabase) -> Result<Snapshot, StoreError> {
    let read = |e: &dyn std::fmt::Display| unusable(path, format!("read failed: {e}"));
    let txn = database.begin_read().map_err(|e| read(&e))?;
    let mut snapshot = Snapshot::default();
    let meta_table = txn.open_table(meta::TABLE).map_err(|e| read(&e))?;
    let counter = |key| -> Result<i64, StoreError> {
        Ok(meta_table
            .get(key)
            .map_err(|e| read(&e))?
            .map_or(0, |v| v.value()))
    };
    snapshot.revision = counter(meta::REVISION_KEY)?;
    snapshot.next_operation = u64::try_from(counter(meta::NEXT_OPERATION_KEY)?)
        .map_err(|_| unusable(path, "the operation counter is negative"))?;
    let table = txn.open_table(machines::TABLE).map_err(|e| read(&e))?;
    let count = table.len().map_err(|e| read(&e))?;
    snapshot
        .machines
        .reserve(usize::try_from(count).unwrap_or(0));
    // Equal maps share one allocation from the start, so a large file does not hold every
    // record's own copy (even briefly) before the core interns them.
    let mut interner = Interner::default();
    for entry in table.iter().map_err(|e| read(&e))? {
        let (key, value) = entry.map_err(|e| read(&e))?;
        let mut machine = machines::decode(key.value(), value.value())
            .map_err(|e| unusable(path, format!("machine {:?}: {e}", key.value())))?;
        interner.intern_machine(&mut machine);
        snapshot.machines.push(machine);
    }
    for entry in txn
        .open_table(fences::TABLE)
        .map_err(|e| read(&e))?
        .iter()
        .map_err(|e| read(&e))?
    {
        let (key, value) = entry.map_err(|e| read(&e))?;
        let (shard_id, machine_id) = key.value();
        let (epoch, sequence) = value.value();
        let key = FenceKey {
            shard_id: shard_id.to_owned(),
            machine_id: machine_id.to_owned(),
        };
        snapshot.fences.push((key, FenceMark { epoch, sequence }));
    }
    let ops = txn.open_table(operations::TABLE).map_err(|e| read(&e))?;
    for entry in ops.iter().map_err(|e| read(&e))? {
        let (key, value) = entry.map_err(|e| read(&e))?;
        let (machine_id, kind) = key.value();
        let kind = operations::decode_kind(kind)
            .ok_or_else(|| unusable(path, format!("unknown operation kind {kind}")))?;
        let id = MachineId::new(machine_id)
            .map_err(|_| unusable(path, "an operation record has an empty machine id"))?;
        snapshot
            .operations
            .push((id, kind, OperationId::from_stored(value.value().to_owned())));
    }
    Ok(snapshot)
}

fn open_error(path: &Path, error: DatabaseError) -> StoreError {
    match error {
        DatabaseError::DatabaseAlreadyOpen | DatabaseError::LockProtocolMismatch => {
            StoreError::Locked {
                path: path.display().to_string(),
            }
        }
        DatabaseError::Storage(StorageError::Io(e))
            if e.kind() == std::io::ErrorKind::InvalidData =>
        {
            unusable(
                path,
                format!("it is not a bigfleet-libvirt state file ({e})"),
            )
        }
        DatabaseError::Storage(StorageError::Corrupted(reason)) => unusable(
            path,
            format!("it is corrupt or truncated ({reason}); restore it from a backup"),
        ),
        DatabaseError::UpgradeRequired(version) => unusable(
            path,
            format!("it uses redb file format {version}, which this build cannot read"),
        ),
        DatabaseError::Storage(StorageError::Io(e)) => unwritable(path, "open the", e),
        other => io(&format!("open {}", path.display()), other),
    }
}

/// Writes the schema version into a brand-new file.
fn initialise(database: &Database) -> Result<(), redb::Error> {
    let txn = database.begin_write()?;
    {
        let mut table = txn.open_table(meta::TABLE)?;
        table.insert(meta::SCHEMA_VERSION_KEY, meta::SCHEMA_VERSION)?;
        txn.open_table(machines::TABLE)?;
        txn.open_table(fences::TABLE)?;
        txn.open_table(operations::TABLE)?;
    }
    txn.commit()?;
    Ok(())
}

/// Rewrites a schema-1 file as schema 2: every JSON machine record re-encoded in the compact
/// form and the schema version raised, in one transaction, so a crash midway leaves the
/// file as it was (and it migrates on the next start). Then the space the larger records
/// held is given back to the filesystem.
fn migrate(path: &Path, database: &mut Database) -> Result<(), StoreError> {
    let fail = |e: &dyn std::fmt::Display| unwritable(path, "migrate the", e);
    let txn = database.begin_write().map_err(|e| fail(&e))?;
    let migrated = {
        let mut rewritten = Vec::new();
        let table = txn.open_table(machines::TABLE).map_err(|e| fail(&e))?;
        for entry in table.iter().map_err(|e| fail(&e))? {
            let (key, value) = entry.map_err(|e| fail(&e))?;
            let machine = machines::decode(key.value(), value.value())
                .map_err(|e| unusable(path, format!("machine {:?}: {e}", key.value())))?;
            rewritten.push((key.value().to_owned(), machines::encode(&machine)));
        }
        drop(table);
        // A new table filled in key order packs its pages full; rewriting the records in
        // place would keep the old tree's half-empty pages.
        txn.delete_table(machines::TABLE).map_err(|e| fail(&e))?;
        let mut table = txn.open_table(machines::TABLE).map_err(|e| fail(&e))?;
        for (key, value) in &rewritten {
            table
                .insert(key.as_str(), value.as_slice())
                .map_err(|e| fail(&e))?;
        }
        let mut meta_table = txn.open_table(meta::TABLE).map_err(|e| fail(&e))?;
        meta_table
            .insert(meta::SCHEMA_VERSION_KEY, meta::SCHEMA_VERSION)
            .map_err(|e| fail(&e))?;
        rewritten.len()
    };
    txn.commit().map_err(|e| fail(&e))?;
    let before = std::fs::metadata(path).map_or(0, |m| m.len());
    if let Err(e) = database.compact() {
        // The file is migrated and correct; it only keeps its old size.
        tracing::warn!(path = %path.display(), error = %e, "could not compact the state file after migrating it");
    }
    let after = std::fs::metadata(path).map_or(0, |m| m.len());
    tracing::info!(
        path = %path.display(),
        records = migrated,
        from = meta::MIGRATES_FROM,
        to = meta::SCHEMA_VERSION,
        bytes_before = before,
        bytes_after = after,
        "migrated the state file to the current schema"
    );
    Ok(())
}

/// Checks the file's schema before anything writes to it: opened read-only, or, when a
/// crash left it needing redb's repair, repaired in a private view (the repair of the file
/// itself, by the read-write open, comes only once the schema is known to be this build's).
fn precheck(path: &Path) -> Result<(), StoreError> {
    match readonly::open_unmodified(path)? {
        readonly::Unmodified::Clean(database) => check_schema(path, &database),
        readonly::Unmodified::Repaired(database) => check_schema(path, &database),
    }
    .map(|_| ())
}

/// Refuses files without a schema version this build reads; returns the version.
fn check_schema(path: &Path, database: &impl ReadableDatabase) -> Result<i64, StoreError> {
    let not_ours = || {
        unusable(
            path,
            "it is a redb file but not a bigfleet-libvirt state file (no schema version)",
        )
    };
    let txn = database
        .begin_read()
        .map_err(|e| io("read the schema version", e))?;
    let table = match txn.open_table(meta::TABLE) {
        Ok(table) => table,
        Err(redb::TableError::TableDoesNotExist(_)) => return Err(not_ours()),
        Err(e) => return Err(io("read the schema version", e)),
    };
    let version = table
        .get(meta::SCHEMA_VERSION_KEY)
        .map_err(|e| io("read the schema version", e))?
        .ok_or_else(not_ours)?
        .value();
    if version != meta::SCHEMA_VERSION && version != meta::MIGRATES_FROM {
        return Err(unusable(
            path,
            format!(
                "its schema version is {version} but this build reads only {} and {} \
                 (which it migrates); run the bigfleet-libvirt release that wrote it",
                meta::SCHEMA_VERSION,
                meta::MIGRATES_FROM
            ),
        ));
    }
    Ok(version)
}

impl StateStore for RedbStateStore {
    fn load(&self) -> impl Future<Output = Result<Snapshot, StoreError>> + Send {
        let (reply, done) = futures::channel::oneshot::channel();
        let queued = self.writer.submit(writer::Message::Load(reply));
        async move {
            if queued.is_err() {
                return Err(StoreError::Io("the state writer has stopped".to_owned()));
            }
            done.await
                .unwrap_or_else(|_| Err(StoreError::Io("the state writer has stopped".to_owned())))
        }
    }

    fn commit(
        &self,
        changes: ChangeSet,
    ) -> impl Future<Output = Result<(), StoreError>> + Send + 'static {
        let (reply, done) = futures::channel::oneshot::channel();
        let queued = self
            .writer
            .submit(writer::Message::Commit(writer::Job { changes, reply }));
        async move {
            if queued.is_err() {
                return Err(StoreError::Io("the state writer has stopped".to_owned()));
            }
            done.await
                .unwrap_or_else(|_| Err(StoreError::Io("the state writer has stopped".to_owned())))
        }
    }

    fn resume(&self) {
        // A stopped writer refuses everything anyway.
        let _ = self.writer.submit(writer::Message::Resume);
    }
}

#[cfg(test)]
mod tests;
