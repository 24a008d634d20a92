//! Describe (docs/design.md §4.4, docs/libvirt.md §5.10): what each reachable host really runs,
//! turned into the inventory the provider seeds from and reconciles against, plus what is out of
//! line.
//!
//! A scan reads every domain on a host (name, power state, shape, ownership tag) and the
//! volume names in the pool; everything after that is pure and unit-tested without
//! libvirt. The mapping follows the reference for slots (a running tagged domain makes its
//! slot Idle; a stopped one leaves it Speculative for the next Create to adopt and power
//! on) with three differences: only domains tagged with this provider label count; a slot
//! whose host is unreachable, whose name is taken by a foreign domain, or that no longer
//! fits the host's capacity is withheld rather than offered; and tagged domains that no
//! slot or record explains are reported as orphans (collected by `orphans`) instead of
//! being surfaced as Idle machines.

use std::collections::{BTreeMap, BTreeSet};

use bigfleet_libvirt_domain::{Machine, MachineState};
use bigfleet_libvirt_ports::{DomainRef, HypervisorError};
use tracing::warn;

use crate::drift::orphans::Orphan;
use crate::host::capacity::{Node, PoolRoom, Shape};
use crate::host::claims::{Ask, Claim, Room, needs};
use crate::host::domains::{is_active, read_tag};
use crate::host::error::context;
use crate::host::session::Session;
use crate::host::topology;
use crate::options::CpuSet;
use crate::render::ownership::Tag;
use crate::render::placement::{Held, Topology};
use crate::storage::volumes;
use bigfleet_libvirt_config::naming::domain_name;
use bigfleet_libvirt_domain::catalog::InstanceCatalog;

/// One domain as a scan saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScannedDomain {
    /// Whether libvirt counts it as running.
    pub running: bool,
    /// Its ownership tag, if it has one.
    pub tag: Option<Tag>,
    /// Its vCPUs and memory.
    pub shape: Shape,
    /// What its definition binds (read only when some instance type holds CPUs or huge
    /// pages alone, or `--dedicated-cpus` is set).
    pub held: Option<Held>,
}

/// One host's scan.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Scan {
    /// The node info, when read.
    pub node: Option<Node>,
    /// Every domain by name.
    pub domains: BTreeMap<String, ScannedDomain>,
    /// Volume names in the storage pool (empty when the pool could not be listed).
    pub volumes: Vec<String>,
    /// The pool's capacity and allocation in bytes, when read.
    pub pool: Option<(u64, u64)>,
    /// The virtual size (bytes) of every volume not named after a domain of ours that the
    /// scan saw (the golden image, other users' volumes, leftovers, a Create's volumes
    /// before its define): ours are sized from the catalog instead, which saves a call per
    /// volume.
    pub foreign_volumes: BTreeMap<String, u64>,
    /// The host's CPU and huge page topology, and its free huge pages by size (read with
    /// the definitions, see [`ScannedDomain::held`]).
    pub topology: Option<(Topology, BTreeMap<u64, u64>)>,
}

impl Scan {
    /// The domains that hold host resources: active ones, and ours even when stopped; the
    /// disk of each of ours is `disk_of` its tag (its type's disks), others' are counted
    /// with the foreign volumes. What a domain holds alone (CPUs of `dedicated`, huge
    /// pages) is left out of its shape: [`Scan::claims`] counts it.
    #[must_use]
    pub fn committed(
        &self,
        provider: &str,
        dedicated: &CpuSet,
        disk_of: &dyn Fn(&Tag) -> u64,
    ) -> BTreeMap<String, Shape> {
        self.domains
            .iter()
            .filter(|(_, d)| d.running || d.tag.as_ref().is_some_and(|t| t.provider == provider))
            .map(|(name, d)| {
                let ours = d.tag.as_ref().filter(|t| t.provider == provider);
                let disk_bytes = ours.map_or(0, disk_of);
                (
                    name.clone(),
                    Shape {
                        disk_bytes,
                        ..self.shared(d, dedicated)
                    },
                )
            })
            .collect()
    }

    /// `d`'s share of the host's shared budget: no vCPUs when every CPU it is bound to is a
    /// dedicated one (it holds those alone), no memory when huge pages back it.
    fn shared(&self, d: &ScannedDomain, dedicated: &CpuSet) -> Shape {
        let Some(held) = &d.held else {
            return d.shape;
        };
        let pinned_alone = !held.pinned.is_empty() && held.pinned.minus(dedicated).is_empty();
        Shape {
            vcpu: if pinned_alone { 0 } else { d.shape.vcpu },
            memory_mib: if held.hugepages.is_some() {
                0
            } else {
                d.shape.memory_mib
            },
            disk_bytes: d.shape.disk_bytes,
        }
    }

    /// The claims of the domains that hold resources (as [`Scan::committed`] counts
    /// them), and the huge pages the running ones hold, by size; `None` when the scan did
    /// not read the definitions.
    #[must_use]
    pub fn claims(
        &self,
        provider: &str,
        dedicated: &CpuSet,
    ) -> Option<(BTreeMap<String, Claim>, BTreeMap<u64, u64>)> {
        let (topology, _) = self.topology.as_ref()?;
        let default_page = topology.default_page_kib();
        let mut claims = BTreeMap::new();
        let mut running: BTreeMap<u64, u64> = BTreeMap::new();
        for (name, d) in &self.domains {
            let Some(held) = &d.held else { continue };
            let claim = Claim::scanned(held, dedicated, default_page);
            if let (true, Some((size, count))) = (d.running, claim.pages) {
                *running.entry(size).or_default() += count;
            }
            if d.running || d.tag.as_ref().is_some_and(|t| t.provider == provider) {
                claims.insert(name.clone(), claim);
            }
        }
        Some((claims, running))
    }

    /// The pool as the ledger counts it, when it was read.
    #[must_use]
    pub fn pool_room(&self) -> Option<PoolRoom> {
        let (capacity, allocation) = self.pool?;
        let foreign = (self.foreign_volumes.values()).fold(0u64, |sum, b| sum.saturating_add(*b));
        Some(PoolRoom {
            capacity,
            allocation,
            foreign,
        })
    }
}

/// Reads node info, every domain (with what its definition binds when `placement`, and
/// then the host's topology and free huge pages too, and its node devices when `devices`),
/// the volume names of `pools` (`--storage-pool` first, then
/// `--seed-pool` when it is another; none: no pool is read), the storage pool's size, and the size of every volume
/// in it not named after a domain of `provider`'s.
pub(crate) fn scan(
    session: &Session,
    pools: &[String],
    provider: &str,
    (placement, devices): (bool, bool),
) -> Result<Scan, HypervisorError> {
    let conn = &session.conn;
    let info = conn
        .node_info()
        .map_err(|e| context("read node info", &e))?;
    let listed = conn
        .list_all_domains(0)
        .map_err(|e| context("list domains", &e))?;
    let mut domains = BTreeMap::new();
    for domain in listed {
        // A domain can vanish between the listing and the read: skip it.
        let (Ok(name), Ok(details)) = (domain.name(), domain.info()) else {
            continue;
        };
        let scanned = ScannedDomain {
            running: details.state.known().is_some_and(is_active),
            tag: read_tag(&domain),
            shape: Shape {
                vcpu: u64::from(details.nr_virt_cpu),
                memory_mib: details.max_mem / 1024,
                disk_bytes: 0,
            },
            held: placement.then(|| topology::held(&domain)),
        };
        domains.insert(name, scanned);
    }
    let mut listed = pools.iter().map(|pool| {
        volumes::list(session, pool).unwrap_or_else(|e| {
            warn!(error = %e, "cannot list a storage pool; its orphan volumes are not checked");
            Vec::new()
        })
    });
    let storage = listed.next().unwrap_or_default();
    let mut volumes = storage.clone();
    volumes.extend(listed.flatten());
    let pool = pools.first().map_or("", String::as_str);
    let ours = |volume: &str| {
        volumes::owner_of(volume)
            .and_then(|owner| domains.get(owner))
            .and_then(|d: &ScannedDomain| d.tag.as_ref())
            .is_some_and(|t| t.provider == provider)
    };
    let others: Vec<&String> = storage.iter().filter(|v| !ours(v)).collect();
    let sized = (!pools.is_empty()).then(|| volumes::sizes(session, pool, &others));
    let (pool, foreign_volumes) = match sized {
        None => (None, BTreeMap::new()),
        Some(Ok(sizes)) => (Some(sizes.pool), sizes.volumes),
        Some(Err(e)) => {
            warn!(error = %e, "cannot read the storage pool's size; its disk room is not updated");
            (None, BTreeMap::new())
        }
    };
    Ok(Scan {
        topology: placement
            .then(|| read_topology(session, devices))
            .transpose()?,
        node: Some(Node {
            cpus: info.cpus,
            memory_kib: info.memory,
        }),
        domains,
        volumes,
        pool,
        foreign_volumes,
    })
}

/// The host's topology and its free huge pages by size (none when they cannot be read: then
/// only the domains' own claims count against the pools).
fn read_topology(
    session: &Session,
    devices: bool,
) -> Result<(Topology, BTreeMap<u64, u64>), HypervisorError> {
    let read = topology::read(&session.conn, devices)?;
    let free = topology::free_pages(&session.conn, &read).unwrap_or_else(|e| {
        warn!(error = %e, "cannot read the host's free huge pages; only the domains' own \
              claims are counted against its pools");
        BTreeMap::new()
    });
    Ok((read, free))
}

/// The disks of a machine of `instance_type` over a golden image of `image_bytes` (`None`:
/// not read), in bytes: its root and data disks. `u64::MAX` when its root cannot hold the
/// image (such a machine cannot be made, so it never fits); 0 for a type not in `catalog`.
#[must_use]
pub fn disk_bytes(catalog: &InstanceCatalog, instance_type: &str, image_bytes: Option<u64>) -> u64 {
    let Some(shape) = catalog.get(instance_type) else {
        return 0;
    };
    (shape
        .disks
        .root_bytes(instance_type, image_bytes.unwrap_or(0)))
    .map_or(u64::MAX, |root| {
        root.saturating_add(shape.disks.data_bytes())
    })
}

/// What one reachable host contributes to the inventory.
#[derive(Clone, Debug)]
pub struct HostView<'a> {
    /// The scan.
    pub scan: &'a Scan,
    /// The golden image's virtual size on this host, when the scan read it.
    pub image_bytes: Option<u64>,
    /// Capacity still free (after reservations in flight), if the node is known.
    pub free: Option<Shape>,
    /// Dedicated CPUs and huge pages still free, once the host's topology is known.
    pub room: Option<Room>,
}

/// The inventory: every slot on a reachable host, Idle when its domain runs, Speculative
/// when it can be created (or adopted), withheld otherwise. `views` holds only the hosts
/// that were scanned. Slots in `dead` (their record is Failed, which is terminal) are left
/// out and hold no room: a failed Create must not keep the next slot of its type withheld.
#[must_use]
pub fn inventory(
    provider: &str,
    slots: &[Machine],
    catalog: &InstanceCatalog,
    views: &BTreeMap<String, HostView<'_>>,
    dead: &BTreeSet<String>,
) -> Vec<Machine> {
    let mut free: BTreeMap<&str, Option<Shape>> =
        views.iter().map(|(z, v)| (z.as_str(), v.free)).collect();
    let mut rooms: BTreeMap<&str, Option<Room>> = (views.iter())
        .map(|(z, v)| (z.as_str(), v.room.clone()))
        .collect();
    let mut machines = Vec::new();
    for slot in slots.iter().filter(|s| !dead.contains(s.id.as_str())) {
        let Some(view) = views.get(&slot.zone) else {
            continue;
        };
        let name = domain_name(provider, slot.id.as_str());
        match view.scan.domains.get(&name) {
            Some(domain) => match &domain.tag {
                Some(tag) if tag.is(provider, slot.id.as_str()) => {
                    let mut machine = slot.clone();
                    if domain.running {
                        machine.state = MachineState::Idle;
                        machine.host = Some(
                            DomainRef::new(slot.zone.as_str(), name.as_str()).host_ref(provider),
                        );
                    }
                    machines.push(machine);
                }
                _ => warn!(
                    machine_id = %slot.id, domain = %name,
                    "slot withheld: its domain name is taken by a domain that is not ours"
                ),
            },
            None => {
                let needs = catalog.get(&slot.instance_type).map(|t| {
                    let disk = disk_bytes(catalog, &slot.instance_type, view.image_bytes);
                    needs(t.vcpu, t.memory_mib, t.placement, &t.devices, disk)
                });
                let left = free.entry(slot.zone.as_str()).or_insert(None);
                let room = rooms.entry(slot.zone.as_str()).or_insert(None);
                match (needs, left.as_mut()) {
                    (Some((shape, ask)), Some(left)) => {
                        let alone = ask == Ask::default()
                            || room.as_mut().is_some_and(|r| r.clone().take(&ask));
                        if shape.fits_in(*left) && alone {
                            *left = left.minus(shape);
                            if let Some(room) = room.as_mut() {
                                room.take(&ask);
                            }
                            machines.push(slot.clone());
                        }
                    }
                    _ => machines.push(slot.clone()),
                }
            }
        }
    }
    machines
}

/// Managed machines the substrate no longer matches, per zone.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Drift {
    /// Machine ids whose domain vanished.
    pub vanished: Vec<String>,
    /// Machine ids whose domain is not running.
    pub stopped: Vec<String>,
}

/// Compares the machines the provider knows to run (id → zone) with the scans. A stopped
/// domain of a first-boot machine (`first_boot` says which ids are) whose tag names no
/// cluster is resting until its Configure, not drift.
#[must_use]
pub fn drift(
    provider: &str,
    known: &BTreeMap<String, String>,
    views: &BTreeMap<String, HostView<'_>>,
    first_boot: impl Fn(&str) -> bool,
) -> BTreeMap<String, Drift> {
    let mut found: BTreeMap<String, Drift> = BTreeMap::new();
    for (machine_id, zone) in known {
        let Some(view) = views.get(zone) else {
            continue;
        };
        let entry = found.entry(zone.clone()).or_default();
        match view.scan.domains.get(&domain_name(provider, machine_id)) {
            None => entry.vanished.push(machine_id.clone()),
            Some(d) if !d.running && resting(d, || first_boot(machine_id)) => {}
            Some(d) if !d.running => entry.stopped.push(machine_id.clone()),
            Some(_) => {}
        }
    }
    found
}

/// Whether a stopped domain rests as it should: its tag names no cluster and its machine
/// configures at first boot.
fn resting(domain: &ScannedDomain, first_boot: impl FnOnce() -> bool) -> bool {
    domain.tag.as_ref().is_some_and(|t| t.cluster_id.is_empty()) && first_boot()
}

/// Tagged domains of this provider that no slot and no known machine explains, and volumes
/// named after one of our domains that has no domain (and no Create in flight).
#[must_use]
pub fn orphans(
    provider: &str,
    zone: &str,
    scan: &Scan,
    slot_ids: &BTreeSet<String>,
    known: &BTreeMap<String, String>,
    pending: &dyn Fn(&str) -> bool,
) -> Vec<Orphan> {
    let mut found = Vec::new();
    let mut ours: BTreeSet<String> = slot_ids
        .iter()
        .chain(known.keys())
        .map(|id| domain_name(provider, id))
        .collect();
    for (name, domain) in &scan.domains {
        let Some(tag) = domain.tag.as_ref().filter(|t| t.provider == provider) else {
            continue;
        };
        ours.insert(name.clone());
        if !slot_ids.contains(&tag.machine_id) && !known.contains_key(&tag.machine_id) {
            found.push(Orphan::Domain {
                zone: zone.to_owned(),
                name: name.clone(),
                machine_id: tag.machine_id.clone(),
            });
        }
    }
    for volume in &scan.volumes {
        let Some(owner) = volumes::owner_of(volume) else {
            continue;
        };
        if ours.contains(owner) && !scan.domains.contains_key(owner) && !pending(owner) {
            found.push(Orphan::Volume {
                zone: zone.to_owned(),
                name: volume.clone(),
            });
        }
    }
    found
}

#[cfg(test)]
#[path = "describe_tests.rs"]
mod tests;
