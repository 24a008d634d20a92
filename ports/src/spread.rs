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

use crate::lanes::Budget;

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

/// The calls on each connection of one host (of one generation of its connections).
#[derive(Debug)]
pub struct Spread {
    calls: Mutex<Vec<usize>>,
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
}

impl Drop for Link {
    fn drop(&mut self) {
        self.spread.lock()[self.index] -= 1;
    }
}

impl Spread {
    /// `connections` connections (at least one), none with a call on it.
    #[must_use]
    pub fn new(connections: usize) -> Arc<Self> {
        Arc::new(Self {
            calls: Mutex::new(vec![0; connections.max(1)]),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Vec<usize>> {
        self.calls
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Puts one more call on the connection with the fewest (the first of them on a tie).
    /// A connection reaching `k` calls this way was the least loaded, so every other had at
    /// least `k - 1`: `k` ≤ ⌈calls ÷ connections⌉.
    pub fn lease(self: &Arc<Self>) -> Link {
        let mut calls = self.lock();
        let pick = if cfg!(feature = "bug-spread-busiest") {
            // The injected bug (sim/README.md): the busiest connection takes the call.
            (0..calls.len()).max_by_key(|i| calls[*i])
        } else {
            (0..calls.len()).min_by_key(|i| calls[*i])
        };
        let index = pick.unwrap_or(0);
        calls[index] += 1;
        Link {
            spread: Arc::clone(self),
            index,
        }
    }

    /// The calls on each connection now.
    #[must_use]
    pub fn loads(&self) -> Vec<usize> {
        self.lock().clone()
    }

    /// How many connections there are.
    #[must_use]
    pub fn connections(&self) -> usize {
        self.lock().len()
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
