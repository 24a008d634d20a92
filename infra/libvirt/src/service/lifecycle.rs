//! Create and Delete as blocking sequences on one host connection.
//!
//! Each sequence runs start to finish on one blocking thread (see `host::connection`), so a
//! deadline that drops the caller's future never interrupts it between "define" and "roll back":
//! the host is left either with the finished machine or with nothing this attempt made.
//!
//! Create is idempotent by name: the name derives from the provider label and the machine id, so a
//! retry (any operation id, any process of the same label) finds the domain an earlier attempt
//! defined, proves ownership through its tag, and adopts it instead of defining a second one.
//! Within one process, sequences for the same name never overlap ([`Host::exclusive`]): a retry
//! issued while an abandoned attempt still runs waits for it, rather than finding nothing yet and
//! failing on "domain already exists". Only a new domain is charged against host capacity, and a
//! Create that cannot fit fails before anything is made.

use std::collections::BTreeMap;

use bigfleet_libvirt_domain::catalog::{BootMode, DiskShape, Placement};
use bigfleet_libvirt_ports::HypervisorError;
use bigfleet_libvirt_ports::steps;
use tracing::warn;
use virt::domain::Domain;
use virt::storage_pool::StoragePool;
use virt::storage_vol::StorageVol;

use super::SequenceContext;
use crate::drift::describe;
use crate::host::capacity::Shape;
use crate::host::claims::{Ask, needs};
use crate::host::connection::Host;
use crate::host::domains::{self, ensure_running, owned};
use crate::host::error::{maybe_done, nothing_done, one_line, partly_done, refused, text};
use crate::host::session::{BaseImage, Session};
use crate::render::rbd::PoolKind;
use crate::render::seed;
use crate::render::spec::{Base, Choices, DomainSpec, Slot, VolumePaths};
use crate::render::xml;
use crate::storage::{console, volumes};
use bigfleet_libvirt_system::Stopwatch;

/// What one Create asks for.
#[derive(Clone, Debug)]
pub(crate) struct CreateSpec {
    pub(crate) name: String,
    pub(crate) machine_id: String,
    pub(crate) instance_type: String,
    /// The Create's operation id: this incarnation of the slot, for cloud-init's
    /// instance-id.
    pub(crate) operation_id: String,
    pub(crate) vcpu: u32,
    pub(crate) memory_mib: u64,
    /// The instance type's root size and data disks.
    pub(crate) disks: DiskShape,
    /// The instance type's huge pages and dedicated CPUs.
    pub(crate) placement: Placement,
    /// The instance type's passthrough devices: a count per class.
    pub(crate) devices: BTreeMap<String, u32>,
    /// Whether the instance type has a virtual TPM.
    pub(crate) tpm: bool,
    /// Whether the instance type boots with UEFI Secure Boot.
    pub(crate) secure_boot: bool,
    /// How the guest gets its node configuration: at first boot (`boot: nocloud` or
    /// `ignition`) the domain is defined and left off, and Configure starts it
    /// ([`first_boot`]); an Ignition type's config volume is made with the domain.
    pub(crate) boot: BootMode,
}

/// Creates (or adopts) the domain and leaves it running (a first-boot type's: defined and
/// off, for Configure to start). What it needs is read first (the pool, the base image, the
/// seed image; nothing is made), then its vCPUs, memory and disks are reserved on the host,
/// then its steps run.
pub(crate) fn create(
    session: &Session,
    host: &Host,
    settings: &SequenceContext,
    spec: &CreateSpec,
) -> Result<(), HypervisorError> {
    let _alone = host.exclusive(&spec.name);
    if let Some((domain, _)) = owned(session, &spec.name, &settings.provider, &spec.machine_id)? {
        if spec.boot.first_boot() {
            return Ok(());
        }
        return power_on_explained(session, settings, &domain, &spec.name, &spec.machine_id);
    }
    let (mut on_host, mut plan) = prepare(session, settings, spec)?;
    if spec.boot.first_boot() {
        plan.retain(|step| *step != steps::Step::Start);
    }
    let disks = &on_host.spec.disks;
    let disk_bytes = (disks.data.iter()).fold(disks.base.overlay_bytes, |sum, d| {
        sum.saturating_add(d.bytes)
    });
    let (shape, ask) = needs(
        spec.vcpu,
        spec.memory_mib,
        spec.placement,
        &spec.devices,
        disk_bytes,
    );
    let policy = &settings.options.capacity;
    if (ask != Ask::default() || !policy.dedicated_cpus.is_empty())
        && !host.ledger().claims().scanned()
    {
        read_books(session, host, settings)?;
    }
    on_host.claim = Some(Claiming {
        host,
        shape,
        ask,
        machine: spec.machine_id.to_string(),
    });
    run(session, &mut on_host, &plan)?;
    host.ledger().commit(&spec.name);
    Ok(())
}

/// Reads what the host's domains hold alone into its books, for a Create that came before
/// the host's first describe (right after a restart): without it the books know none of
/// the domains an earlier process made, and would give their CPUs and devices again.
fn read_books(
    session: &Session,
    host: &Host,
    settings: &SequenceContext,
) -> Result<(), HypervisorError> {
    let ticket = host.ledger().begin_scan();
    let scan = describe::scan(
        session,
        &[],
        &settings.provider,
        (true, settings.passes_through),
    )?;
    let dedicated = &settings.options.capacity.dedicated_cpus;
    if let (Some((topology, free)), Some((claims, running))) =
        (&scan.topology, scan.claims(&settings.provider, dedicated))
    {
        let mut ledger = host.ledger();
        (ledger.claims_mut()).set_topology(topology.clone(), &settings.classes);
        ledger.refresh_claims(ticket, claims, (free, &running));
    }
    Ok(())
}

/// The domain `spec` asks for, on a host whose base image is `base`: the one place a
/// Create's [`DomainSpec`] is built. Refused when the type's root is smaller than the base.
fn domain_spec(
    settings: &SequenceContext,
    spec: &CreateSpec,
    base: &BaseImage,
) -> Result<DomainSpec, String> {
    let choices = Choices {
        provider: &settings.provider,
        options: &settings.options,
        macs: &settings.macs,
        user_data: &settings.user_data,
    };
    let slot = Slot {
        machine_id: &spec.machine_id,
        instance_type: &spec.instance_type,
        operation_id: &spec.operation_id,
        vcpu: spec.vcpu,
        memory_mib: spec.memory_mib,
        disks: &spec.disks,
        tpm: spec.tpm,
        secure_boot: spec.secure_boot,
        ignition: spec.boot == BootMode::Ignition,
    };
    let base = Base {
        path: base.path.clone(),
        format: base.format.clone(),
        overlay_bytes: (spec.disks).root_bytes(&spec.instance_type, base.capacity)?,
        rbd: base.rbd.clone(),
    };
    Ok(DomainSpec::new(&choices, &slot, base))
}

/// Reads what the steps need (the pools, the base image, the seed image) and plans them.
fn prepare<'a>(
    session: &'a Session,
    settings: &'a SequenceContext,
    spec: &CreateSpec,
) -> Result<(OnHost<'a>, Vec<steps::Step>), HypervisorError> {
    let options = &settings.options;
    let pool = volumes::pool(session, &options.storage_pool).map_err(nothing_done)?;
    let base = volumes::base_image(session, &pool, &options.image).map_err(nothing_done)?;
    let seed_pool = if options.seed_pool() == options.storage_pool && base.rbd.is_none() {
        pool.clone()
    } else {
        seed_pool(session, options.seed_pool())?
    };
    let domain_spec = domain_spec(settings, spec, &base).map_err(refused)?;
    let network_config = (domain_spec.address.as_ref())
        .map(|address| seed::network_config(&domain_spec.nics, address));
    let seed_image = seed::build(
        &domain_spec.name,
        &domain_spec.instance_id,
        &domain_spec.user_data,
        network_config.as_deref(),
    )
    .map_err(nothing_done)?;
    let has_ignition = domain_spec.disks.ignition.is_some();
    let ignition_image = seed::ignition_image(&settings.options, &domain_spec.name, has_ignition)
        .map_err(nothing_done)?;
    let disks = &domain_spec.disks;
    let mut made = vec![disks.overlay.clone()];
    made.extend(disks.data.iter().map(|d| d.volume.clone()));
    made.push(disks.seed.clone());
    made.push(disks.console.clone());
    let mut filled = vec![disks.seed.clone()];
    if let Some(ignition) = &disks.ignition {
        made.push(ignition.volume.clone());
        filled.push(ignition.volume.clone());
    }
    let plan = steps::create_steps(&made, &filled);
    let on_host = OnHost {
        session,
        settings,
        pool,
        seed_pool,
        spec: domain_spec,
        seed_image,
        ignition_image,
        volumes: BTreeMap::new(),
        domain: None,
        claim: None,
    };
    Ok((on_host, plan))
}

/// `--seed-pool`, which must be a local pool (the seed is a file QEMU reads): refused
/// before anything is made when it is an rbd pool (with `--storage-pool` an rbd pool and no
/// `--seed-pool`, that is the storage pool itself).
fn seed_pool(session: &Session, name: &str) -> Result<StoragePool, HypervisorError> {
    let pool = volumes::pool(session, name).map_err(nothing_done)?;
    match volumes::pool_kind(&pool, name).map_err(nothing_done)? {
        PoolKind::Local(_) => Ok(pool),
        PoolKind::Rbd(_) => Err(refused(format!(
            "the cloud-init seed needs a local pool, and {name:?} is an rbd pool: name a dir \
             pool on every host with --seed-pool (docs/libvirt.md, Ceph RBD)"
        ))),
    }
}

/// Runs the Create's steps ([`steps::run`]), which roll back what this attempt made on a
/// failure.
fn run(
    session: &Session,
    on_host: &mut OnHost<'_>,
    plan: &[steps::Step],
) -> Result<(), HypervisorError> {
    steps::run(on_host, plan).map_err(|failed| {
        if plan.get(failed.step) == Some(&steps::Step::Claim) {
            return failed.error; // the host's refusal, as it was
        }
        if failed.leftovers.is_empty() {
            return undone(session, failed.error);
        }
        let leftovers: Vec<String> = failed.leftovers.into_iter().map(|e| e.message).collect();
        partly_done(format!(
            "{}; rollback incomplete: {}",
            failed.error.message,
            leftovers.join("; ")
        ))
    })
}

/// A failed step after a complete rollback. libvirt's calls answer an error only when they
/// did not act (a volume, a definition or a start that failed is not left behind), and a call
/// whose answer was lost leaves the connection dead; so while the connection is alive the
/// host holds nothing this attempt made and the Create is known to have done nothing. A dead
/// connection keeps the step's own classification (its effect may be unknown).
fn undone(session: &Session, error: HypervisorError) -> HypervisorError {
    if session.conn.is_alive() == Ok(true) {
        nothing_done(error.message)
    } else {
        error
    }
}

/// One Create's steps on a libvirt host: the volumes it made or adopted, by name, and the
/// domain once defined.
struct OnHost<'a> {
    session: &'a Session,
    settings: &'a SequenceContext,
    pool: StoragePool,
    seed_pool: StoragePool,
    spec: DomainSpec,
    seed_image: Vec<u8>,
    /// The Ignition config volume's bytes (an Ignition type's).
    ignition_image: Vec<u8>,
    volumes: BTreeMap<String, StorageVol>,
    domain: Option<Domain>,
    /// What the Create claims on the host, and whose it is (`None`: nothing to claim).
    claim: Option<Claiming<'a>>,
}

/// What one Create claims in its host's books: its share of the budget and what it holds
/// alone, for machine `machine`.
struct Claiming<'a> {
    host: &'a Host,
    shape: Shape,
    ask: Ask,
    machine: String,
}

impl OnHost<'_> {
    /// Whether `name` is the domain's Ignition config volume.
    fn is_ignition(&self, name: &str) -> bool {
        (self.spec.disks.ignition.as_ref()).is_some_and(|i| i.volume == name)
    }

    /// The path libvirt gave volume `name` (made by an earlier step).
    fn path(&self, name: &str) -> Result<String, HypervisorError> {
        let volume = (self.volumes.get(name))
            .ok_or_else(|| nothing_done(format!("volume {name} was not made")))?;
        (volume.path()).map_err(|e| maybe_done(format!("volume {name} path: {}", text(&e))))
    }
}

impl OnHost<'_> {
    /// The root on an rbd pool: a copy-on-write clone of the golden image (libvirt clones
    /// within the pool through a protected snapshot of the image), grown to the type's root
    /// size. An existing clone of that name is adopted; one made here and not grown is
    /// deleted before the error is returned, so a failed step leaves nothing.
    fn clone_root(&self) -> Result<(StorageVol, bool), HypervisorError> {
        let (spec, options) = (&self.spec, &self.settings.options);
        let name = spec.disks.overlay.as_str();
        let golden = (self.pool.lookup_storage_vol_by_name(&options.image)).map_err(|e| {
            nothing_done(format!(
                "look up the golden image {:?} (--image): {}",
                options.image,
                text(&e)
            ))
        })?;
        let document = xml::overlay(spec);
        let (volume, created) =
            volumes::clone_or_adopt(&self.pool, name, &document, &golden).map_err(maybe_done)?;
        let wanted = spec.disks.base.overlay_bytes;
        let grown = (volume.info()).map_err(|e| text(&e)).and_then(|info| {
            if info.capacity >= wanted {
                return Ok(());
            }
            volume.resize(wanted, 0).map_err(|e| text(&e))
        });
        match grown {
            Ok(()) => Ok((volume, created)),
            Err(e) => {
                let cleanup = if created {
                    match volume.delete(0) {
                        Ok(()) => "; the clone was deleted".to_owned(),
                        Err(d) => format!("; deleting the clone failed too: {}", text(&d)),
                    }
                } else {
                    String::new()
                };
                Err(maybe_done(format!(
                    "grow the root {name} to {wanted} bytes: {e}{cleanup}"
                )))
            }
        }
    }
}

impl steps::Substrate for OnHost<'_> {
    type Error = HypervisorError;

    fn claim(&mut self) -> Result<(), HypervisorError> {
        let Some(claiming) = &self.claim else {
            return Ok(());
        };
        let (host, policy) = (claiming.host, &self.settings.options.capacity);
        let name = &self.spec.name;
        let placed = (host.ledger())
            .reserve(name, claiming.shape, &claiming.ask, policy)
            .map_err(|why| {
                refused(format!(
                    "zone {:?} has no room for machine {}: {why}",
                    host.zone, claiming.machine
                ))
            })?;
        self.spec.placed = placed;
        Ok(())
    }

    fn release(&mut self) {
        if let Some(claiming) = &self.claim {
            claiming.host.ledger().release(&self.spec.name);
        }
    }

    fn keep(&mut self) {
        if let Some(claiming) = &self.claim {
            claiming.host.ledger().commit(&self.spec.name);
        }
    }

    fn volume(&mut self, name: &str) -> Result<bool, HypervisorError> {
        let disks = &self.spec.disks;
        let (volume, created) = if name == disks.overlay && disks.base.rbd.is_some() {
            self.clone_root()?
        } else if name == disks.overlay {
            volumes::create_or_adopt(&self.pool, name, &xml::overlay(&self.spec))
                .map_err(maybe_done)?
        } else if name == disks.seed {
            let bytes = u64::try_from(self.seed_image.len()).unwrap_or(u64::MAX);
            volumes::create_or_adopt(&self.seed_pool, name, &xml::seed(&self.spec, bytes))
                .map_err(maybe_done)?
        } else if name == disks.console {
            volumes::create_or_adopt(&self.seed_pool, name, &xml::console(&self.spec))
                .map_err(maybe_done)?
        } else if self.is_ignition(name) {
            let bytes = u64::try_from(self.ignition_image.len()).unwrap_or(u64::MAX);
            volumes::create_or_adopt(&self.seed_pool, name, &xml::seed_volume(name, bytes))
                .map_err(maybe_done)?
        } else {
            let disk = (disks.data.iter().find(|d| d.volume == name))
                .ok_or_else(|| nothing_done(format!("no volume {name} in the spec")))?;
            let document = xml::data_volume_of(&self.spec, disk);
            volumes::create_or_adopt(&self.pool, name, &document).map_err(maybe_done)?
        };
        self.volumes.insert(name.to_owned(), volume);
        Ok(created)
    }

    fn fill(&mut self, name: &str) -> Result<(), HypervisorError> {
        let volume = (self.volumes.get(name))
            .ok_or_else(|| nothing_done(format!("volume {name} was not made")))?;
        let (bytes, what) = if self.is_ignition(name) {
            (&self.ignition_image, "the Ignition config")
        } else {
            (&self.seed_image, "the cloud-init seed")
        };
        volumes::upload(self.session, volume, bytes)
            .map_err(|e| maybe_done(format!("upload {what}: {e}")))
    }

    fn define(&mut self) -> Result<(), HypervisorError> {
        let disks = &self.spec.disks;
        let overlay = self.path(&disks.overlay)?;
        let seed = self.path(&disks.seed)?;
        let console = self.path(&disks.console)?;
        let data = (disks.data.iter())
            .map(|d| self.path(&d.volume))
            .collect::<Result<Vec<_>, _>>()?;
        let ignition = (disks.ignition.as_ref())
            .map(|i| self.path(&i.volume))
            .transpose()?;
        let paths = VolumePaths {
            overlay: &overlay,
            seed: &seed,
            console: Some(&console),
            data: &data,
            ignition: ignition.as_deref(),
        };
        let document = xml::domain(&self.spec, paths);
        let watch = Stopwatch::start();
        let domain = self
            .session
            .conn
            .define_domain_xml(&document)
            .map_err(|e| {
                maybe_done(format!(
                    "define domain {}: {}",
                    self.spec.name,
                    one_line(&text(&e), 700)
                ))
            })?;
        self.settings
            .metrics
            .observe_phase("define", watch.seconds());
        self.domain = Some(domain);
        Ok(())
    }

    fn start(&mut self) -> Result<(), HypervisorError> {
        let name = &self.spec.name;
        let domain = (self.domain.as_ref())
            .ok_or_else(|| nothing_done(format!("domain {name} was not defined")))?;
        let watch = Stopwatch::start();
        if let Err(mut e) = domains::start(domain, name) {
            domains::name_devices(&mut e.message, &self.spec.placed.devices);
            let (machine, timeline) = (&self.spec.tag.machine_id, &self.settings.metrics.timeline);
            console::explain(&mut e.message, self.session, domain, machine, timeline);
            return Err(e);
        }
        self.settings
            .metrics
            .observe_phase("start", watch.seconds());
        if let Err(e) = domain.set_autostart(true) {
            warn!(domain = %name, error = %text(&e), "set domain autostart");
        }
        Ok(())
    }

    fn undefine(&mut self) -> Result<(), HypervisorError> {
        match self.domain.take() {
            Some(domain) => domains::remove(&domain, &self.spec.name),
            None => Ok(()),
        }
    }

    fn delete_volume(&mut self, name: &str) -> Result<(), HypervisorError> {
        self.volumes.remove(name);
        let disks = &self.spec.disks;
        let pool = if name == disks.seed || name == disks.console || self.is_ignition(name) {
            &self.seed_pool
        } else {
            &self.pool
        };
        volumes::delete(pool, name).map(|_| ()).map_err(partly_done)
    }
}

/// Replaces the root of `spec`'s stopped domain with a fresh one made from the golden image
/// (an Ignition machine's Drain: its next start is a first boot again). Repeatable: a
/// missing root is made.
pub(crate) fn renew_root(
    session: &Session,
    settings: &SequenceContext,
    spec: &CreateSpec,
) -> Result<(), HypervisorError> {
    let (mut on_host, _) = prepare(session, settings, spec)?;
    let root = on_host.spec.disks.overlay.clone();
    steps::Substrate::delete_volume(&mut on_host, &root)?;
    steps::Substrate::volume(&mut on_host, &root).map(|_| ())
}

/// Destroys and undefines the domain if it is ours, then deletes its volumes: the overlay,
/// the seed, the data disks its type has now (`data`) and any other volume of ours its
/// definition names (a data disk of a type since changed). A domain that is already gone
/// counts as deleted and its volumes are still cleaned; a domain of that name owned by
/// someone else is refused and nothing is touched.
pub(crate) fn delete(
    session: &Session,
    host: &Host,
    settings: &SequenceContext,
    name: &str,
    machine_id: &str,
    mut data: Vec<String>,
) -> Result<(), HypervisorError> {
    let _alone = host.exclusive(name);
    if let Some((domain, _)) = owned(session, name, &settings.provider, machine_id)? {
        match domain.xml_desc(0) {
            Ok(document) => data.extend(xml::owned_volumes(&document, name)),
            Err(e) => warn!(domain = name, error = %text(&e), "read the domain's disks"),
        }
        domains::remove(&domain, name)?;
    }
    host.ledger().forget(name);
    let pools = volumes::Pools::of(&settings.options);
    volumes::delete_domain_volumes(session, pools, name, data).map_err(|e| {
        partly_done(format!(
            "domain {name} is gone but its volumes were not all deleted: {e}"
        ))
    })
}

/// Rewrites the ownership tag of a domain we own (after Configure or Drain).
pub(crate) fn retag(
    session: &Session,
    settings: &SequenceContext,
    name: &str,
    machine_id: &str,
    cluster_id: &str,
) -> Result<(), HypervisorError> {
    let (domain, mut tag) = owned(session, name, &settings.provider, machine_id)?
        .ok_or_else(|| nothing_done(format!("domain {name} vanished")))?;
    tag.cluster_id = cluster_id.to_owned();
    domains::write_tag(&domain, &tag).map_err(maybe_done)
}

/// Looks the domain up, proves ownership and powers it on (Configure and Drain start here).
pub(crate) fn power_on(
    session: &Session,
    settings: &SequenceContext,
    name: &str,
    machine_id: &str,
) -> Result<(), HypervisorError> {
    let (domain, _) = owned(session, name, &settings.provider, machine_id)?.ok_or_else(|| {
        nothing_done(format!(
            "domain {name} does not exist (removed outside the provider?); delete and \
             re-create the machine"
        ))
    })?;
    power_on_explained(session, settings, &domain, name, machine_id)
}

/// [`ensure_running`], and when the domain will not start, the last lines of its console
/// after the reason (and on its timeline).
fn power_on_explained(
    session: &Session,
    settings: &SequenceContext,
    domain: &Domain,
    name: &str,
    machine_id: &str,
) -> Result<(), HypervisorError> {
    ensure_running(domain, name).map_err(|mut e| {
        let timeline = &settings.metrics.timeline;
        console::explain(&mut e.message, session, domain, machine_id, timeline);
        e
    })
}
