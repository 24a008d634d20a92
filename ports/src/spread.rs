//! How a host's calls are spread over its connections. libvirtd limits the requests it
//! serves of one client connection at once (`max_client_requests`, 5 by default) and stops
//! reading a connection that reaches the limit; the lanes (`lanes.rs`) bound the calls in
//! flight per host, and this spreads them: each call leases the connection with the fewest
//! calls on it, so no connection ever carries more than ⌈calls in flight ÷ connections⌉.
//! The libvirt adapter leases one for every call it makes on a host
//! (`infra/libvirt/src/host/connection.rs`); the simulator runs the same rule in front of
//! its simulated daemons, whose `host-budget` invariant checks every connection against its
//! host's limit.

use std::sync::{Arc, Mutex, MutexGuard};

use crate::lanes::{Budget, LIBVIRTD_DEFAULT_MAX_CLIENT_REQUESTS};

/// Calls one connection carries at most when the operator leaves the number of
/// connections to the provider (`--host-connections` unset).
pub const CALLS_PER_CONNECTION: usize = 2;

/// The requests one call may have in flight on its connection: the call itself, and the
/// data packet of a volume upload (a seed image), which libvirtd counts as a request until
/// it has written it. So [`CALLS_PER_CONNECTION`] calls are four requests, below
/// libvirtd's default `max_client_requests` of 5.
pub const REQUESTS_PER_CALL: usize = 2;

/// The connections each host gets: `requested` (`--host-connections`), or when unset
/// enough that none carries more than [`CALLS_PER_CONNECTION`] of the `budget`'s calls.
///
/// # Errors
///
/// When `requested` is 0 or more than the budget (a connection no call could use).
pub fn host_connections(budget: Budget, requested: Option<usize>) -> Result<usize, String> {
    let auto = budget.host.div_ceil(CALLS_PER_CONNECTION);
    match requested {
        None => Ok(auto),
        Some(0) => Err(format!(
            "--host-connections must be at least 1; leave it unset to let the provider \
             size it ({auto} for --host-budget {}: at most {CALLS_PER_CONNECTION} calls per \
             connection)",
            budget.host
        )),
        Some(n) if n > budget.host => Err(format!(
            "--host-connections {n} is more than --host-budget {}: at most that many calls \
             are in flight, so the other connections would stay idle; use {} or fewer",
            budget.host, budget.host
        )),
        Some(n) => Ok(n),
    }
}

/// The fewest `max_client_requests` a host may have: one call with a volume upload's data
/// packet beside it is [`REQUESTS_PER_CALL`] requests, and libvirtd throttles a connection
/// whose requests reach its limit.
pub const LEAST_MAX_CLIENT_REQUESTS: usize = REQUESTS_PER_CALL + 1;

/// The connections each host gets when its libvirtd serves at most `max_client_requests`
/// requests of one connection at once (`--host-max-client-requests`, which the operator
/// states: libvirt has no API that reads it, not even its admin API). Unset `requested`:
/// enough that no connection carries more than [`CALLS_PER_CONNECTION`] calls, nor more
/// calls than keep their requests below the limit. Set: checked as [`host_connections`]
/// does, and refused when its busiest connection would reach the limit.
///
/// # Errors
///
/// A limit below [`LEAST_MAX_CLIENT_REQUESTS`] (no spread fits it), or a `requested` count
/// that [`host_connections`] refuses or that puts the limit's worth of requests on one
/// connection; each message names the fix.
pub fn fit_connections(
    budget: Budget,
    requested: Option<usize>,
    max_client_requests: usize,
) -> Result<usize, String> {
    if max_client_requests < LEAST_MAX_CLIENT_REQUESTS {
        return Err(format!(
            "--host-max-client-requests {max_client_requests} is below \
             {LEAST_MAX_CLIENT_REQUESTS}: one call with a volume upload's data packet beside it \
             is {REQUESTS_PER_CALL} requests on its connection, and libvirtd stops reading a \
             connection whose requests reach max_client_requests (\"Client hit max requests \
             limit\"); raise max_client_requests in the hosts' libvirtd.conf (virtqemud.conf \
             for the modular daemons) to {LEAST_MAX_CLIENT_REQUESTS} or more, restart the \
             daemons, and pass the new value (the default is \
             {LIBVIRTD_DEFAULT_MAX_CLIENT_REQUESTS}, libvirtd's own)"
        ));
    }
    // The most calls one connection may carry with their requests below the limit.
    let fits = (max_client_requests - 1) / REQUESTS_PER_CALL;
    let Some(count) = requested else {
        return Ok(budget.host.div_ceil(fits.min(CALLS_PER_CONNECTION)));
    };
    let count = host_connections(budget, Some(count))?;
    let share = budget.host.div_ceil(count);
    if share > fits {
        return Err(format!(
            "--host-connections {count} puts up to {share} of --host-budget {}'s calls on one \
             connection, {} requests with uploads, not below --host-max-client-requests \
             {max_client_requests}: libvirtd would stop reading that connection (\"Client hit \
             max requests limit\"); use --host-connections {} or more, or leave it unset, or \
             lower --host-budget to {}",
            budget.host,
            share * REQUESTS_PER_CALL,
            budget.host.div_ceil(fits),
            count * fits
        ));
    }
    Ok(count)
}

/// The calls on each connection of one host (of one generation of its connections), and
/// which of them answered a call since the liveness probe last looked.
#[derive(Debug)]
pub struct Spread {
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    /// Calls in flight, per connection.
    calls: Vec<usize>,
    /// Calls answered, per connection.
    answered: Vec<u64>,
    /// `answered` as the last probe saw it.
    seen: Vec<u64>,
    /// Where the next probe starts looking, so an idle host's probes visit every
    /// connection in turn.
    cursor: usize,
}

/// One call's hold on a connection; dropping it takes the call off that connection.
#[derive(Debug)]
#[must_use = "dropping the link takes the call off its connection at once"]
pub struct Link {
    spread: Arc<Spread>,
    index: usize,
}

impl Link {
    /// Which connection (0-based, in the order they were dialled).
    #[must_use]
    pub fn index(&self) -> usize {
        self.index
    }

    /// Records that the host answered this call: proof that this connection is alive,
    /// so the liveness probe need not ask it ([`Spread::probe`]).
    pub fn answered(&self) {
        self.spread.lock().answered[self.index] += 1;
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        self.spread.lock().calls[self.index] -= 1;
    }
}

/// What the liveness probe should do about one host's connections ([`Spread::probe`]).
#[derive(Debug)]
pub enum Probe {
    /// Every connection answered a call since the last probe: nothing to ask.
    Answered,
    /// Ask this connection (it answered nothing since the last probe, and carries fewer
    /// calls than its share, so the probe's call keeps it within the share).
    Ask(Link),
    /// The connections that answered nothing are all at their share: the probe may not
    /// add a call to any of them now.
    Full,
}

impl Spread {
    /// `connections` connections (at least one), none with a call on it.
    #[must_use]
    pub fn new(connections: usize) -> Arc<Self> {
        let n = connections.max(1);
        Arc::new(Self {
            state: Mutex::new(State {
                calls: vec![0; n],
                answered: vec![0; n],
                seen: vec![0; n],
                cursor: 0,
            }),
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Puts one more call on the connection with the fewest (the first of them on a tie).
    /// A connection reaching `k` calls this way was the least loaded, so every other had at
    /// least `k - 1`: `k` ≤ ⌈calls ÷ connections⌉.
    pub fn lease(self: &Arc<Self>) -> Link {
        let mut state = self.lock();
        let calls = &state.calls;
        let pick = if cfg!(feature = "bug-spread-busiest") {
            // The injected bug (sim/README.md): the busiest connection takes the call.
            (0..calls.len()).max_by_key(|i| calls[*i])
        } else {
            (0..calls.len()).min_by_key(|i| calls[*i])
        };
        let index = pick.unwrap_or(0);
        state.calls[index] += 1;
        Link {
            spread: Arc::clone(self),
            index,
        }
    }

    /// The liveness probe's choice, once per probe: the connections that answered no call
    /// since the last probe are the ones to ask; of those, the first from a cursor that
    /// moves on at every probe, among those with fewer than `share` calls. Leasing one with
    /// fewer than `share` keeps every connection within `share`; and a later
    /// [`Spread::lease`] keeps its bound, since that proof holds whatever the loads before.
    pub fn probe(self: &Arc<Self>, share: usize) -> Probe {
        let mut state = self.lock();
        let n = state.calls.len();
        let silent: Vec<usize> = (0..n)
            .map(|k| (state.cursor + k) % n)
            .filter(|&i| state.answered[i] == state.seen[i])
            .collect();
        state.seen = state.answered.clone();
        state.cursor = (state.cursor + 1) % n;
        if silent.is_empty() {
            return Probe::Answered;
        }
        let Some(&index) = silent.iter().find(|&&i| state.calls[i] < share) else {
            return Probe::Full;
        };
        state.calls[index] += 1;
        Probe::Ask(Link {
            spread: Arc::clone(self),
            index,
        })
    }

    /// The calls on each connection now.
    #[must_use]
    pub fn loads(&self) -> Vec<usize> {
        self.lock().calls.clone()
    }

    /// How many connections there are.
    #[must_use]
    pub fn connections(&self) -> usize {
        self.lock().calls.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calls_go_to_the_least_loaded_connection() {
        let spread = Spread::new(3);
        let links: Vec<Link> = (0..6).map(|_| spread.lease()).collect();
        assert_eq!(spread.loads(), [2, 2, 2]);
        let indexes: Vec<usize> = links.iter().map(Link::index).collect();
        assert_eq!(indexes, [0, 1, 2, 0, 1, 2]);
        // Free two calls on connection 1: the next two go there.
        let mut links = links;
        links.retain(|l| l.index() != 1);
        assert_eq!(spread.loads(), [2, 0, 2]);
        let more = [spread.lease(), spread.lease()];
        assert_eq!(more.map(|l| l.index()), [1, 1]);
        drop(links);
        assert_eq!(spread.loads(), [0, 0, 0]);
    }

    #[test]
    fn no_connection_carries_more_than_its_share_through_any_order_of_releases() {
        // Every order of leases and releases of up to `budget` calls keeps each connection
        // at or below ⌈budget ÷ connections⌉ (a deterministic walk over many orders).
        for connections in 1..=4 {
            for budget in connections..=8 {
                let spread = Spread::new(connections);
                let mut held: Vec<Link> = Vec::new();
                let mut state = 0x9e37_79b9_u32 ^ u32::try_from(budget * 31 + connections).unwrap();
                for _ in 0..2_000 {
                    state ^= state << 13;
                    state ^= state >> 17;
                    state ^= state << 5;
                    if held.len() < budget && (held.is_empty() || state % 3 != 0) {
                        held.push(spread.lease());
                    } else {
                        let at = usize::try_from(state).unwrap() % held.len();
                        drop(held.swap_remove(at));
                    }
                    let worst = spread.loads().into_iter().max().unwrap();
                    assert!(
                        worst <= budget.div_ceil(connections),
                        "{worst} calls on one of {connections} connections, budget {budget}"
                    );
                }
            }
        }
    }

    #[test]
    fn an_idle_hosts_probes_visit_every_connection_in_turn() {
        let spread = Spread::new(3);
        let mut asked = Vec::new();
        for _ in 0..6 {
            match spread.probe(2) {
                Probe::Ask(link) => asked.push(link.index()),
                other => panic!("an idle host is probed, got {other:?}"),
            }
        }
        assert_eq!(asked, [0, 1, 2, 0, 1, 2]);
        assert_eq!(
            spread.loads(),
            [0, 0, 0],
            "the probe's call is off when dropped"
        );
    }

    #[test]
    fn a_connection_that_answered_is_not_probed_and_a_silent_one_is() {
        let spread = Spread::new(3);
        // Connections 0 and 2 answer calls; 1 carries a call that never answers.
        let answering = [spread.lease(), spread.lease(), spread.lease()];
        answering[0].answered();
        answering[2].answered();
        match spread.probe(2) {
            Probe::Ask(link) => assert_eq!(link.index(), 1),
            other => panic!("the silent connection is asked, got {other:?}"),
        }
        // Every connection answered since: nothing to ask.
        for link in &answering {
            link.answered();
        }
        assert!(matches!(spread.probe(2), Probe::Answered));
        // A silent connection at its share is not given one call more.
        let full = Spread::new(2);
        let held = [full.lease(), full.lease(), full.lease(), full.lease()];
        held[1].answered();
        assert!(matches!(full.probe(2), Probe::Full));
        assert_eq!(full.loads(), [2, 2]);
        drop(held);
    }

    #[test]
    fn connections_fit_the_stated_max_client_requests() {
        let budget = |host| Budget::new(host, 1).unwrap();
        // libvirtd's default 5: two calls (four requests) per connection, as before.
        assert_eq!(fit_connections(budget(7), None, 5), Ok(4));
        assert_eq!(fit_connections(budget(4), None, 5), Ok(2));
        // 3 or 4: one call per connection.
        assert_eq!(fit_connections(budget(7), None, 3), Ok(7));
        assert_eq!(fit_connections(budget(7), None, 4), Ok(7));
        // A higher limit keeps two calls per connection (connections are cheap).
        assert_eq!(fit_connections(budget(8), None, 20), Ok(4));
        // Below 3 nothing fits: the message names the setting and the value to raise it to.
        let two = fit_connections(budget(7), None, 2).unwrap_err();
        assert!(
            two.contains("--host-max-client-requests 2 is below 3"),
            "{two}"
        );
        assert!(
            two.contains("max_client_requests in the hosts' libvirtd.conf"),
            "{two}"
        );
        // A stated count whose busiest connection reaches the limit is refused, with the fix.
        let tight = fit_connections(budget(8), Some(3), 5).unwrap_err();
        assert!(
            tight.contains("up to 3 of --host-budget 8's calls"),
            "{tight}"
        );
        assert!(tight.contains("6 requests"), "{tight}");
        assert!(
            tight.contains("use --host-connections 4 or more"),
            "{tight}"
        );
        assert!(tight.contains("lower --host-budget to 6"), "{tight}");
        assert_eq!(fit_connections(budget(8), Some(4), 5), Ok(4));
        assert_eq!(fit_connections(budget(7), Some(7), 3), Ok(7));
        assert!(fit_connections(budget(7), Some(6), 3).is_err());
        // host_connections' own checks still apply.
        assert!(fit_connections(budget(3), Some(4), 5).is_err());
    }

    #[test]
    fn the_number_of_connections_is_checked_and_defaults_to_two_calls_each() {
        let budget = |host| Budget::new(host, 1).unwrap();
        assert_eq!(host_connections(budget(4), None), Ok(2));
        assert_eq!(host_connections(budget(5), None), Ok(3));
        assert_eq!(host_connections(budget(1), None), Ok(1));
        assert_eq!(host_connections(budget(4), Some(4)), Ok(4));
        let zero = host_connections(budget(4), Some(0)).unwrap_err();
        assert!(zero.contains("at least 1; leave it unset"), "{zero}");
        let many = host_connections(budget(3), Some(4)).unwrap_err();
        assert!(many.contains("more than --host-budget 3"), "{many}");
    }
}
