//! The memory budget for large List answers held for their readers, and the turn-taking of
//! large List builds.
//!
//! A full List of a large inventory is one message of many megabytes (11.8 MB for 50,000
//! machines in use). It is not copied: it is streamed to its reader from the machines' own
//! encodings (`list_stream`), which the inventory memoises and shares (one reference-counted
//! buffer per version of a record). So what a streamed answer really holds is small next to
//! its size on the wire, and that is what it is charged:
//!
//! - the answer's own list of references to the encodings (16 bytes a machine) and its
//!   revision;
//! - the encodings nothing but Lists holds any more: versions of records that changed since
//!   the answer was built, kept for the readers still reading it. A version held by several
//!   answers is counted once ([`ListBudget::in_use`] measures all the answers held together);
//! - for every stream, [`STREAM_WORKING`] bytes: the pieces being written and the ones
//!   HTTP/2 holds until the reader takes them.
//!
//! Answers are shared: a List asking for what an answer still being streamed holds (the
//! same query, no `max_results`, at the same head revision, so the very same bytes) joins
//! it and is charged its stream's working bytes only. Readers of the same answer never
//! wait for each other, however slowly each reads.
//!
//! A List that may be large (estimated above [`LARGE_ANSWER`] bytes) first reserves what it
//! will hold (an estimate until its answer is built, then the measure), waiting while the
//! Lists already held leave no room for it: first come, first served, measured again each
//! time memory is given back. An answer larger than the whole budget is admitted when
//! nothing else is held. List never fails for the budget. Then it waits for its turn to be
//! built (one at a time, off the async workers, so other calls keep their threads).
//!
//! Memory is given back when a stream ends: sent, reset, its connection closed, or cut by
//! the send-progress deadline (`list_stream`): a reader that takes nothing for
//! `--list-progress-timeout` loses its stream, so a stopped reader cannot hold memory or
//! the budget. The budget bounds what Lists hold when each is admitted; records changing
//! afterwards can make a held answer grow (up to its size on the wire) until its readers
//! finish or are cut, and the next admissions see it.
//!
//! Small answers (picks with `max_results`, deltas since a revision) are not counted: each is
//! bounded by [`LARGE_ANSWER`], and their number by the connection and stream caps.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};

use bigfleet_libvirt_domain::ListQuery;
use bigfleet_libvirt_proto::wire::EncodedMachineList;
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};

/// The size above which an answer is built in turn and counted against the budget.
pub const LARGE_ANSWER: usize = 1 << 20;

/// The default budget (`--list-memory-budget-mib`): with the chart's default memory limit,
/// 64 MiB held for readers leaves room for a 50,000-machine inventory all in use.
pub const DEFAULT_BUDGET_MIB: usize = 64;

/// The most of an answer one frame of its stream carries (`list_stream`).
pub const CHUNK: usize = 16 * 1024;

/// What every stream of a large answer is charged besides the answer: the piece being
/// written, the one HTTP/2 waits to send, and the one it is sending.
pub const STREAM_WORKING: usize = 3 * CHUNK;

/// What one machine's encoding is taken to weigh before any large List was built.
const FIRST_GUESS_PER_MACHINE: usize = 256;

/// What building an answer holds per machine until it is measured: the page's reference
/// to the record and the answer's reference to its encoding.
const BUILD_PER_MACHINE: usize = 8 + 16;

/// The List memory budget, shared by every List call of the process.
#[derive(Clone, Debug)]
pub struct ListBudget {
    ledger: Arc<Ledger>,
    turn: Arc<Semaphore>,
    /// Bytes per machine on the wire of the last large answer, for estimating the next one.
    per_machine: Arc<AtomicUsize>,
}

/// What the Lists hold, and who waits for room.
#[derive(Debug)]
struct Ledger {
    limit: usize,
    held: Mutex<Held>,
    /// Admissions in arrival order: only the first waiter measures.
    queue: Arc<Semaphore>,
    /// Signalled whenever memory is given back.
    freed: Notify,
}

#[derive(Debug, Default)]
struct Held {
    /// Reserved bytes: answers being built, and every stream's working bytes.
    reserved: usize,
    /// The answers being streamed (each shared by the streams reading it).
    answers: Vec<Weak<Answer>>,
}

/// A List answer being streamed, shared by every stream that reads it.
#[derive(Debug)]
pub struct Answer {
    list: Arc<EncodedMachineList>,
    /// The query it answers and the revision it was taken at, when other Lists may join it.
    shared_as: Option<(ListQuery, i64)>,
    ledger: Weak<Ledger>,
}

impl Answer {
    /// The answer's message.
    #[must_use]
    pub fn list(&self) -> &Arc<EncodedMachineList> {
        &self.list
    }
}

impl Drop for Answer {
    fn drop(&mut self) {
        if let Some(ledger) = self.ledger.upgrade() {
            ledger.freed.notify_waiters();
        }
    }
}

/// Bytes reserved in the budget, given back when dropped.
#[derive(Debug)]
pub struct Reservation {
    ledger: Arc<Ledger>,
    bytes: usize,
}

impl Reservation {
    /// Gives back all but `bytes` of the reservation (once the answer is built and measured
    /// with the others, only the stream's working bytes stay reserved).
    pub fn shrink_to(&mut self, bytes: usize) {
        if bytes < self.bytes {
            self.ledger.lock().reserved -= self.bytes - bytes;
            self.bytes = bytes;
            self.ledger.freed.notify_waiters();
        }
    }

    /// The bytes reserved.
    #[must_use]
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.ledger.lock().reserved -= self.bytes;
        self.ledger.freed.notify_waiters();
    }
}

impl Ledger {
    fn lock(&self) -> MutexGuard<'_, Held> {
        self.held.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Held {
    /// The answers still streamed (forgetting the finished ones).
    fn live(&mut self) -> Vec<Arc<Answer>> {
        self.answers.retain(|a| a.strong_count() > 0);
        self.answers.iter().filter_map(Weak::upgrade).collect()
    }
}

/// Bytes the `answers` hold that nothing else does: each answer's references and
/// revision, and every encoding held by these answers alone (counted once however many
/// of them hold it). An encoding the inventory still holds (the current version of its
/// record) is not counted: it is there with or without the Lists.
#[must_use]
pub fn held_by(answers: &[Arc<Answer>]) -> usize {
    let mut total = 0;
    // Encodings held more than once, all holders perhaps answers: (address, length, holders).
    let mut shared: Vec<(usize, usize, usize)> = Vec::new();
    for answer in answers {
        let list = &answer.list;
        total += size_of::<Answer>()
            + size_of::<EncodedMachineList>()
            + list.machines.capacity() * size_of::<Arc<[u8]>>()
            + list.revision.capacity();
        for machine in &list.machines {
            match Arc::strong_count(machine) {
                1 => total += machine.len(),
                holders if holders <= answers.len() => {
                    let address = Arc::as_ptr(machine).cast::<u8>().addr();
                    shared.push((address, machine.len(), holders));
                }
                // More holders than answers: the inventory holds it too.
                _ => {}
            }
        }
    }
    shared.sort_unstable();
    for holders in shared.chunk_by(|a, b| a.0 == b.0) {
        let (_, len, count) = holders[0];
        if holders.len() >= count {
            total += len;
        }
    }
    total
}

impl ListBudget {
    /// A budget of `mib` MiB (at least 1).
    #[must_use]
    pub fn new(mib: usize) -> Self {
        Self {
            ledger: Arc::new(Ledger {
                limit: mib.max(1).saturating_mul(1 << 20),
                held: Mutex::new(Held::default()),
                queue: Arc::new(Semaphore::new(1)),
                freed: Notify::new(),
            }),
            turn: Arc::new(Semaphore::new(1)),
            per_machine: Arc::new(AtomicUsize::new(FIRST_GUESS_PER_MACHINE)),
        }
    }

    /// The budget in bytes.
    #[must_use]
    pub fn bytes(&self) -> usize {
        self.ledger.limit
    }

    /// Whether an answer of at most `machines` machines may be large.
    #[must_use]
    pub fn may_be_large(&self, machines: usize) -> bool {
        machines.saturating_mul(self.per_machine.load(Ordering::Relaxed)) > LARGE_ANSWER
    }

    /// What building an answer of at most `machines` machines and streaming it holds until
    /// the answer is measured.
    #[must_use]
    pub fn estimate(machines: usize) -> usize {
        machines
            .saturating_mul(BUILD_PER_MACHINE)
            .saturating_add(STREAM_WORKING)
    }

    /// Waits for this large List's turn to be built; the turn ends when the guard drops.
    pub async fn turn(&self) -> OwnedSemaphorePermit {
        Arc::clone(&self.turn)
            .acquire_owned()
            .await
            .expect("the List turn semaphore is never closed")
    }

    /// Waits until `bytes` more fit in the budget beside what the Lists hold now (or
    /// nothing is held), first come first served, and reserves them.
    pub async fn reserve(&self, bytes: usize) -> Reservation {
        let ledger = &self.ledger;
        let _first = Arc::clone(&ledger.queue)
            .acquire_owned()
            .await
            .expect("the List admission queue is never closed");
        loop {
            let freed = ledger.freed.notified();
            tokio::pin!(freed);
            freed.as_mut().enable();
            {
                let mut held = ledger.lock();
                let answers = held.live();
                let in_use = held.reserved + held_by(&answers);
                if in_use == 0 || in_use.saturating_add(bytes) <= ledger.limit {
                    held.reserved += bytes;
                    return Reservation {
                        ledger: Arc::clone(ledger),
                        bytes,
                    };
                }
            }
            freed.await;
        }
    }

    /// Whether an answer to `query` is being streamed (at any revision): a List asking the
    /// same may join it if it is still at the head revision.
    #[must_use]
    pub fn sharing(&self, query: &ListQuery) -> bool {
        query.max_results.is_none()
            && self
                .ledger
                .lock()
                .live()
                .iter()
                .any(|a| a.shared_as.as_ref().is_some_and(|(q, _)| q == query))
    }

    /// The answer to `query` at `revision` being streamed, if any.
    #[must_use]
    pub fn shared(&self, query: &ListQuery, revision: i64) -> Option<Arc<Answer>> {
        if query.max_results.is_some() {
            return None;
        }
        let key = (query.clone(), revision);
        self.ledger
            .lock()
            .live()
            .into_iter()
            .find(|a| a.shared_as.as_ref() == Some(&key))
    }

    /// Takes `list`, the answer to `query` at `revision`, to be streamed; it counts
    /// against the budget (measured with the others) until its last stream ends. Answers
    /// to a query with `max_results` are never shared (capped pages vary per call).
    #[must_use]
    pub fn keep(&self, list: EncodedMachineList, query: &ListQuery, revision: i64) -> Arc<Answer> {
        let answer = Arc::new(Answer {
            list: Arc::new(list),
            shared_as: query
                .max_results
                .is_none()
                .then(|| (query.clone(), revision)),
            ledger: Arc::downgrade(&self.ledger),
        });
        self.ledger.lock().answers.push(Arc::downgrade(&answer));
        answer
    }

    /// Learns what an answer of `machines` machines weighed, for the next estimate.
    pub fn observe(&self, bytes: usize, machines: usize) {
        if let Some(per_machine) = bytes.checked_div(machines) {
            self.per_machine
                .store(per_machine.max(1), Ordering::Relaxed);
        }
    }

    /// Bytes of the budget in use now, measured (for tests and the log).
    #[must_use]
    pub fn in_use(&self) -> usize {
        let mut held = self.ledger.lock();
        let answers = held.live();
        held.reserved + held_by(&answers)
    }
}

#[cfg(test)]
#[path = "list_budget_tests.rs"]
mod tests;
