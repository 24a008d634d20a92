//! The run's history: what the fakes saw happen, in order, each at its simulated time. The
//! fakes only append to it (a commit made records durable, an operation executed on a
//! host); they never judge what they saw. The checkers read it (`checkers::read_history`)
//! whenever they run: on every answer leaving the provider, at every restart, at
//! quiescence, and once more when the run ends, so no event goes unchecked.

use std::sync::Arc;
use std::time::Duration;

use bigfleet_libvirt_domain::{Machine, MachineId};

use crate::spans::SpanSeen;

/// One thing a fake saw happen.
#[derive(Clone, Debug)]
pub enum Event {
    /// A commit made these records durable, each with the machine's previous durable
    /// record (`None` for its first).
    Durable(Vec<(Option<Arc<Machine>>, Arc<Machine>)>),
    /// An operation executed on a host: the machine it was for, and how many hosts hold a
    /// domain for that machine right after it.
    HostEffect {
        /// The machine the operation was for.
        machine: MachineId,
        /// Hosts holding a domain for it afterwards.
        domains: usize,
    },
    /// A request of the provider's connection `connection` arrived at host `host`, which
    /// then had `in_flight` requests of that connection (this one included) not yet
    /// finished, queued in the daemon or executing.
    HostLoad {
        /// The host's index (`zone-<host>`).
        host: usize,
        /// Which provider process's connection (one per `SimHypervisor`).
        connection: u64,
        /// Its requests on the host right after this one arrived.
        in_flight: usize,
    },
    /// The provider opened a span of interest (`crate::spans`).
    Span(SpanSeen),
}

/// An event and when it happened (simulated time since the start).
#[derive(Clone, Debug)]
pub struct Entry {
    /// When.
    pub at: Duration,
    /// What.
    pub event: Event,
}

/// The events not yet read by the checkers, oldest first.
#[derive(Debug, Default)]
pub struct History {
    unread: Vec<Entry>,
}

impl History {
    /// Appends what happened at `at`.
    pub fn push(&mut self, at: Duration, event: Event) {
        self.unread.push(Entry { at, event });
    }

    /// Every event not yet read, oldest first; they count as read from now on.
    pub fn take_unread(&mut self) -> Vec<Entry> {
        std::mem::take(&mut self.unread)
    }
}
