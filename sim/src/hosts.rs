//! What the simulated hosts hold, outside any provider process: the domains on each host,
//! the order of the operations queued on each domain, each connection's requests in each
//! host's daemon, and the hosts' decision stream. The world holds it; the hypervisor fake
//! (`fakes::hypervisor`) acts on it.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::Duration;

use bigfleet_libvirt_domain::MachineId;
use bigfleet_libvirt_ports::claims::Claim;
use futures::channel::oneshot;

use crate::rng::SimRng;

/// One domain on a host.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Domain {
    /// The libvirt domain name (derived from provider label and machine id).
    pub name: String,
    /// Whether it was started.
    pub running: bool,
    /// The cluster it was bootstrapped into, if any.
    pub cluster: String,
    /// Whether the host holds the guest's configuration with a join blob in it, as the
    /// libvirt adapter's first-boot machines do (their seed's user-data or Ignition config):
    /// written by Configure, written back without it by Drain, gone with the domain.
    pub blob: bool,
    /// The dedicated CPUs and devices its definition names (`fakes::books`).
    pub held: Claim,
    /// Defined by a Create the host carried out after the process that sent it had died
    /// (`fakes::books` says why its claim is exempt from `claims-held-once`).
    pub late: bool,
}

/// Every host's domains and the hosts' decision stream.
#[derive(Debug)]
pub struct Hosts {
    /// The hosts' decision stream (faults, service times).
    pub rng: SimRng,
    /// Domains per host, by machine id.
    pub domains: Vec<BTreeMap<MachineId, Domain>>,
    /// Volumes per host, by name (`<domain>-overlay`, `<domain>-data<N>`, `<domain>-seed`).
    pub volumes: Vec<BTreeSet<String>>,
    /// When the last queued operation on each domain executes.
    pub busy_until: BTreeMap<MachineId, Duration>,
    /// Per-slot price drift, so reconcile has substrate facts to refresh.
    pub price_drift: BTreeMap<MachineId, u32>,
    /// Each (host, connection)'s requests in the daemon.
    pub load: BTreeMap<(usize, u64), Load>,
    /// Connections opened so far (one per `SimHypervisor`).
    pub connections: u64,
    /// Calls sent so far, all connections together (`Event::HostCall`).
    pub calls: u64,
}

/// One connection's requests on one host: arrived and not finished, and of those the ones
/// executing; the rest wait in `waiting` for a worker (libvirtd's `max_client_requests`).
#[derive(Debug, Default)]
pub struct Load {
    /// Arrived and not finished.
    pub in_flight: usize,
    /// Of those, executing.
    pub executing: usize,
    /// The rest, each waiting for a worker.
    pub waiting: VecDeque<oneshot::Sender<()>>,
}

impl Hosts {
    /// `count` empty hosts.
    #[must_use]
    pub fn new(seed: u64, count: usize) -> Self {
        Self {
            rng: SimRng::stream(seed, "hosts"),
            domains: vec![BTreeMap::new(); count],
            volumes: vec![BTreeSet::new(); count],
            busy_until: BTreeMap::new(),
            price_drift: BTreeMap::new(),
            load: BTreeMap::new(),
            connections: 0,
            calls: 0,
        }
    }
}

/// The volumes a Create of domain `name` makes, in order, with `data_disks` data disks; the
/// last is the seed, the one volume the Create also fills.
#[must_use]
pub fn create_volumes(name: &str, data_disks: usize) -> Vec<String> {
    let mut volumes = vec![format!("{name}-overlay")];
    volumes.extend((1..=data_disks).map(|n| format!("{name}-data{n}")));
    volumes.push(format!("{name}-seed"));
    volumes
}

/// The domain a volume of [`create_volumes`] belongs to.
#[must_use]
pub fn volume_owner(volume: &str) -> &str {
    volume.rsplit_once('-').map_or(volume, |(domain, _)| domain)
}

/// The host index of a zone (`zone-<i>`).
#[must_use]
pub fn zone_index(zone: &str) -> usize {
    zone.strip_prefix("zone-")
        .and_then(|i| i.parse().ok())
        .expect("simulated zones are zone-<index>")
}
