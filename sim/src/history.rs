//! The run's history: what was seen to happen, in order, each at its simulated time. The
//! fakes append what they did (a commit made durable, an operation executed on a host, a
//! call sent to a host and how it ended), the provider process what it answered and when
//! it started (`server`), the shards what they sent and were answered (`workload`), the
//! span layer the spans the provider opened (`spans`), and the supervisor each kill. None
//! of them judges what it saw. The checkers read it (`checkers::Checkers::read_history`)
//! every 500 ms of simulated time, at quiescence and once more when the run ends, and judge
//! each event against what came before it, so no event goes unchecked and each violation
//! carries the simulated time of its event.

use std::sync::Arc;
use std::time::Duration;

use bigfleet_libvirt_domain::{ChangeSet, FenceMark, Kind, Machine, MachineId, StringMap};
use bigfleet_libvirt_proto::v1alpha1 as pb;

use crate::fakes::books::Holding;
use crate::rpc::{Reply, Rpc};

/// One thing seen to happen.
#[derive(Clone, Debug)]
pub enum Event {
    /// The store made this change set durable (applied to the disk in this order).
    Durable(ChangeSet),
    /// An operation executed on a host: the machine it was for, and how many hosts hold a
    /// domain for that machine right after it.
    HostEffect {
        /// The machine the operation was for.
        machine: MachineId,
        /// Hosts holding a domain for it afterwards.
        domains: usize,
    },
    /// After a Create or a Delete on host `host`: what each domain's definition there
    /// holds alone (by domain name: `cpu N`, PCI addresses), and the domains whose claim
    /// the acting process's books still hold as in flight (none once its sequence is over).
    Books {
        /// The host's index.
        host: usize,
        /// Each domain's holdings.
        holdings: Vec<Holding>,
        /// Pending claims left in the books.
        in_flight: Vec<String>,
    },
    /// A request of the provider's connection `connection` arrived at host `host`, which
    /// then had `in_flight` requests of that connection (this one included) not yet
    /// finished, queued in the daemon or executing, and `host_in_flight` of all that
    /// provider process's connections to it.
    HostLoad {
        /// The host's index (`zone-<host>`).
        host: usize,
        /// Which connection: the provider process's (one per `SimHypervisor`) times
        /// [`CONNECTIONS_PER_PROCESS`](crate::fakes::hypervisor::CONNECTIONS_PER_PROCESS),
        /// plus its index among that process's connections to the host.
        connection: u64,
        /// Its requests on the host right after this one arrived.
        in_flight: usize,
        /// The process's requests on the host, all its connections together.
        host_in_flight: usize,
    },
    /// The provider asked host `host` for a call (an operation on one domain; describe's
    /// scans aside), numbered `call` in the run.
    HostCall {
        /// The call's number.
        call: u64,
        /// The host's index (`zone-<host>`).
        host: usize,
        /// Whether a fault was drawn for it, or the host was unreachable when it was sent.
        faulted: bool,
    },
    /// Call `call` ended. Until then it may hold one of the connection's lane slots and its
    /// domain's queue.
    HostCallEnd {
        /// The call's number.
        call: u64,
        /// How.
        how: CallEnd,
    },
    /// A provider process starts: it is about to load the durable state.
    Starting,
    /// The provider process started and serves: its records right after the start.
    Started(Vec<Arc<Machine>>),
    /// The supervisor killed the provider process.
    Killed,
    /// An answer left the provider (also one whose caller is gone or whose reply the
    /// network will drop): the call and what it answered.
    Answered(Rpc, Reply),
    /// A shard is about to send a fenced call for (shard, machine) with this token.
    Sent {
        /// (shard, machine).
        scope: (String, String),
        /// The token's (epoch, sequence).
        token: FenceMark,
    },
    /// The shard learned how the fenced call of event `sent` (a [`Event::Sent`]) went.
    Mutated {
        /// The number of its `Sent` event.
        sent: u64,
        /// What it asked for.
        kind: Kind,
        /// The provider's answer, if one arrived (`None`: refused or indefinite).
        reply: Option<Reply>,
        /// The cluster and metadata a Configure sent.
        binding: Option<(String, StringMap)>,
    },
    /// A client received this machine from a Get.
    Got(pb::Machine),
    /// A client is about to send a List.
    Listing,
    /// The client of the List of event `sent` (a [`Event::Listing`]) learned how it went.
    Listed {
        /// The number of its `Listing` event.
        sent: u64,
        /// The provider's answer, if a List arrived (`None`: an error, refused or
        /// indefinite).
        list: Option<pb::MachineList>,
        /// The `since_revision` it carried, if any.
        cursor: Option<i64>,
    },
    /// The provider opened a span of interest (`crate::spans`).
    Span(SpanSeen),
}

/// How a host call ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CallEnd {
    /// The host answered it (an error included), or refused it.
    Answered,
    /// The host finished it without answering (a hang).
    Unanswered,
    /// Its caller dropped it before it reached the host.
    Dropped,
}

/// One span of interest as it was opened.
#[derive(Clone, Debug)]
pub struct SpanSeen {
    /// `transition`, `compensation` or `hypervisor`.
    pub name: &'static str,
    /// Its `op` field (hypervisor spans) and `machine_id`, when it has them.
    pub fields: Fields,
    /// The transition it is or runs under (its nearest `transition` ancestor, itself
    /// included), with that transition's nearest `rpc` ancestor.
    pub transition: Option<(Fields, Option<Fields>)>,
    /// Whether it runs under the simulator's `provider_start` span (`spans::START_SPAN`).
    pub at_start: bool,
}

/// The fields of a span the checker compares.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Fields {
    /// `machine_id`.
    pub machine_id: Option<String>,
    /// `kind` (a transition), `method` (an rpc) or `op` (a hypervisor call).
    pub what: Option<String>,
}

/// An event, its number in the run and when it happened (simulated time since the start).
#[derive(Clone, Debug)]
pub struct Entry {
    /// Its number: events are numbered 1, 2, … in the order they happened.
    pub number: u64,
    /// When.
    pub at: Duration,
    /// What.
    pub event: Event,
}

/// The events not yet read by the checkers, oldest first.
#[derive(Debug, Default)]
pub struct History {
    unread: Vec<Entry>,
    recorded: u64,
}

impl History {
    /// Appends what happened at `at`; returns its number.
    pub fn push(&mut self, at: Duration, event: Event) -> u64 {
        self.recorded += 1;
        self.unread.push(Entry {
            number: self.recorded,
            at,
            event,
        });
        self.recorded
    }

    /// Every event not yet read, oldest first; they count as read from now on.
    pub fn take_unread(&mut self) -> Vec<Entry> {
        std::mem::take(&mut self.unread)
    }
}
