//! The per-host budget and its lanes: which libvirt call may start on a host, and when.
//!
//! libvirtd serves at most `max_client_requests` calls of one client connection at a time
//! (5 by default); a client that keeps more in flight has the surplus queued in the
//! daemon, unseen by us, and a saturated connection stops having its keepalives read. So
//! every call this process makes to a host passes through one [`Lanes`] first, which keeps
//! at most the host budget (`--host-budget`, default [`DEFAULT_HOST_BUDGET`]) in flight and
//! decides who goes next. The liveness probe takes its slot too ([`Lanes::try_acquire`]: a
//! probe that finds none waits for a call to be answered instead); only the golden-image
//! check at dial time, before any call can reach the connection, runs outside the lanes.
//!
//! Every call names its [`Lane`]: `teardown` (Delete, Drain, orphan collection), `create`
//! (Create, Configure's power-on and retag), `read` (describe's scan, the drift watch) and
//! `agent` (guest-agent commands and polls). The fairness rule, with budget `B`:
//!
//! 1. **The budget.** At most `B` calls are in flight on the host, whatever their lanes.
//! 2. **Reservations.** When `B ≥ 2` one slot is reserved for `teardown`; when `B ≥ 3` one
//!    more for `read`; when `B ≥ 7` a second for `teardown`. A reservation is kept against
//!    every other lane: for any set of reserved lanes, the lanes outside it together hold
//!    at most `B` minus their reservations. With `B = 7` (the default), creates and agent
//!    calls share 4 slots, reads can use 5, deletes 6, and two Deletes and a describe
//!    always find slots that no Create holds.
//! 3. **The agent share.** `agent` holds at most `--agent-budget` (default 1) slots, so
//!    guests slow to answer their agent occupy no more than that.
//! 4. **Order.** When a slot frees, the first call that fits goes, in this order:
//!    `teardown` first (a Delete never waits behind queued Creates), but after
//!    [`TEARDOWN_BURST`] teardown grants in a row while another lane had a call that fit,
//!    that lane goes; the other lanes take turns round-robin (`read`, `agent`, `create`),
//!    first come first served within a lane. Every lane with a waiting call therefore goes
//!    within a bounded number of grants: none starves.
//!
//! The scheduler is event-driven (a call arriving, a call ending) and reads no clock, so
//! tests drive it deterministically. A call's permit is released when the blocking call
//! really ends, never when the future that waited for it is dropped.
//!
//! It lives in the ports crate so that the libvirt adapter and the simulator run the same
//! scheduler: the adapter wraps each blocking libvirt call in it, the simulator each call
//! to a simulated host (sim/README.md). What it shows (depths, calls in flight, waits) goes
//! to a [`LaneObserver`]; the adapter's implementation exports it as metrics.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};

use futures::channel::oneshot;

/// The default per-host budget: seven calls in flight per host, the liveness probe among
/// them, so that with two slots reserved for teardown (two Deletes start at once however
/// many Creates wait) and one for reads, four Creates run at once, as many as the bare
/// sequence the benchmark compares with. The adapter spreads them over four connections
/// (`spread.rs`), two calls on each at most (with a volume upload's data packet beside
/// each, four requests), below libvirtd's default `max_client_requests` of 5, at which
/// libvirtd stops reading a connection; seven is far below its default `max_workers` of 20.
pub const DEFAULT_HOST_BUDGET: usize = 7;

/// The default agent share: one slot per host for guest-agent calls.
pub const DEFAULT_AGENT_BUDGET: usize = 1;

/// libvirtd's default `max_client_requests` (libvirtd.conf / virtqemud.conf).
pub const LIBVIRTD_DEFAULT_MAX_CLIENT_REQUESTS: usize = 5;

/// Teardown grants in a row, while another lane has a call that fits, before that lane
/// gets a turn.
pub const TEARDOWN_BURST: usize = 4;

/// What a libvirt call is for, which decides when it may start.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Lane {
    /// Delete, Drain and orphan collection.
    Teardown,
    /// Create and Configure's libvirt calls.
    Create,
    /// Describe's scan and the drift watch.
    Read,
    /// Guest-agent commands and polls.
    Agent,
}

impl Lane {
    /// Every lane, in index order.
    pub const ALL: [Lane; 4] = [Lane::Teardown, Lane::Create, Lane::Read, Lane::Agent];

    /// The metric label value.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Lane::Teardown => "teardown",
            Lane::Create => "create",
            Lane::Read => "read",
            Lane::Agent => "agent",
        }
    }

    /// The lane's position in [`Lane::ALL`].
    #[must_use]
    pub fn index(self) -> usize {
        match self {
            Lane::Teardown => 0,
            Lane::Create => 1,
            Lane::Read => 2,
            Lane::Agent => 3,
        }
    }
}

/// The turn order of the lanes other than `teardown`.
const ROUND: [Lane; 3] = [Lane::Read, Lane::Agent, Lane::Create];

/// A host's budget (`--host-budget`) and agent share (`--agent-budget`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Budget {
    /// Calls in flight on one host, all lanes together.
    pub host: usize,
    /// Of those, guest-agent calls.
    pub agent: usize,
}

impl Default for Budget {
    fn default() -> Self {
        Self {
            host: DEFAULT_HOST_BUDGET,
            agent: DEFAULT_AGENT_BUDGET,
        }
    }
}

impl Budget {
    /// Checks `1 ≤ agent ≤ host`.
    ///
    /// # Errors
    /// The flag to fix and why.
    pub fn new(host: usize, agent: usize) -> Result<Self, String> {
        if host == 0 {
            return Err(format!(
                "--host-budget must be at least 1 (the default is {DEFAULT_HOST_BUDGET}: \
                 4 Creates at once per host beside 2 Deletes and a read, spread over \
                 --host-connections so that no connection reaches libvirtd's \
                 max_client_requests)"
            ));
        }
        if agent == 0 || agent > host {
            return Err(format!(
                "--agent-budget must be between 1 and --host-budget ({host}), got {agent} \
                 (the default is {DEFAULT_AGENT_BUDGET})"
            ));
        }
        Ok(Self { host, agent })
    }

    /// The slots reserved for `lane`.
    fn reserved(self, lane: Lane) -> usize {
        match lane {
            Lane::Teardown => usize::from(self.host >= 2) + usize::from(self.host >= 7),
            Lane::Read => usize::from(self.host >= 3),
            Lane::Create | Lane::Agent => 0,
        }
    }

    /// Whether one more call of `lane` fits next to `in_flight` (rules 1–3).
    fn fits(self, lane: Lane, in_flight: &[usize; 4]) -> bool {
        // The injected bug (sim/README.md): one call more than the budget is admitted.
        let host = self.host + usize::from(cfg!(feature = "bug-lanes-over-budget"));
        if lane == Lane::Agent && in_flight[Lane::Agent.index()] >= self.agent {
            return false;
        }
        // Every set of reserved lanes that `lane` is not in: ∅, {teardown}, {read}, both.
        let reserved = [Lane::Teardown, Lane::Read];
        (0..4u8).all(|set| {
            let members: Vec<Lane> = reserved
                .iter()
                .enumerate()
                .filter(|(bit, _)| set & (1 << bit) != 0)
                .map(|(_, l)| *l)
                .collect();
            if members.contains(&lane) {
                return true;
            }
            let kept: usize = members.iter().map(|l| self.reserved(*l)).sum();
            let outside: usize = Lane::ALL
                .iter()
                .filter(|l| !members.contains(l))
                .map(|l| in_flight[l.index()])
                .sum();
            outside < host.saturating_sub(kept)
        })
    }
}

struct Waiter {
    id: u64,
    grant: oneshot::Sender<Permit>,
}

#[derive(Default)]
struct State {
    in_flight: [usize; 4],
    queues: [VecDeque<Waiter>; 4],
    /// Where the round-robin over [`ROUND`] resumes.
    turn: usize,
    /// Teardown grants in a row while another lane had a call that fit.
    teardown_run: usize,
    next_id: u64,
}

impl State {
    fn ready(&self, budget: Budget, lane: Lane) -> bool {
        !self.queues[lane.index()].is_empty() && budget.fits(lane, &self.in_flight)
    }

    /// The lane whose first waiter goes next (rule 4), if any fits.
    fn pick(&mut self, budget: Budget) -> Option<Lane> {
        let others = (0..ROUND.len())
            .map(|step| (self.turn + step) % ROUND.len())
            .find(|&at| self.ready(budget, ROUND[at]));
        let teardown = self.ready(budget, Lane::Teardown);
        match others {
            Some(_) if teardown && self.teardown_run < TEARDOWN_BURST => {
                self.teardown_run += 1;
                Some(Lane::Teardown)
            }
            Some(at) => {
                self.turn = (at + 1) % ROUND.len();
                self.teardown_run = 0;
                Some(ROUND[at])
            }
            None if teardown => Some(Lane::Teardown),
            None => None,
        }
    }
}

/// What the lanes show as they work: the adapter exports it as metrics; the simulator
/// needs none of it ([`NoObserver`]).
pub trait LaneObserver: Send + Sync {
    /// The host's budget, once when its lanes are built.
    fn budget(&self, zone: &str, budget: usize);

    /// A lane's waiting calls and calls in flight, after every change.
    fn lane(&self, zone: &str, lane: Lane, depth: usize, in_flight: usize);

    /// A call of `lane` starts waiting for a slot; the returned closure is called once,
    /// when the slot is granted (a wait that is dropped never calls it). The observer
    /// measures the wait with a clock of its own: the scheduler reads none.
    fn wait(&self, zone: &str, lane: Lane) -> Box<dyn FnOnce() + Send>;
}

/// An observer that records nothing.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoObserver;

impl LaneObserver for NoObserver {
    fn budget(&self, _: &str, _: usize) {}

    fn lane(&self, _: &str, _: Lane, _: usize, _: usize) {}

    fn wait(&self, _: &str, _: Lane) -> Box<dyn FnOnce() + Send> {
        Box::new(|| ())
    }
}

/// One host's lanes.
pub struct Lanes {
    zone: String,
    budget: Budget,
    state: Mutex<State>,
    observer: Arc<dyn LaneObserver>,
}

impl std::fmt::Debug for Lanes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lanes")
            .field("zone", &self.zone)
            .field("budget", &self.budget)
            .finish_non_exhaustive()
    }
}

/// One call's slot on its host; dropping it frees the slot. Hold it until the call really
/// ends (the adapter moves it into the blocking call; the simulator into the host's task).
#[must_use = "dropping the permit frees the slot at once"]
pub struct Permit {
    lanes: Option<Arc<Lanes>>,
    lane: Lane,
}

impl std::fmt::Debug for Permit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Permit").field("lane", &self.lane).finish()
    }
}

impl Permit {
    /// The lane this slot belongs to.
    #[must_use]
    pub fn lane(&self) -> Lane {
        self.lane
    }

    /// Gives the slot back without touching the lanes (the caller holds their lock).
    fn disarm(&mut self) {
        self.lanes = None;
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        if let Some(lanes) = self.lanes.take() {
            let mut state = lanes.lock();
            state.in_flight[self.lane.index()] -= 1;
            lanes.dispatch(&mut state);
        }
    }
}

/// Takes a waiter out of its queue if its future is dropped before its turn.
struct Queued<'a> {
    lanes: &'a Lanes,
    lane: Lane,
    id: u64,
}

impl Drop for Queued<'_> {
    fn drop(&mut self) {
        let mut state = self.lanes.lock();
        state.queues[self.lane.index()].retain(|w| w.id != self.id);
        self.lanes.publish(&state);
    }
}

impl Lanes {
    /// The lanes of the host of `zone`, with `budget`, showing their work to `observer`.
    #[must_use]
    pub fn new(zone: &str, budget: Budget, observer: Arc<dyn LaneObserver>) -> Arc<Self> {
        // The fields are public: a budget built without `Budget::new` still admits calls.
        let host = budget.host.max(1);
        let budget = Budget {
            host,
            agent: budget.agent.clamp(1, host),
        };
        observer.budget(zone, budget.host);
        let lanes = Self {
            zone: zone.to_owned(),
            budget,
            state: Mutex::new(State::default()),
            observer,
        };
        lanes.publish(&lanes.lock());
        Arc::new(lanes)
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The budget these lanes keep.
    #[must_use]
    pub fn budget(&self) -> Budget {
        self.budget
    }

    /// Calls of each lane in flight now (index order of [`Lane::ALL`]).
    #[must_use]
    pub fn in_flight(&self) -> [usize; 4] {
        self.lock().in_flight
    }

    /// Calls of each lane waiting now.
    #[must_use]
    pub fn queued(&self) -> [usize; 4] {
        let state = self.lock();
        std::array::from_fn(|i| state.queues[i].len())
    }

    /// Waits for a slot of `lane`. Cancel-safe: a dropped wait leaves the queue, and a slot
    /// granted to a wait that is gone is given back.
    pub async fn acquire(self: &Arc<Self>, lane: Lane) -> Permit {
        let waited = self.observer.wait(&self.zone, lane);
        let (grant, granted) = oneshot::channel();
        let id = {
            let mut state = self.lock();
            let id = state.next_id;
            state.next_id += 1;
            state.queues[lane.index()].push_back(Waiter { id, grant });
            self.dispatch(&mut state);
            id
        };
        let queued = Queued {
            lanes: self,
            lane,
            id,
        };
        // The sender lives in the queue until it is granted; only `Queued`'s drop (which
        // is after this await) removes it without a grant.
        let permit = granted
            .await
            .expect("a queued waiter is granted before its sender is dropped");
        drop(queued);
        waited();
        permit
    }

    /// Takes a slot of `lane` at once, or none: only when no call of `lane` waits and one
    /// more fits the budget (rules 1–3). The liveness probe asks this way, so its call is
    /// counted with the others and never goes out beyond the budget.
    #[must_use]
    pub fn try_acquire(self: &Arc<Self>, lane: Lane) -> Option<Permit> {
        let mut state = self.lock();
        if !state.queues[lane.index()].is_empty() || !self.budget.fits(lane, &state.in_flight) {
            return None;
        }
        state.in_flight[lane.index()] += 1;
        self.publish(&state);
        Some(Permit {
            lanes: Some(Arc::clone(self)),
            lane,
        })
    }

    /// Grants slots while the first waiter of some lane fits (rule 4).
    fn dispatch(self: &Arc<Self>, state: &mut State) {
        while let Some(lane) = state.pick(self.budget) {
            let Some(waiter) = state.queues[lane.index()].pop_front() else {
                break;
            };
            state.in_flight[lane.index()] += 1;
            let permit = Permit {
                lanes: Some(Arc::clone(self)),
                lane,
            };
            if let Err(mut unwanted) = waiter.grant.send(permit) {
                unwanted.disarm();
                state.in_flight[lane.index()] -= 1;
            }
        }
        self.publish(state);
    }

    fn publish(&self, state: &State) {
        for lane in Lane::ALL {
            let i = lane.index();
            self.observer
                .lane(&self.zone, lane, state.queues[i].len(), state.in_flight[i]);
        }
    }
}

#[cfg(test)]
#[path = "lanes_tests.rs"]
mod tests;
