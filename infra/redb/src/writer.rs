//! The group-commit writer: one thread that owns the database, with one write transaction
//! and one fsync per batch of queued change sets, applied in queue order. A batch is every
//! change set queued when the previous commit ended, so a change set waits for at most the
//! commit running when it was queued and its own. A commit that has to grow the file costs
//! one fsync more: redb makes the new length durable before the new pages can be named by
//! a header. The file grows by doubling until it fills a region, so this happens a few times
//! over its life, mostly while a new file fills up; under a 300 ms fsync the acks that wait
//! behind such a commit take three fsyncs (about 900 ms), still two commits.
//!
//! A failed commit is never sticky. It fails its batch; every change set queued after it is
//! then refused without being written (it was decided on top of the failed one) until the
//! provider, having taken those decisions back, sends `Resume`. redb latches an I/O error
//! (every later transaction fails until the file is reopened), so after a failure the
//! database is closed and the next attempt reopens the file first: the retry really goes to
//! the disk, and succeeds as soon as the filesystem has room again.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::mpsc;

use bigfleet_libvirt_domain::{ChangeSet, Snapshot};
use bigfleet_libvirt_ports::StoreError;
use futures::channel::oneshot;
use redb::{Database, Durability};

use super::space;
use super::tables::{fences, machines, meta, operations};

/// Most change sets one transaction takes: bounds the work (and latency) of one commit.
const BATCH_MAX: usize = 1024;

/// A change set and who waits for it to be durable.
pub struct Job {
    pub changes: ChangeSet,
    pub reply: oneshot::Sender<Result<(), StoreError>>,
}

/// What the writer thread is asked to do, in queue order.
pub enum Message {
    /// Commit a change set.
    Commit(Job),
    /// Attempt change sets again after a failed commit.
    Resume,
    /// Read everything durable.
    Load(oneshot::Sender<Result<Snapshot, StoreError>>),
}

/// The writer thread and its queue. Dropping it closes the queue and waits for the thread,
/// so every queued change set is written before the database closes.
pub struct Writer {
    queue: Mutex<Option<mpsc::Sender<Message>>>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl Writer {
    /// Starts the writer thread on an open database.
    pub fn start(path: PathBuf, database: Database) -> Self {
        let (queue, messages) = mpsc::channel::<Message>();
        let thread = std::thread::Builder::new()
            .name("state-writer".to_owned())
            .spawn(move || {
                let mut state = State {
                    path,
                    database: Some(database),
                    refusing: None,
                };
                state.run(&messages);
            })
            .expect("spawn the state writer thread");
        Self {
            queue: Mutex::new(Some(queue)),
            thread: Mutex::new(Some(thread)),
        }
    }

    /// Queues a message; fails only once the writer has stopped.
    pub fn submit(&self, message: Message) -> Result<(), ()> {
        let queue = self
            .queue
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        queue.as_ref().ok_or(())?.send(message).map_err(|_| ())
    }

    /// Closes the queue and waits for the thread: every change set queued so far is written,
    /// then the database closes. Later messages are refused, as after a stop.
    pub fn close(&self) {
        if let Ok(mut queue) = self.queue.lock() {
            queue.take();
        }
        let thread = self.thread.lock().ok().and_then(|mut t| t.take());
        if let Some(thread) = thread {
            let _ = thread.join();
        }
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        self.close();
    }
}

struct State {
    path: PathBuf,
    /// `None` after a failed commit closed it; reopened by the next attempt.
    database: Option<Database>,
    /// The failure that change sets are refused for until `Resume`.
    refusing: Option<StoreError>,
}

impl State {
    fn run(&mut self, messages: &mpsc::Receiver<Message>) {
        let mut next = messages.recv().ok();
        while let Some(message) = next.take() {
            match message {
                Message::Resume => self.refusing = None,
                Message::Load(reply) => {
                    let _ = reply.send(self.load());
                }
                Message::Commit(first) => {
                    let mut batch = vec![first];
                    while batch.len() < BATCH_MAX {
                        match messages.try_recv() {
                            Ok(Message::Commit(job)) => batch.push(job),
                            Ok(other) => {
                                next = Some(other);
                                break;
                            }
                            Err(_) => break,
                        }
                    }
                    self.commit(batch);
                }
            }
            if next.is_none() {
                next = messages.recv().ok();
            }
        }
    }

    fn commit(&mut self, batch: Vec<Job>) {
        let result = match &self.refusing {
            Some(earlier) => Err(StoreError::AfterFailure(earlier.to_string())),
            None => self.attempt(&batch),
        };
        // The provider logs the failure once, when it takes the decisions back.
        if let (Err(e), None) = (&result, &self.refusing) {
            self.refusing = Some(e.clone());
        }
        for job in batch {
            let _ = job.reply.send(result.clone());
        }
    }

    /// One write transaction for the batch, on the database (reopened if a failure closed
    /// it). On failure the database is closed, since redb fails every later transaction
    /// until it is reopened.
    fn attempt(&mut self, batch: &[Job]) -> Result<(), StoreError> {
        let path = self.path.clone();
        let written = self.database().and_then(|database| {
            write(database, batch).map_err(|e| commit_failure(&path, "commit", &e))
        });
        if written.is_err() {
            self.database = None;
        }
        written
    }

    fn load(&mut self) -> Result<Snapshot, StoreError> {
        let path = self.path.clone();
        super::read_all(&path, self.database()?)
    }

    /// The open database, reopening the file after a failure closed it.
    fn database(&mut self) -> Result<&Database, StoreError> {
        if self.database.is_none() {
            let reopened = Database::builder()
                .set_cache_size(super::CACHE_BYTES)
                .open(&self.path)
                .map_err(|e| self.failure("reopen", &e))?;
            tracing::info!(path = %self.path.display(), "reopened the state file");
            self.database = Some(reopened);
        }
        Ok(self
            .database
            .as_ref()
            .expect("the database was just opened"))
    }

    fn failure(&self, what: &str, error: &dyn std::fmt::Display) -> StoreError {
        commit_failure(&self.path, what, error)
    }
}

/// A failed write to the state file, with where it lives, how full that is and what to do.
pub fn commit_failure(path: &Path, what: &str, error: &dyn std::fmt::Display) -> StoreError {
    StoreError::Io(format!(
        "{what} of state file {} failed: {error}; {}; free space there or grow the volume \
         (or make it writable)",
        path.display(),
        space::describe(path),
    ))
}

fn write(database: &Database, batch: &[Job]) -> Result<(), redb::Error> {
    let mut txn = database.begin_write()?;
    txn.set_durability(Durability::Immediate)?;
    {
        let mut machine_table = txn.open_table(machines::TABLE)?;
        let mut fence_table = txn.open_table(fences::TABLE)?;
        let mut op_table = txn.open_table(operations::TABLE)?;
        // Records go in in key order (a stable sort: when several change sets of the batch
        // hold one machine, the last one's record is still written last). In the order they
        // come, a seed of slot ids like `.../99`, `.../100` lands all over the tree and
        // leaves its pages half empty: the state file was nearly half as large again.
        let mut records: Vec<_> = batch.iter().flat_map(|j| &j.changes.machines).collect();
        records.sort_by(|a, b| a.id.cmp(&b.id));
        for machine in records {
            machine_table.insert(machine.id.as_str(), machines::encode(machine).as_slice())?;
        }
        for job in batch {
            let changes = &job.changes;
            for (key, mark) in &changes.fences {
                let k = (key.shard_id.as_str(), key.machine_id.as_str());
                fence_table.insert(k, (mark.epoch, mark.sequence))?;
            }
            for (id, kind, op) in &changes.operations {
                op_table.insert((id.as_str(), operations::encode_kind(*kind)), op.as_str())?;
            }
        }
        if let Some(last) = batch.last() {
            let mut meta_table = txn.open_table(meta::TABLE)?;
            meta_table.insert(meta::REVISION_KEY, last.changes.revision)?;
            let next = i64::try_from(last.changes.next_operation).unwrap_or(i64::MAX);
            meta_table.insert(meta::NEXT_OPERATION_KEY, next)?;
        }
    }
    txn.commit()?;
    Ok(())
}
