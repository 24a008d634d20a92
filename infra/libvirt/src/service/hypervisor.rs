//! The `Hypervisor` port on top of the libvirt building blocks: which host a call goes
//! to, which blocking sequence it runs there, and what describe reports.
//!
//! Machines map to hosts by zone and to domains by name: the name comes from the host ref
//! when the record has one, else it is derived from the provider label and machine id
//! (the compensating Delete of a failed Create has no host ref). Every domain touched is
//! first proven ours by its tag (`domains::owned`). Describe scans all hosts concurrently,
//! each bounded by a timeout, so an unreachable or slow host only withholds its own slots.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use bigfleet_libvirt_domain::catalog::{DeviceClasses, parse_machine_id};
use bigfleet_libvirt_domain::{Machine, MachineState};
use bigfleet_libvirt_ports::{
    Clock, ConfigureRequest, CreateRequest, Created, DeleteRequest, DomainRef, DrainRequest,
    Hypervisor, HypervisorError,
};
use futures::FutureExt;
use tracing::{info, warn};

use super::{Inner, LibvirtHypervisor};
use crate::drift::describe::{self, HostView, Scan};
use crate::drift::orphans::Orphan;
use crate::drift::tracked::Busy;
use crate::guest::bootstrap::{self as guest, DomainAgent};
use crate::guest::probe;
use crate::host::capacity::{Ledger, Node};
use crate::host::connection::Host;
use crate::host::error::{maybe_done, refused};
use crate::host::lanes::Lane;
use crate::metrics::{DriftLabels, LibvirtMetrics};
use crate::options::CapacityPolicy;
use crate::render::ownership::Tag;
use crate::render::spec::data_volumes;
use crate::service::lifecycle::{self, CreateSpec};
use crate::storage::volumes::{self, Pools};
use bigfleet_libvirt_config::naming::domain_name;
use bigfleet_libvirt_system::Stopwatch;

pub(super) fn prefixed(what: &str, error: HypervisorError) -> HypervisorError {
    HypervisorError {
        message: format!("{what}: {}", error.message),
        ..error
    }
}

impl<C: Clock> LibvirtHypervisor<C> {
    fn host(&self, zone: &str) -> Result<Arc<Host>, HypervisorError> {
        self.inner.hosts.get(zone).cloned().ok_or_else(|| {
            refused(format!(
                "no libvirt connection is configured for zone {zone:?}; add {zone}=<uri> to \
                 --connect"
            ))
        })
    }

    /// The host and domain name a machine lives at.
    pub(super) fn target(&self, machine: &Machine) -> Result<(Arc<Host>, String), HypervisorError> {
        let placed = machine
            .host
            .as_ref()
            .filter(|h| h.is_set())
            .and_then(|h| h.reference.parse::<DomainRef>().ok());
        match placed {
            Some(placed) => Ok((self.host(&placed.zone)?, placed.name)),
            None => Ok((
                self.host(&machine.zone)?,
                domain_name(&self.inner.config.provider, machine.id.as_str()),
            )),
        }
    }

    async fn power_on(
        &self,
        what: &str,
        lane: Lane,
        machine: &Machine,
    ) -> Result<Arc<Host>, HypervisorError> {
        let (host, name) = self.target(machine)?;
        let (settings, id) = (Arc::clone(&self.inner.settings), machine.id.to_string());
        host.call(lane, move |s| lifecycle::power_on(s, &settings, &name, &id))
            .await
            .map_err(|e| prefixed(what, e))?;
        Ok(host)
    }

    async fn retag(
        &self,
        what: &str,
        lane: Lane,
        machine: &Machine,
        cluster: &str,
    ) -> Result<(), HypervisorError> {
        let (host, name) = self.target(machine)?;
        let (settings, id) = (Arc::clone(&self.inner.settings), machine.id.to_string());
        let cluster = cluster.to_owned();
        host.call(lane, move |s| {
            lifecycle::retag(s, &settings, &name, &id, &cluster)
        })
        .await
        .map_err(|e| prefixed(what, e))
    }

    /// Scans one host, or `None` when it is unreachable, fails, or is too slow; with the
    /// ledger's ticket for it.
    async fn scan(&self, host: &Arc<Host>) -> Option<(u64, Scan)> {
        host.session().ok()?;
        let config = &self.inner.config;
        let placement = config.options.places(&config.catalog);
        let devices = config.catalog.asks_devices();
        let pools: Vec<String> = (Pools::of(&self.inner.config.options).each())
            .into_iter()
            .map(str::to_owned)
            .collect();
        let provider = self.inner.config.provider.clone();
        let clock = &self.inner.clock;
        let deadline = clock
            .now()
            .saturating_add(self.inner.config.describe_timeout);
        // Biased: a scan that completes with the deadline is still used.
        let ticket = host.ledger().begin_scan();
        let read = move |s: &_| describe::scan(s, &pools, &provider, (placement, devices));
        let scanned = futures::select_biased! {
            scanned = host.call(Lane::Read, read).fuse() => scanned,
            () = clock.sleep_until(deadline).fuse() => {
                warn!(zone = %host.zone, "describe: host too slow; its slots are withheld");
                return None;
            }
        };
        scanned
            .inspect_err(|e| warn!(zone = %host.zone, error = %e, "describe: scan failed"))
            .ok()
            .map(|scan| (ticket, scan))
    }

    fn report_drift(&self, views: &BTreeMap<String, HostView<'_>>, orphans: &[Orphan]) {
        let known = self.inner.known().clone();
        let catalog = &self.inner.config.catalog;
        let first_boot =
            |id: &str| parse_machine_id(id).is_some_and(|p| catalog.boots_first(&p.instance_type));
        let drift = describe::drift(&self.inner.config.provider, &known, views, first_boot);
        for zone in views.keys() {
            let found = drift.get(zone).cloned().unwrap_or_default();
            for id in &found.vanished {
                warn!(zone, machine_id = %id, "managed domain vanished outside the provider");
            }
            for id in &found.stopped {
                warn!(zone, machine_id = %id, "managed domain is not running");
            }
            let in_zone = |kind: &str| {
                orphans
                    .iter()
                    .filter(|o| o.zone() == zone && o.kind() == kind)
                    .count()
            };
            let counts = [
                ("vanished", found.vanished.len()),
                ("stopped", found.stopped.len()),
                ("orphan_domain", in_zone("orphan_domain")),
                ("orphan_volume", in_zone("orphan_volume")),
            ];
            for (kind, count) in counts {
                let labels = DriftLabels {
                    zone: zone.clone(),
                    kind: kind.to_owned(),
                };
                let count = i64::try_from(count).unwrap_or(i64::MAX);
                self.inner.metrics.drift.get_or_create(&labels).set(count);
            }
        }
    }

    fn find_orphans(&self, scans: &BTreeMap<String, Scan>) -> Vec<Orphan> {
        let config = &self.inner.config;
        let slot_ids: BTreeSet<String> = config.slots.iter().map(|m| m.id.to_string()).collect();
        let known = self.inner.known().clone();
        let mut found = Vec::new();
        for (zone, scan) in scans {
            let host = &self.inner.hosts[zone];
            let pending = |name: &str| host.ledger().is_pending(name);
            found.extend(describe::orphans(
                &config.provider,
                zone,
                scan,
                &slot_ids,
                &known,
                &pending,
            ));
        }
        found
    }

    async fn handle_orphans(&self, zones: &BTreeSet<String>, found: &[Orphan]) {
        let gc = self.inner.config.options.gc;
        let now = self.inner.clock.now();
        let verdict = self.inner.book().observe(now, zones, found, gc.grace);
        for orphan in &verdict.new {
            warn!(?orphan, grace = ?gc.grace, "orphan found: ours by tag, unknown to the provider");
        }
        if !gc.collect {
            for orphan in &verdict.newly_due {
                info!(
                    ?orphan,
                    "dry run: would collect this orphan (pass --gc-orphans)"
                );
            }
            return;
        }
        for orphan in verdict.due {
            match self.collect(&orphan).await {
                Ok(()) => {
                    info!(?orphan, "orphan collected");
                    self.inner.book().collected(&orphan);
                }
                Err(e) => warn!(?orphan, error = %e, "orphan collection failed"),
            }
        }
    }

    async fn collect(&self, orphan: &Orphan) -> Result<(), HypervisorError> {
        let host = self.host(orphan.zone())?;
        let settings = Arc::clone(&self.inner.settings);
        match orphan.clone() {
            Orphan::Domain {
                name, machine_id, ..
            } => {
                let owner = Arc::clone(&host);
                host.call(Lane::Teardown, move |s| {
                    lifecycle::delete(s, &owner, &settings, &name, &machine_id, Vec::new())
                })
                .await
            }
            Orphan::Volume { name, .. } => {
                host.call(Lane::Teardown, move |s| {
                    volumes::delete_anywhere(s, Pools::of(&settings.options), &name)
                        .map_err(maybe_done)
                })
                .await
            }
        }
    }
}

/// Replaces `ledger`'s books with what the scan of `ticket` read.
fn refresh(
    ledger: &mut Ledger,
    ticket: u64,
    node: Node,
    scan: &Scan,
    (provider, classes): (&str, &DeviceClasses),
    policy: &CapacityPolicy,
    disk_of: &dyn Fn(&Tag) -> u64,
) {
    let dedicated = &policy.dedicated_cpus;
    if let (Some((topology, free)), Some((claims, running))) =
        (&scan.topology, scan.claims(provider, dedicated))
    {
        let books = ledger.claims_mut();
        books.set_topology(topology.clone(), classes);
        books.refresh(claims, free, &running);
    }
    let committed = scan.committed(provider, dedicated, disk_of);
    ledger.refresh(ticket, node, committed, scan.pool_room());
}

/// The host's capacity and pool series, from its ledger (disk only once the pool was read).
fn publish_capacity(
    metrics: &LibvirtMetrics,
    zone: &str,
    ledger: &Ledger,
    policy: &CapacityPolicy,
) {
    let Some(total) = ledger.allocatable(policy) else {
        return;
    };
    let used = ledger.used();
    metrics.set_capacity(zone, "vcpu", total.vcpu, used.vcpu);
    let mib = 1 << 20;
    let memory = (
        total.memory_mib.saturating_mul(mib),
        used.memory_mib.saturating_mul(mib),
    );
    metrics.set_capacity(zone, "memory_bytes", memory.0, memory.1);
    if let Some(pool) = ledger.pool() {
        metrics.set_capacity(zone, "disk_bytes", total.disk_bytes, used.disk_bytes);
        metrics.set_pool(zone, pool.capacity, pool.allocation);
    }
    let claims = ledger.claims();
    let Some(topology) = claims.topology() else {
        return;
    };
    let count = |n: usize| u64::try_from(n).unwrap_or(u64::MAX);
    if !policy.dedicated_cpus.is_empty() {
        let dedicated = policy.dedicated_cpus.and(&topology.cpus()).len();
        metrics.set_capacity(
            zone,
            "dedicated_cpus",
            count(dedicated),
            count(claims.held().0),
        );
    }
    for (size, pool) in &topology.pages {
        let taken = pool.saturating_sub(claims.free_pages(*size));
        metrics.set_capacity(zone, &format!("hugepages_{size}kib"), *pool, taken);
    }
    for (class, (usable, held)) in claims.device_counts() {
        metrics.set_capacity(zone, &format!("devices_{class}"), usable, held);
    }
}

impl<C: Clock> Hypervisor for LibvirtHypervisor<C> {
    async fn describe(&self) -> Result<Vec<Machine>, HypervisorError> {
        let inner: &Inner<C> = &self.inner;
        let scanned = futures::future::join_all(inner.hosts.iter().map(|(zone, host)| {
            self.scan(host)
                .map(move |scan| scan.map(|s| (zone.clone(), s)))
        }))
        .await;
        let (tickets, scans): (BTreeMap<String, u64>, BTreeMap<String, Scan>) = (scanned
            .into_iter())
        .flatten()
        .map(|(zone, (ticket, scan))| ((zone.clone(), ticket), (zone, scan)))
        .unzip();
        let provider = &inner.config.provider;
        let mut views = BTreeMap::new();
        let catalog = &inner.config.catalog;
        for (zone, scan) in &scans {
            let host = &inner.hosts[zone];
            let image_bytes = scan
                .foreign_volumes
                .get(&inner.config.options.image)
                .copied();
            let disk_of = |tag: &Tag| {
                parse_machine_id(&tag.machine_id).map_or(0, |id| {
                    describe::disk_bytes(catalog, &id.instance_type, image_bytes)
                })
            };
            let policy = &inner.config.options.capacity;
            let mut ledger = host.ledger();
            if let Some(node) = scan.node {
                refresh(
                    &mut ledger,
                    tickets[zone],
                    node,
                    scan,
                    (provider, catalog.device_classes()),
                    policy,
                    &disk_of,
                );
            }
            publish_capacity(&self.inner.metrics, zone, &ledger, policy);
            let free = ledger.free(policy);
            let room = ledger.claims().room(&policy.dedicated_cpus);
            let view = HostView {
                scan,
                image_bytes,
                free,
                room,
            };
            views.insert(zone.clone(), view);
        }
        let (slots, catalog) = (&inner.config.slots, &inner.config.catalog);
        let machines = {
            let dead = inner.tracked.dead();
            describe::inventory(provider, slots, catalog, &views, &dead)
        };
        let orphans = self.find_orphans(&scans);
        self.report_drift(&views, &orphans);
        {
            let mut known = inner.known();
            for machine in machines.iter().filter(|m| m.state == MachineState::Idle) {
                known.insert(machine.id.to_string(), machine.zone.clone());
            }
        }
        let zones: BTreeSet<String> = scans.keys().cloned().collect();
        self.handle_orphans(&zones, &orphans).await;
        Ok(machines)
    }

    async fn create(&self, request: CreateRequest) -> Result<Created, HypervisorError> {
        let machine = &request.machine;
        let config = &self.inner.config;
        let spec = self.create_spec(machine, request.operation_id.as_str())?;
        let host = self.host(&machine.zone)?;
        let placed = DomainRef::new(machine.zone.clone(), spec.name.clone());
        let (settings, owner) = (Arc::clone(&self.inner.settings), Arc::clone(&host));
        host.call(Lane::Create, move |s| {
            lifecycle::create(s, &owner, &settings, &spec)
        })
        .await
        .map_err(|e| prefixed(&format!("create domain {}", machine.instance_type), e))?;
        self.inner
            .known()
            .insert(machine.id.to_string(), machine.zone.clone());
        Ok(Created {
            host: placed.host_ref(&config.provider),
            resources: None,
            allocatable: None,
        })
    }

    async fn configure(&self, request: ConfigureRequest) -> Result<(), HypervisorError> {
        let (clock, policy) = (&self.inner.clock, &self.inner.config.agent);
        let until = clock.now().saturating_add(policy.configure_wait);
        let machine = &request.machine;
        let (first_boot, blob) = (self.boots_first(machine), request.bootstrap_blob.expose());
        let host = if first_boot {
            let operation = &request.operation_id;
            (self.first_boot(
                "configure",
                Lane::Create,
                machine,
                operation,
                Some(blob.to_vec()),
            ))
            .await?
        } else {
            self.power_on("configure", Lane::Create, machine).await?
        };
        let (_, name) = self.target(machine)?;
        let agent = DomainAgent { host, name };
        let has_agent = self.has_agent(machine);
        if has_agent {
            self.agent_ready("configure", machine, &agent, until)
                .await?;
        }
        if !first_boot {
            let watch = Stopwatch::start();
            guest::bootstrap(&agent, clock, policy, &request.cluster_id, blob)
                .await
                .map_err(|e| maybe_done(format!("configure: {e}")))?;
            self.inner
                .metrics
                .observe_phase("bootstrap", watch.seconds());
        }
        // Only a successful bootstrap binds the domain to the cluster.
        self.retag("configure", Lane::Create, machine, &request.cluster_id)
            .await?;
        if has_agent {
            self.log_addresses(&agent, machine, &request.cluster_id)
                .await;
        }
        Ok(())
    }

    async fn drain(&self, request: DrainRequest) -> Result<(), HypervisorError> {
        let (clock, policy) = (&self.inner.clock, &self.inner.config.agent);
        let until = clock.now().saturating_add(policy.drain_wait);
        let machine = &request.machine;
        let has_agent = self.has_agent(machine);
        let (mut host, name) = self.target(machine)?;
        if has_agent {
            host = self.power_on("drain", Lane::Teardown, machine).await?;
        }
        let agent = DomainAgent { host, name };
        if has_agent {
            self.agent_ready("drain", machine, &agent, until).await?;
        }
        let first_boot = self.boots_first(machine);
        let hook = !first_boot || (has_agent && probe::allows(&agent, policy, &probe::DRAIN).await);
        let watch = Stopwatch::start();
        if hook {
            guest::drain(&agent, clock, policy, request.grace_period_seconds)
                .await
                .map_err(|e| maybe_done(format!("drain: {e}")))?;
        } else {
            self.shut_down(&agent, request.grace_period_seconds, until)
                .await?;
        }
        self.inner.metrics.observe_phase("drain", watch.seconds());
        if first_boot {
            let operation = &request.operation_id;
            (self.first_boot("drain", Lane::Teardown, machine, operation, None)).await?;
        }
        self.retag("drain", Lane::Teardown, machine, "").await
    }

    async fn delete(&self, request: DeleteRequest) -> Result<(), HypervisorError> {
        let machine = &request.machine;
        let (host, name) = self.target(machine)?;
        let (settings, owner) = (Arc::clone(&self.inner.settings), Arc::clone(&host));
        let id = machine.id.to_string();
        let _busy = Busy::mark(&self.inner.tracked, &id);
        let data = (self.inner.config.catalog.get(&machine.instance_type))
            .map(|shape| {
                let local = data_volumes(&name, &shape.disks, false);
                local
                    .into_iter()
                    .chain(data_volumes(&name, &shape.disks, true))
            })
            .into_iter()
            .flatten()
            .map(|disk| disk.volume)
            .collect();
        let watch = Stopwatch::start();
        host.call(Lane::Teardown, move |s| {
            lifecycle::delete(s, &owner, &settings, &name, &id, data)
        })
        .await
        .map_err(|e| prefixed("delete", e))?;
        self.inner.metrics.observe_phase("delete", watch.seconds());
        self.inner.known().remove(machine.id.as_str());
        Ok(())
    }

    /// The restore hand-off: tells the adapter which machines the provider's records place on a host (after a
    /// restart from durable state), so vanished or stopped domains can be reported and
    /// their domains are never taken for orphans.
    fn restored(&self, machines: &[Arc<Machine>]) {
        let mut known = self.inner.known();
        let mut dead = self.inner.tracked.dead();
        for machine in machines {
            if machine.host.as_ref().is_some_and(|h| h.is_set()) {
                known.insert(machine.id.to_string(), machine.zone.clone());
            }
            if machine.state == MachineState::Failed {
                dead.insert(machine.id.to_string());
            }
        }
    }

    /// A Failed slot is never created again: describe stops holding room for it.
    fn failed(&self, machine: &Machine) {
        self.inner.tracked.dead().insert(machine.id.to_string());
    }
}

impl<C: Clock> LibvirtHypervisor<C> {
    /// What a Create of `machine` (by operation `operation_id`) asks of its host, from its
    /// instance type.
    pub(super) fn create_spec(
        &self,
        machine: &Machine,
        operation_id: &str,
    ) -> Result<CreateSpec, HypervisorError> {
        let config = &self.inner.config;
        let shape = config.catalog.get(&machine.instance_type).ok_or_else(|| {
            refused(format!(
                "create: unknown instance_type {:?}",
                machine.instance_type
            ))
        })?;
        Ok(CreateSpec {
            name: domain_name(&config.provider, machine.id.as_str()),
            machine_id: machine.id.to_string(),
            instance_type: machine.instance_type.clone(),
            operation_id: operation_id.to_owned(),
            vcpu: shape.vcpu,
            memory_mib: shape.memory_mib,
            disks: shape.disks.clone(),
            placement: shape.placement,
            devices: shape.devices.clone(),
            tpm: shape.tpm,
            secure_boot: shape.secure_boot,
            boot: shape.boot,
        })
    }
}
