//! Turns the operator's flags (declared once in [`Flags`] and [`LimitFlags`], parsed by clap)
//! into a validated launch plan, in the reference's start-up order so the same error wins:
//! `--connect`, `--instance-types`, `--prices`, backend selection, offerings, then the rest.
//! Every error names the flag to fix. The `offerings` dry run uses the same path.

use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use bigfleet_libvirt_domain::{Machine, Policy, Timeouts};
use bigfleet_libvirt_ports::ProviderConfig;

use bigfleet_libvirt_domain::authorization::IdentityMode;
use bigfleet_libvirt_grpc::tls::TlsFiles;
use bigfleet_libvirt_libvirt::golden;
use bigfleet_libvirt_libvirt::{
    AddressBook, Budget, CapacityPolicy, CpuSet, DomainConfig, GcPolicy, fit_connections,
};

use bigfleet_libvirt_config::{self as config, ConfigError, HostConnection};

mod devices;
use bigfleet_libvirt_domain::catalog::{
    self, CatalogError, DeviceClasses, InstanceCatalog, Inventory, InventoryConfig, Offering,
    PriceTable,
};

mod flags;
mod ignition;
mod limits;
pub use flags::{Flags, optional_path, parse_duration};
pub use limits::{LimitFlags, net_limits};

/// Which hypervisor the provider drives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// The in-memory fake.
    Fake,
    /// Real libvirt hosts.
    Libvirt,
}

/// Everything needed to start the provider.
#[derive(Clone, Debug)]
pub struct Plan {
    pub backend: Backend,
    pub provider_label: String,
    pub connections: Vec<HostConnection>,
    pub offerings: Vec<Offering>,
    pub inventory: Inventory,
    pub provider: ProviderConfig,
    pub grpc_addr: SocketAddr,
    pub metrics_addr: Option<SocketAddr>,
    pub state: Option<PathBuf>,
    pub reconcile_interval: Option<Duration>,
    /// Register gRPC reflection (v1 and v1alpha).
    pub reflection: bool,
    /// The instance-type catalog (`--instance-types`): vCPU and memory per type.
    pub catalog: InstanceCatalog,
    pub fake: FakePolicy,
    /// The libvirt backend's options, in the adapter's own type (ignored by the fake).
    pub libvirt: DomainConfig,
    pub tls: Option<TlsFiles>,
    /// Whether calls are checked against the client certificate's identity.
    pub client_identity: IdentityMode,
}

/// How the fake behaves (ignored by the real backend).
#[derive(Clone, Debug)]
pub struct FakePolicy {
    pub fault_hooks: bool,
    pub delay_min: Duration,
    pub delay_max: Duration,
    pub seed: u64,
}

/// Why the provider may not start.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    /// A configuration value or file was refused.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// A catalog value (instance types, prices, capacity type, offerings) was refused.
    #[error(transparent)]
    Catalog(#[from] CatalogError),
    /// Some other flag was refused.
    #[error("{0}")]
    Flag(String),
}

fn flag(message: impl Into<String>) -> LaunchError {
    LaunchError::Flag(message.into())
}

/// Refuses, before any host is dialled, a `--connect` host whose transport runs a local
/// program (`qemu+ssh://` runs `ssh`) that `installed` does not find. Without the check
/// every dial of that host would fail forever with libvirt's opaque "Cannot recv data"; the
/// container image, for one, ships no ssh client.
///
/// # Errors
/// [`LaunchError::Flag`] naming `--connect`, the zone, the missing program and the fix.
pub fn check_client_programs(
    plan: &Plan,
    installed: impl Fn(&str) -> bool,
) -> Result<(), LaunchError> {
    if plan.backend != Backend::Libvirt {
        return Ok(());
    }
    for connection in &plan.connections {
        let Some(program) = connection.client_program() else {
            continue;
        };
        if !installed(&program) {
            return Err(flag(format!(
                "--connect {}={}: this transport runs the local program {program:?}, which is \
                 not installed here (the container image ships no ssh client); use \
                 qemu+libssh://…?keyfile=…&known_hosts=…&known_hosts_verify=normal (libvirt's \
                 in-process SSH client) or install the program",
                connection.zone,
                connection.redacted_uri(),
            )));
        }
    }
    Ok(())
}

/// Validates the flags and builds the launch plan.
///
/// # Errors
/// The first refused flag, with a message naming it and the fix.
pub fn resolve(flags: &Flags) -> Result<Plan, LaunchError> {
    config::validate_default_zone(&flags.default_zone)?;
    let connections = config::parse_connect(&flags.connect, &flags.default_zone)?;
    let (catalog, prices) = catalog_and_prices(flags)?;
    let backend = select_backend(flags, &connections)?;
    let tls = check_tls(flags)?;
    let client_identity = check_client_identity(flags, tls.as_ref())?;
    let mut libvirt = domain_config(flags)?;
    devices::apply(flags, &catalog, &mut libvirt)?;
    if backend == Backend::Libvirt {
        golden_settings(flags, &mut libvirt)?;
    }
    check_fake_flags(flags, backend)?;
    let zones: Vec<String> = connections.iter().map(|c| c.zone.clone()).collect();
    let offerings = offerings(flags, &zones, &catalog)?;
    check_base_user_data(flags)?;
    let require_zones = (backend == Backend::Libvirt).then_some(zones.as_slice());
    let inventory_config = InventoryConfig {
        provider: &flags.provider,
        catalog: &catalog,
        prices: &prices,
        require_zones,
    };
    let inventory = catalog::build_inventory(&offerings, &inventory_config)?;
    check_roots(&libvirt, &catalog, &inventory)?;
    devices::address_book(flags, &inventory.machines, &mut libvirt)?;
    ignition::setup(flags, &catalog, &inventory.machines, &mut libvirt)?;
    devices::check_secure_boot(&libvirt, &catalog, &inventory.machines)?;
    if backend == Backend::Libvirt {
        check_dedicated(&libvirt, &catalog, &inventory)?;
    }
    let provider = provider_config(flags, &inventory);
    let grpc_addr = listen_addr("--addr", &flags.addr)?
        .ok_or_else(|| flag("--addr must not be empty; the default is :9000"))?;
    Ok(Plan {
        backend,
        provider_label: flags.provider.clone(),
        connections,
        offerings,
        inventory,
        provider,
        grpc_addr,
        metrics_addr: listen_addr("--metrics-addr", &flags.metrics_addr)?,
        state: flags.state.clone(),
        reconcile_interval: (!flags.reconcile_interval.is_zero())
            .then_some(flags.reconcile_interval),
        reflection: flags.reflection,
        tls,
        client_identity,
        fake: FakePolicy {
            fault_hooks: flags.fake_fault_hooks,
            delay_min: flags.fake_delay_min,
            delay_max: flags.fake_delay_max,
            seed: flags.fake_seed,
        },
        catalog,
        libvirt,
    })
}

/// The instance types (`--instance-types`, else the built-in ones) and their prices
/// (`--prices` over the per-vCPU and per-GiB rates).
fn catalog_and_prices(flags: &Flags) -> Result<(InstanceCatalog, PriceTable), LaunchError> {
    let catalog = match &flags.instance_types {
        Some(path) => config::load_instance_types(path)?,
        None => InstanceCatalog::builtin(),
    };
    let classes = match &flags.device_classes {
        Some(path) => config::load_device_classes(path)?,
        None => DeviceClasses::default(),
    };
    let catalog = catalog.with_device_classes(classes)?;
    let overrides = catalog::parse_prices(&flags.prices)?;
    let prices = PriceTable::new(
        overrides,
        flags.price_per_vcpu_hour,
        flags.price_per_gib_hour,
        &catalog,
    )?;
    Ok((catalog, prices))
}

/// `--base-user-data`, when set, must name a readable file.
fn check_base_user_data(flags: &Flags) -> Result<(), LaunchError> {
    if let Some(path) = &flags.base_user_data {
        std::fs::read(path).map_err(|e| {
            flag(format!(
                "--base-user-data {}: cannot read the file: {e}",
                path.display()
            ))
        })?;
    }
    Ok(())
}

/// The provider's settings: Delete offered as the inventory allows, zones required, the
/// deadlines (`--transition-timeout` sets all four).
fn provider_config(flags: &Flags, inventory: &Inventory) -> ProviderConfig {
    let timeouts = flags
        .transition_timeout
        .map_or_else(Timeouts::default, Timeouts::uniform);
    ProviderConfig {
        policy: Policy {
            delete_supported: inventory.delete_supported,
            require_zone: true,
            timeouts,
            operation_prefix: "op".to_owned(),
        },
        seed_timeout: Duration::from_secs(30),
    }
}

/// The fake backend's flags: its hooks only with the fake, a delay range that is one, and a
/// transition timeout above 0.
fn check_fake_flags(flags: &Flags, backend: Backend) -> Result<(), LaunchError> {
    if flags.fake_fault_hooks && backend != Backend::Fake {
        return Err(flag(
            "--fake-fault-hooks only works with the fake backend; remove it or pass --use-fake-backend",
        ));
    }
    if flags.fake_delay_min > flags.fake_delay_max {
        return Err(flag("--fake-delay-min must not exceed --fake-delay-max"));
    }
    if flags.transition_timeout.is_some_and(|t| t.is_zero()) {
        return Err(flag(
            "--transition-timeout must be above 0 (e.g. 2s); omit it for the defaults",
        ));
    }
    Ok(())
}

/// The offerings: `--offerings`' file, or the defaults over `zones`; with the fake's fault
/// hooks, the fault offering too.
fn offerings(
    flags: &Flags,
    zones: &[String],
    catalog: &InstanceCatalog,
) -> Result<Vec<Offering>, LaunchError> {
    let mut offerings = match &flags.offerings {
        Some(path) => config::load_offerings(path)?,
        None => catalog::default_offerings(
            flags.seed_count,
            zones,
            &flags.default_zone,
            &flags.capacity_type,
            catalog,
        ),
    };
    if flags.fake_fault_hooks {
        let capacity = offerings
            .first()
            .map_or(flags.capacity_type.clone(), |o| o.capacity_type.clone());
        offerings.push(catalog::fault_offering(
            catalog,
            zones,
            &flags.default_zone,
            &capacity,
        ));
    }
    Ok(offerings)
}

/// Backend selection: `--use-fake-backend` forces the fake; `auto` (or empty) means libvirt
/// when `--connect` names hosts, else the fake (with a loud warning at start-up).
fn select_backend(flags: &Flags, connections: &[HostConnection]) -> Result<Backend, LaunchError> {
    if flags.use_fake_backend {
        return Ok(Backend::Fake);
    }
    let backend = match flags.libvirt_backend.to_ascii_lowercase().as_str() {
        "" | "auto" if connections.is_empty() => Backend::Fake,
        "" | "auto" | "libvirt" => Backend::Libvirt,
        "fake" => Backend::Fake,
        _ => {
            return Err(flag(format!(
                "--libvirt-backend must be libvirt, fake, or auto (got {:?})",
                flags.libvirt_backend
            )));
        }
    };
    if backend == Backend::Libvirt {
        if connections.is_empty() {
            return Err(flag(
                "--libvirt-backend libvirt needs --connect (a libvirt URI, or zone=uri,...)",
            ));
        }
        if flags.image.trim().is_empty() && flags.image_source.is_none() {
            return Err(flag(
                "--image is required with the libvirt backend: name the golden base-image \
                 volume in --storage-pool that every machine's overlay is backed by, or pass \
                 --image-source FILE to have the provider upload it to every host",
            ));
        }
    }
    Ok(backend)
}

/// The libvirt backend's options; the allocation ratios must be finite and positive, the
/// budgets `1 ≤ --agent-budget ≤ --host-budget`, and `1 ≤ --host-connections ≤
/// --host-budget` when set.
fn domain_config(flags: &Flags) -> Result<DomainConfig, LaunchError> {
    for (name, value) in [
        ("--cpu-allocation-ratio", flags.cpu_allocation_ratio),
        ("--memory-allocation-ratio", flags.memory_allocation_ratio),
        ("--disk-allocation-ratio", flags.disk_allocation_ratio),
    ] {
        if !value.is_finite() || value <= 0.0 {
            return Err(flag(format!(
                "{name} must be a finite number above 0 (got {value}); 1 means no overcommit"
            )));
        }
    }
    let budget = Budget::new(flags.host_budget, flags.agent_budget).map_err(flag)?;
    Ok(DomainConfig {
        image: flags.image.clone(),
        image_source: None,
        storage_pool: flags.storage_pool.clone(),
        seed_pool: flags.seed_pool.trim().to_owned(),
        network: flags.network.trim().to_owned(),
        nics: Vec::new(),
        instance_nics: std::collections::BTreeMap::new(),
        addresses: AddressBook::default(),
        ignition: None,
        cpu: None,
        instance_cpu: std::collections::BTreeMap::new(),
        platform: devices::platform(flags)?,
        base_user_data: flags.base_user_data.clone(),
        capacity: CapacityPolicy {
            reserve_cpu: flags.host_reserve_cpu,
            reserve_memory_mib: flags.host_reserve_memory_mib,
            cpu_ratio: flags.cpu_allocation_ratio,
            memory_ratio: flags.memory_allocation_ratio,
            disk_ratio: flags.disk_allocation_ratio,
            dedicated_cpus: dedicated_cpus(&flags.dedicated_cpus)?,
        },
        gc: GcPolicy {
            collect: flags.gc_orphans,
            grace: flags.orphan_grace,
        },
        budget,
        connections: fit_connections(
            budget,
            flags.host_connections,
            flags.host_max_client_requests,
        )
        .map_err(flag)?,
        max_client_requests: flags.host_max_client_requests,
    })
}

/// `--dedicated-cpus`: a CPU list, or empty for none.
fn dedicated_cpus(text: &str) -> Result<CpuSet, LaunchError> {
    let text = text.trim();
    if text.is_empty() {
        return Ok(CpuSet::default());
    }
    CpuSet::parse(text).map_err(|why| flag(format!("--dedicated-cpus {why}")))
}

/// With `--image-source` the golden image's virtual size is known before any host is
/// dialled: a served type whose root (`disk_gib`) could not hold it is refused now, not at
/// its first Create (without the flag the image is on the hosts, and `doctor` and Create
/// refuse it there, with the same message).
fn check_roots(
    libvirt: &DomainConfig,
    catalog: &InstanceCatalog,
    inventory: &Inventory,
) -> Result<(), LaunchError> {
    let Some(golden) = &libvirt.image_source else {
        return Ok(());
    };
    let served: std::collections::BTreeSet<&str> = (inventory.machines.iter())
        .map(|m| m.instance_type.as_str())
        .collect();
    for name in served {
        if let Some(shape) = catalog.get(name) {
            (shape.disks.root_bytes(name, golden.capacity))
                .map_err(|why| flag(format!("--image-source {}: {why}", golden.path.display())))?;
        }
    }
    Ok(())
}

/// A served type that asks for dedicated CPUs needs `--dedicated-cpus` to name some: refused
/// now rather than at its first Create.
fn check_dedicated(
    libvirt: &DomainConfig,
    catalog: &InstanceCatalog,
    inventory: &Inventory,
) -> Result<(), LaunchError> {
    if !libvirt.capacity.dedicated_cpus.is_empty() {
        return Ok(());
    }
    let dedicated = (inventory.machines.iter())
        .map(|m| m.instance_type.as_str())
        .find(|name| {
            catalog
                .get(name)
                .is_some_and(|t| t.placement.dedicated_cpus)
        });
    match dedicated {
        Some(name) => Err(flag(format!(
            "instance type {name:?} asks for dedicated_cpus, and --dedicated-cpus names no \
             host CPU for them: set it to the CPUs such machines may hold on every host (e.g. \
             --dedicated-cpus 4-15), or drop dedicated_cpus from the type"
        ))),
        None => Ok(()),
    }
}

/// `--image-source`: hashes the file and makes its content-addressed volume the base image.
/// `--image` may be left empty; when set it must name that same volume, so two flags never
/// disagree about which base the machines get.
fn golden_settings(flags: &Flags, libvirt: &mut DomainConfig) -> Result<(), LaunchError> {
    let Some(path) = &flags.image_source else {
        return Ok(());
    };
    let golden = golden::read(path).map_err(flag)?;
    let image = flags.image.trim();
    if !image.is_empty() && image != golden.volume {
        return Err(flag(format!(
            "--image {image:?} contradicts --image-source {}, whose volume is {:?} (named \
             after the file's sha256); leave --image empty, or set it to {:?}",
            path.display(),
            golden.volume,
            golden.volume
        )));
    }
    libvirt.image.clone_from(&golden.volume);
    libvirt.image_source = Some(Arc::new(golden));
    Ok(())
}

/// TLS flags must come whole: cert and key together, a CA only with both.
fn check_tls(flags: &Flags) -> Result<Option<TlsFiles>, LaunchError> {
    match (&flags.tls_cert, &flags.tls_key, &flags.tls_ca) {
        (None, None, None) => Ok(None),
        (None, None, Some(_)) => Err(flag(
            "--tls-ca set without --tls-cert/--tls-key; mTLS needs the server certificate too",
        )),
        (Some(_), None, _) | (None, Some(_), _) => Err(flag(
            "both --tls-cert and --tls-key are required to enable TLS",
        )),
        (Some(cert), Some(key), ca) => Ok(Some(TlsFiles {
            cert: cert.clone(),
            key: key.clone(),
            client_ca: ca.clone(),
        })),
    }
}

/// `--client-identity` only means something under mTLS, where it defaults to `enforce`.
fn check_client_identity(
    flags: &Flags,
    tls: Option<&TlsFiles>,
) -> Result<IdentityMode, LaunchError> {
    let mtls = tls.is_some_and(|files| files.client_ca.is_some());
    // The empty string (an unset environment variable in a chart) is unset too.
    let Some(raw) = flags.client_identity.as_ref().filter(|raw| !raw.is_empty()) else {
        return Ok(if mtls {
            IdentityMode::Enforce
        } else {
            IdentityMode::Off
        });
    };
    let mode = match raw.trim().to_ascii_lowercase().as_str() {
        "enforce" => IdentityMode::Enforce,
        "off" => IdentityMode::Off,
        _ => {
            return Err(flag(format!(
                "--client-identity must be enforce or off (got {raw:?})"
            )));
        }
    };
    if !mtls {
        return Err(flag(
            "--client-identity needs --tls-ca (with --tls-cert and --tls-key): client identities \
             come from verified client certificates; remove --client-identity or add --tls-ca",
        ));
    }
    Ok(mode)
}

/// Parses a listen address: `:9000` (all interfaces), `host:port`, or empty (disabled).
fn listen_addr(name: &str, raw: &str) -> Result<Option<SocketAddr>, LaunchError> {
    let raw = raw.trim();
    if raw.is_empty() {
        return Ok(None);
    }
    let full = if raw.starts_with(':') {
        format!("0.0.0.0{raw}")
    } else {
        raw.to_owned()
    };
    let mut addrs = full.to_socket_addrs().map_err(|e| {
        flag(format!(
            "{name} {raw:?} is not a listen address ({e}); use :PORT or HOST:PORT"
        ))
    })?;
    addrs.next().map(Some).ok_or_else(|| {
        flag(format!(
            "{name} {raw:?} resolves to no address; use :PORT or HOST:PORT"
        ))
    })
}

/// The Speculative inventory a plan would serve.
#[must_use]
pub fn slots(plan: &Plan) -> &[Machine] {
    &plan.inventory.machines
}

/// One slot as the `offerings` dry run prints it.
#[derive(Clone, Debug, serde::Serialize)]
pub struct SlotView {
    pub id: String,
    pub instance_type: String,
    pub zone: String,
    pub capacity_type: &'static str,
    pub price_per_hour: f64,
    pub interruption_probability: f64,
    pub resources: bigfleet_libvirt_domain::StringMap,
    pub allocatable: bigfleet_libvirt_domain::StringMap,
    pub labels: bigfleet_libvirt_domain::StringMap,
}

/// What the `offerings` subcommand prints: the backend, whether Delete is offered, and
/// every Speculative slot.
#[derive(Clone, Debug, serde::Serialize)]
pub struct DryRun {
    pub backend: &'static str,
    pub delete_supported: bool,
    pub slots: Vec<SlotView>,
}

/// The dry-run view of a plan.
#[must_use]
pub fn dry_run(plan: &Plan) -> DryRun {
    let slots = slots(plan)
        .iter()
        .map(|m| SlotView {
            id: m.id.to_string(),
            instance_type: m.instance_type.clone(),
            zone: m.zone.clone(),
            capacity_type: m.capacity_type.token(),
            price_per_hour: m.price_per_hour,
            interruption_probability: m.interruption_probability,
            resources: m.resources.to_map(),
            allocatable: m.allocatable.to_map(),
            labels: m.labels.to_map(),
        })
        .collect();
    DryRun {
        backend: match plan.backend {
            Backend::Fake => "fake",
            Backend::Libvirt => "libvirt",
        },
        delete_supported: plan.inventory.delete_supported,
        slots,
    }
}
