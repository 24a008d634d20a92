//! The group-commit writer: one thread, one write transaction and one fsync per batch of
//! queued change sets, applied in queue order.

use std::sync::mpsc;
use std::sync::{Arc, Mutex};

use bigfleet_libvirt_domain::ChangeSet;
use bigfleet_libvirt_ports::StoreError;
use futures::channel::oneshot;
use redb::{Database, Durability};

use super::tables::{fences, machines, meta, operations};

/// Most change sets one transaction takes: bounds the work (and latency) of one commit.
const BATCH_MAX: usize = 1024;

/// A change set and who waits for it to be durable.
pub struct Job {
    pub changes: ChangeSet,
    pub reply: oneshot::Sender<Result<(), StoreError>>,
}

/// The writer thread and its queue. Dropping it closes the queue and waits for the thread,
/// so every queued change set is written before the database closes.
pub struct Writer {
    queue: Mutex<Option<mpsc::Sender<Job>>>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl Writer {
    /// Starts the writer thread.
    pub fn start(database: Arc<Database>) -> Self {
        let (queue, jobs) = mpsc::channel::<Job>();
        let thread = std::thread::Builder::new()
            .name("state-writer".to_owned())
            .spawn(move || run(&database, &jobs))
            .expect("spawn the state writer thread");
        Self {
            queue: Mutex::new(Some(queue)),
            thread: Mutex::new(Some(thread)),
        }
    }

    /// Queues a job; fails only once the writer has stopped.
    pub fn submit(&self, job: Job) -> Result<(), ()> {
        let queue = self
            .queue
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        queue.as_ref().ok_or(())?.send(job).map_err(|_| ())
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        if let Ok(mut queue) = self.queue.lock() {
            queue.take();
        }
        let thread = self.thread.lock().ok().and_then(|mut t| t.take());
        if let Some(thread) = thread {
            let _ = thread.join();
        }
    }
}

fn run(database: &Database, jobs: &mpsc::Receiver<Job>) {
    // After a failed commit nothing later may become durable: the provider treats "this
    // change set is durable" as "everything enqueued before it is durable", so the store
    // fails closed until the process restarts and reloads what is really on disk.
    let mut poisoned: Option<StoreError> = None;
    while let Ok(first) = jobs.recv() {
        let mut batch = vec![first];
        while batch.len() < BATCH_MAX {
            match jobs.try_recv() {
                Ok(job) => batch.push(job),
                Err(_) => break,
            }
        }
        let result = match &poisoned {
            Some(earlier) => Err(earlier.clone()),
            None => write(database, &batch).map_err(|e| {
                StoreError::Io(format!(
                    "{e}; restart the provider to reload the state file"
                ))
            }),
        };
        if let (Err(e), None) = (&result, &poisoned) {
            tracing::error!(error = %e, change_sets = batch.len(), "state commit failed");
            poisoned = Some(e.clone());
        }
        for job in batch {
            let _ = job.reply.send(result.clone());
        }
    }
}

fn write(database: &Database, batch: &[Job]) -> Result<(), redb::Error> {
    let mut txn = database.begin_write()?;
    txn.set_durability(Durability::Immediate)?;
    {
        let mut machine_table = txn.open_table(machines::TABLE)?;
        let mut fence_table = txn.open_table(fences::TABLE)?;
        let mut op_table = txn.open_table(operations::TABLE)?;
        for job in batch {
            let changes = &job.changes;
            for machine in &changes.machines {
                machine_table.insert(machine.id.as_str(), machines::encode(machine).as_slice())?;
            }
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
