//! Adapter tests against libvirt's test driver: each rig writes its own node file, so every
//! test gets a private in-memory host (the driver gives each connection opened from a file
//! its own state). The tests that need two providers on one host, or a second provider
//! process after state loss, use `test:///default`, which is shared by every connection in
//! the process, with a provider label and base volume unique to the test.

mod addresses;
mod contract;
mod disks;
mod first_boot;
mod hosts;
mod isolation;
mod lanes;
mod lifecycle;
mod passthrough;
mod placement;
mod rbd;
mod reconcile;
mod watch;
mod watch_timeline;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bigfleet_libvirt_domain::{Machine, MachineState, OperationId, StringMap};
use bigfleet_libvirt_ports::{CreateRequest, DeleteRequest, Hypervisor, HypervisorError};
use tempfile::TempDir;

use super::{LibvirtConfig, LibvirtHypervisor};
use crate::host::fixture::Fixture;
use crate::host::lanes::Lane;
use crate::host::session::Session;
use crate::metrics::LibvirtMetrics;
use crate::options::{CapacityPolicy, HostPolicy, Platform};
use crate::render::ownership::Tag;
use crate::render::spec::{Base, Disks, DomainSpec, VolumePaths, overlay_name, seed_name};
use crate::render::xml;
use bigfleet_libvirt_config::HostConnection;
use bigfleet_libvirt_domain::catalog::{
    InstanceCatalog, InventoryConfig, Offering, PriceTable, build_inventory,
};
use bigfleet_libvirt_system::{SystemClock, TokioSpawner};

/// The document of a domain planted outside the provider: `name`, tagged `tag`, of `vcpu`
/// and `memory_mib`, no NIC, the default platform, its volumes at `paths` (overlay, seed).
pub(super) fn planted_domain(
    name: &str,
    tag: Tag,
    vcpu: u32,
    memory_mib: u64,
    paths: (&str, &str),
) -> String {
    let spec = DomainSpec {
        name: name.to_owned(),
        tag,
        instance_type: String::new(),
        instance_id: String::new(),
        vcpu,
        memory_mib,
        placed: crate::render::placement::Placed::default(),
        cpu: None,
        nics: Vec::new(),
        address: None,
        platform: Platform::default(),
        disks: Disks {
            overlay: overlay_name(name),
            seed: seed_name(name),
            console: crate::render::spec::console_name(name),
            base: Base {
                path: "/base".to_owned(),
                format: "qcow2".to_owned(),
                overlay_bytes: 1 << 30,
                rbd: None,
            },
            data: Vec::new(),
            ignition: None,
        },
        user_data: Arc::from(&b""[..]),
        tpm: false,
        secure_boot: false,
    };
    let (overlay, seed) = paths;
    xml::domain(
        &spec,
        VolumePaths {
            overlay,
            seed,
            console: None,
            data: &[],
            ignition: None,
        },
    )
}

/// The zone of single-host rigs.
pub(super) const ZONE: &str = "rack1";

/// A label no other test in this process uses (for the shared `test:///default`).
pub(super) fn unique(prefix: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!("{prefix}-{}", NEXT.fetch_add(1, Ordering::Relaxed))
}

/// `count` Speculative slots of `instance_type` in `zone`.
pub(super) fn slots(provider: &str, zone: &str, instance_type: &str, count: i64) -> Vec<Machine> {
    let catalog = InstanceCatalog::builtin();
    let prices = PriceTable::new(BTreeMap::new(), 0.003, 0.0008, &catalog).unwrap();
    let offering = Offering {
        instance_type: instance_type.to_owned(),
        zone: zone.to_owned(),
        capacity_type: String::new(),
        count,
        resources: StringMap::new(),
        labels: StringMap::new(),
    };
    let cfg = InventoryConfig {
        provider,
        catalog: &catalog,
        prices: &prices,
        require_zones: None,
    };
    build_inventory(&[offering], &cfg).unwrap().machines
}

/// A configuration with fast reconnects, no capacity reserve, a disk ratio far past the
/// test driver's pool, and no drift watch (the
/// watch's own tests turn it on).
pub(super) fn config(
    provider: &str,
    connections: Vec<HostConnection>,
    slots: Vec<Machine>,
    image: &str,
) -> LibvirtConfig {
    let mut config = LibvirtConfig::new(
        provider,
        connections,
        slots,
        InstanceCatalog::builtin(),
        image,
    );
    config.options.capacity = CapacityPolicy {
        reserve_cpu: 0,
        reserve_memory_mib: 0,
        cpu_ratio: 1.0,
        memory_ratio: 1.0,
        // The test driver's pools always report 100 GiB: room for the rigs' built-in types,
        // whose roots are 40 GiB and up (the disk tests set their own ratio).
        disk_ratio: 1000.0,
        ..CapacityPolicy::default()
    };
    config.hosts = HostPolicy {
        probe_interval: Duration::from_millis(200),
        backoff_min: Duration::from_millis(10),
        backoff_max: Duration::from_millis(100),
        watch_interval: Duration::ZERO,
        ..HostPolicy::default()
    };
    config.startup_wait = Duration::from_secs(10);
    config
}

/// A hypervisor over a private fixture host.
pub(super) struct Rig {
    pub(super) _dir: TempDir,
    pub(super) hv: LibvirtHypervisor<SystemClock>,
    pub(super) metrics: LibvirtMetrics,
    pub(super) slots: Vec<Machine>,
}

/// A rig whose single zone runs `fixture`, with `slots`.
pub(super) async fn rig_with(
    fixture: &Fixture,
    slots: Vec<Machine>,
    tune: impl FnOnce(&mut LibvirtConfig),
) -> Rig {
    let dir = tempfile::tempdir().unwrap();
    let uri = fixture.write(dir.path(), "node.xml").unwrap();
    let connections = vec![HostConnection {
        zone: ZONE.to_owned(),
        uri,
    }];
    let mut config = config("libvirt", connections, slots.clone(), &fixture.base_volume);
    tune(&mut config);
    let metrics = LibvirtMetrics::unexposed();
    let hv = LibvirtHypervisor::connect(config, SystemClock, &TokioSpawner, metrics.clone()).await;
    Rig {
        _dir: dir,
        hv,
        metrics,
        slots,
    }
}

/// A default rig with four `kvm.small` slots.
pub(super) async fn rig() -> Rig {
    rig_with(
        &Fixture::default(),
        slots("libvirt", ZONE, "kvm.small", 4),
        |_| {},
    )
    .await
}

/// Runs `f` on the hypervisor's own connection to `zone` (a second connection to a node
/// file would see a different, fresh host).
pub(super) async fn on_host<T: Send + 'static>(
    hv: &LibvirtHypervisor<SystemClock>,
    zone: &str,
    f: impl FnOnce(&Session) -> T + Send + 'static,
) -> T {
    let host = Arc::clone(&hv.inner.hosts[zone]);
    host.call(Lane::Read, move |s| Ok(f(s))).await.unwrap()
}

/// Names of every domain on the host.
pub(super) async fn domains(hv: &LibvirtHypervisor<SystemClock>, zone: &str) -> Vec<String> {
    on_host(hv, zone, |s| {
        let mut names: Vec<String> = s
            .conn
            .list_all_domains(0)
            .unwrap()
            .iter()
            .map(|d| d.name().unwrap())
            .collect();
        names.sort();
        names
    })
    .await
}

/// Names of every volume in the pool.
pub(super) async fn volumes(
    hv: &LibvirtHypervisor<SystemClock>,
    zone: &str,
    pool: &str,
) -> Vec<String> {
    let pool = pool.to_owned();
    on_host(hv, zone, move |s| {
        let pool = s.conn.lookup_storage_pool_by_name(&pool).unwrap();
        let mut names = pool.list_volumes().unwrap();
        names.sort();
        names
    })
    .await
}

/// Each volume of `pool` with its virtual size, sorted by name.
pub(super) async fn sized(rig: &Rig, pool: &'static str) -> Vec<(String, u64)> {
    on_host(&rig.hv, ZONE, move |s| {
        let pool = s.conn.lookup_storage_pool_by_name(pool).unwrap();
        let mut all: Vec<(String, u64)> = (pool.list_all_volumes(0).unwrap().iter())
            .map(|v| (v.name().unwrap(), v.info().unwrap().capacity))
            .collect();
        all.sort();
        all
    })
    .await
}

/// The record as the provider hands it to Create.
pub(super) fn creating(slot: &Machine) -> CreateRequest {
    let mut machine = slot.clone();
    machine.state = MachineState::Creating;
    CreateRequest {
        machine: Arc::new(machine),
        operation_id: OperationId::from_stored("op-1".to_owned()),
    }
}

/// Creates `slot` and returns the record with its host set.
pub(super) async fn create(
    hv: &LibvirtHypervisor<SystemClock>,
    slot: &Machine,
) -> Result<Machine, HypervisorError> {
    let created = hv.create(creating(slot)).await?;
    let mut machine = slot.clone();
    machine.state = MachineState::Idle;
    machine.host = Some(created.host);
    Ok(machine)
}

/// Deletes `machine`.
pub(super) async fn delete(
    hv: &LibvirtHypervisor<SystemClock>,
    machine: &Machine,
) -> Result<(), HypervisorError> {
    let mut machine = machine.clone();
    machine.state = MachineState::Deleting;
    let request = DeleteRequest {
        machine: Arc::new(machine),
        operation_id: OperationId::from_stored("op-2".to_owned()),
    };
    hv.delete(request).await
}

/// A Create of `slot` with `disks` that the test driver refuses at its define (zero vCPUs),
/// after every volume exists, run directly on the rig's host (not through the provider).
pub(super) async fn create_refused_at_define(
    rig: &Rig,
    slot: &Machine,
    disks: bigfleet_libvirt_domain::catalog::DiskShape,
) -> HypervisorError {
    let host = Arc::clone(&rig.hv.inner.hosts[ZONE]);
    let settings = Arc::clone(&rig.hv.inner.settings);
    let spec = crate::service::lifecycle::CreateSpec {
        name: bigfleet_libvirt_config::naming::domain_name("libvirt", slot.id.as_str()),
        machine_id: slot.id.to_string(),
        instance_type: slot.instance_type.clone(),
        operation_id: "op-1".to_owned(),
        vcpu: 0,
        memory_mib: 512,
        disks,
        placement: bigfleet_libvirt_domain::catalog::Placement::default(),
        devices: std::collections::BTreeMap::new(),
        tpm: false,
        secure_boot: false,
        boot: bigfleet_libvirt_domain::catalog::BootMode::Agent,
    };
    let owner = Arc::clone(&host);
    host.call(Lane::Create, move |s| {
        crate::service::lifecycle::create(s, &owner, &settings, &spec)
    })
    .await
    .unwrap_err()
}
