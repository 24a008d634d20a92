//! The drift watch: a cheap poll per host that notices within seconds when a domain the
//! provider runs is destroyed, shut down, crashed or undefined outside the provider,
//! instead of at the next full reconcile.
//!
//! Why a poll and not libvirt's lifecycle events: events are delivered through a C
//! callback registered over FFI, and the workspace forbids `unsafe`. The poll costs one
//! `list_all_domains` plus one state read per domain of ours, every the host policy's
//! `watch_interval` (2 s), and only on a healthy host with machines on it. On a host with no
//! machines of ours it only asks the local connection object whether it is still alive
//! (no round trip), which also makes a dead daemon show as `unreachable` within one tick
//! rather than at the next liveness probe.
//!
//! What it does with a finding: it **reports** — one warning when a machine's domain goes
//! missing or stops, one info line when it is back in line, and the
//! `bigfleet_libvirt_substrate_drift{zone,kind="vanished"|"stopped"}` gauges — and nothing
//! else. The machine's record keeps its state: the provider never moves a machine behind
//! the shard's back, and reconcile refreshes only substrate facts. The shard learns of the
//! loss from its own health checks (or from a Configure or Drain failing: both power a
//! stopped domain on first, and fail when it is gone); a Delete of a vanished machine
//! succeeds and still removes its volumes. The full describe at each reconcile reports the
//! same kinds and stays the safety net.
//!
//! Machines with a Delete in flight are skipped (their domain going away is expected), and
//! so are machines whose Create has not returned yet (they are not tracked until then).

use std::collections::BTreeSet;
use std::sync::Weak;
use std::time::Duration;

use bigfleet_libvirt_ports::{Clock, HypervisorError};
use tracing::{info, warn};

use crate::drift::timeline::{self, Found};
use crate::drift::tracked::Tracked;
use crate::host::connection::Host;
use crate::host::domains::{is_active, read_tag};
use crate::host::error::{context, nothing_done};
use crate::host::lanes::Lane;
use crate::host::session::Session;
use crate::metrics::{DriftLabels, LibvirtMetrics};
use bigfleet_libvirt_config::naming::domain_name;
use bigfleet_libvirt_domain::catalog::{InstanceCatalog, parse_machine_id};

/// What one poll saw of the domains it asked about.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Seen {
    /// Names present and running (paused and suspended count as running).
    pub(crate) running: BTreeSet<String>,
    /// Names present but shut off or crashed.
    pub(crate) stopped: BTreeSet<String>,
    /// Names listed whose state could not be read (neither reported nor cleared).
    pub(crate) unreadable: BTreeSet<String>,
    /// Names shut off as they should be: a first-boot machine's domain that no Configure
    /// has started (its tag names no cluster).
    pub(crate) resting: BTreeSet<String>,
}

/// Fails when the connection is closed (so the host is marked lost), else reads the state
/// of every listed domain named in `names`; a stopped one among `first_boot` (first-boot
/// machines) whose tag names no cluster is resting, not stopped.
fn poll(
    session: &Session,
    names: &BTreeSet<String>,
    first_boot: &BTreeSet<String>,
) -> Result<Seen, HypervisorError> {
    if !session.conn.is_alive().unwrap_or(false) {
        return Err(nothing_done("the libvirt connection is closed"));
    }
    let mut seen = Seen::default();
    if names.is_empty() {
        return Ok(seen);
    }
    let listed = session
        .conn
        .list_all_domains(0)
        .map_err(|e| context("list domains", &e))?;
    for domain in listed {
        let Ok(name) = domain.name() else { continue };
        if !names.contains(&name) {
            continue;
        }
        match domain.info() {
            Ok(details) if details.state.known().is_some_and(is_active) => {
                seen.running.insert(name);
            }
            Ok(_) if first_boot.contains(&name) && unbound(&domain) => {
                seen.resting.insert(name);
            }
            Ok(_) => {
                seen.stopped.insert(name);
            }
            Err(_) => {
                seen.unreadable.insert(name);
            }
        }
    }
    Ok(seen)
}

/// Whether `domain`'s ownership tag names no cluster: no Configure has bound it (or a Drain
/// unbound it).
fn unbound(domain: &virt::domain::Domain) -> bool {
    read_tag(domain).is_some_and(|tag| tag.cluster_id.is_empty())
}

/// Which of `ids` (machine ids) are missing or stopped according to `seen`.
pub(crate) fn classify(provider: &str, ids: &BTreeSet<String>, seen: &Seen) -> Found {
    let mut found = Found::default();
    for id in ids {
        let name = domain_name(provider, id);
        if seen.running.contains(&name)
            || seen.unreadable.contains(&name)
            || seen.resting.contains(&name)
        {
            continue;
        }
        if seen.stopped.contains(&name) {
            found.stopped.insert(id.clone());
        } else {
            found.vanished.insert(id.clone());
        }
    }
    found
}

/// Sets the zone's `vanished` and `stopped` drift gauges to what `found` holds.
fn publish_drift(metrics: &LibvirtMetrics, zone: &str, found: &Found) {
    for (kind, count) in [
        ("vanished", found.vanished.len()),
        ("stopped", found.stopped.len()),
    ] {
        let labels = DriftLabels {
            zone: zone.to_owned(),
            kind: kind.to_owned(),
        };
        let count = i64::try_from(count).unwrap_or(i64::MAX);
        metrics.drift.get_or_create(&labels).set(count);
    }
}

/// Logs what changed since the last poll.
fn log_changes(zone: &str, before: &Found, now: &Found) {
    for id in now.vanished.difference(&before.vanished) {
        warn!(
            zone, machine_id = %id,
            "managed domain vanished outside the provider (undefined by someone else); \
             the machine keeps its state, a Delete still cleans up its volumes"
        );
    }
    for id in now.stopped.difference(&before.stopped) {
        warn!(
            zone, machine_id = %id,
            "managed domain stopped outside the provider (destroyed, shut down or \
             crashed); the machine keeps its state, Configure and Drain power it on again"
        );
    }
    let was: BTreeSet<&String> = before.vanished.union(&before.stopped).collect();
    let is: BTreeSet<&String> = now.vanished.union(&now.stopped).collect();
    for id in was.difference(&is) {
        info!(zone, machine_id = %id, "managed domain is back in line (running, or no longer tracked)");
    }
}

/// What the drift watch of one zone reaches: that zone's host, the machines the adapter
/// tracks, and where findings go. It holds the adapter's parts weakly, so it ends once the
/// adapter is dropped.
pub(crate) struct Watched {
    /// The zone watched.
    pub(crate) zone: String,
    /// The provider label (domain names).
    pub(crate) provider: String,
    /// How often to poll.
    pub(crate) interval: Duration,
    /// The zone's host.
    pub(crate) host: Weak<Host>,
    /// The machines the adapter tracks, and those with a Delete in flight.
    pub(crate) tracked: Weak<Tracked>,
    /// The drift gauges and the machines' timeline.
    pub(crate) metrics: LibvirtMetrics,
    /// The instance types: whose machines configure at first boot (their domains rest shut
    /// off until Configure starts them).
    pub(crate) catalog: InstanceCatalog,
}

/// Polls one zone's host every `interval` until the adapter is dropped.
pub(crate) async fn run<C: Clock>(watch: Watched, clock: C) {
    let Watched {
        zone,
        provider,
        interval,
        host,
        tracked,
        metrics,
        catalog,
    } = watch;
    let mut reported = Found::default();
    loop {
        if tracked.strong_count() == 0 {
            return;
        }
        clock
            .sleep_until(clock.now().saturating_add(interval))
            .await;
        let (Some(host), Some(ids)) = (host.upgrade(), tracked.upgrade().map(|t| t.watched(&zone)))
        else {
            return;
        };
        if host.session().is_err() {
            continue;
        }
        let names: BTreeSet<String> = ids.iter().map(|id| domain_name(&provider, id)).collect();
        let first_boot: BTreeSet<String> = (ids.iter())
            .filter(|id| {
                parse_machine_id(id).is_some_and(|p| catalog.boots_first(&p.instance_type))
            })
            .map(|id| domain_name(&provider, id))
            .collect();
        let polled = host.call(Lane::Read, move |s| poll(s, &names, &first_boot));
        let Ok(seen) = polled.await else {
            // The call marked a dead connection lost; anything else is retried next tick.
            continue;
        };
        drop(host);
        let Some(still) = tracked.upgrade().map(|t| t.watched(&zone)) else {
            return;
        };
        // Only what is still tracked and idle now: a Delete that began during the poll,
        // or a machine that was deleted meanwhile, is not drift.
        let ids: BTreeSet<String> = ids.intersection(&still).cloned().collect();
        let found = classify(&provider, &ids, &seen);
        if found != reported {
            log_changes(&zone, &reported, &found);
            timeline::record(&metrics.timeline, &reported, &found);
            reported = found;
        }
        publish_drift(&metrics, &zone, &reported);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(list: &[&str]) -> BTreeSet<String> {
        list.iter().map(|s| domain_name("p", s)).collect()
    }

    #[test]
    fn running_stopped_missing_and_unreadable_are_told_apart() {
        let ids: BTreeSet<String> = ["a", "b", "c", "d", "e"]
            .iter()
            .map(|s| (*s).to_owned())
            .collect();
        let seen = Seen {
            running: names(&["a"]),
            stopped: names(&["b"]),
            unreadable: names(&["d"]),
            resting: names(&["e"]),
        };
        let found = classify("p", &ids, &seen);
        assert_eq!(found.stopped, BTreeSet::from(["b".to_owned()]));
        assert_eq!(found.vanished, BTreeSet::from(["c".to_owned()]));
    }
}
