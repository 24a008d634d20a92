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

use bigfleet_libvirt_domain::catalog::DiskShape;
use bigfleet_libvirt_ports::HypervisorError;
use tracing::warn;
use virt::domain::Domain;

use super::SequenceContext;
use crate::host::capacity::Shape;
use crate::host::connection::Host;
use crate::host::domains::{self, ensure_running, owned};
use crate::host::error::{maybe_done, nothing_done, one_line, partly_done, refused, text};
use crate::host::session::{BaseImage, Session};
use crate::render::seed;
use crate::render::spec::{Base, Choices, DomainSpec, Slot, VolumePaths};
use crate::render::xml;
use crate::storage::volumes::{self, overlay_name, seed_name};
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
}

impl CreateSpec {
    fn shape(&self) -> Shape {
        Shape {
            vcpu: u64::from(self.vcpu),
            memory_mib: self.memory_mib,
        }
    }
}

/// What this attempt made, so a rollback removes exactly that.
#[derive(Default)]
struct Made {
    overlay: bool,
    seed: bool,
    /// The data volumes this attempt created, by name.
    data: Vec<String>,
    domain: Option<Domain>,
}

/// Creates (or adopts) the domain and leaves it running.
pub(crate) fn create(
    session: &Session,
    host: &Host,
    settings: &SequenceContext,
    spec: &CreateSpec,
) -> Result<(), HypervisorError> {
    let _alone = host.exclusive(&spec.name);
    if let Some((domain, _)) = owned(session, &spec.name, &settings.provider, &spec.machine_id)? {
        return ensure_running(&domain, &spec.name);
    }
    host.ledger()
        .reserve(&spec.name, spec.shape(), &settings.options.capacity)
        .map_err(|why| {
            refused(format!(
                "zone {:?} has no room for machine {}: {why}",
                host.zone, spec.machine_id
            ))
        })?;
    let mut made = Made::default();
    match build(session, settings, spec, &mut made) {
        Ok(()) => {
            host.ledger().commit(&spec.name);
            Ok(())
        }
        Err(error) => {
            let leftovers = rollback(session, settings, &spec.name, made);
            host.ledger().release(&spec.name);
            if leftovers.is_empty() {
                return Err(error);
            }
            Err(partly_done(format!(
                "{}; rollback incomplete: {}",
                error.message,
                leftovers.join("; ")
            )))
        }
    }
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
    };
    let base = Base {
        path: base.path.clone(),
        format: base.format.clone(),
        overlay_bytes: (spec.disks).root_bytes(&spec.instance_type, base.capacity)?,
    };
    Ok(DomainSpec::new(&choices, &slot, base))
}

fn build(
    session: &Session,
    settings: &SequenceContext,
    spec: &CreateSpec,
    made: &mut Made,
) -> Result<(), HypervisorError> {
    let pool = volumes::pool(session, &settings.options.storage_pool).map_err(nothing_done)?;
    let base =
        volumes::base_image(session, &pool, &settings.options.image).map_err(nothing_done)?;
    let domain_spec = domain_spec(settings, spec, &base).map_err(refused)?;
    let disks = &domain_spec.disks;
    let (overlay, created) =
        volumes::create_or_adopt(&pool, &disks.overlay, &xml::overlay(&domain_spec))
            .map_err(maybe_done)?;
    made.overlay = created;
    let overlay_path = overlay
        .path()
        .map_err(|e| maybe_done(format!("overlay path: {}", text(&e))))?;
    let mut data_paths = Vec::with_capacity(disks.data.len());
    for disk in &disks.data {
        let (volume, created) =
            volumes::create_or_adopt(&pool, &disk.volume, &xml::data_volume(disk))
                .map_err(maybe_done)?;
        if created {
            made.data.push(disk.volume.clone());
        }
        let path = (volume.path())
            .map_err(|e| maybe_done(format!("data disk {} path: {}", disk.serial, text(&e))))?;
        data_paths.push(path);
    }
    let image = seed::build(
        &domain_spec.name,
        &domain_spec.instance_id,
        &domain_spec.user_data,
    )
    .map_err(nothing_done)?;
    let seed_size = u64::try_from(image.len()).unwrap_or(u64::MAX);
    let (seed_volume, created) =
        volumes::create_or_adopt(&pool, &disks.seed, &xml::seed(&domain_spec, seed_size))
            .map_err(maybe_done)?;
    made.seed = created;
    volumes::upload(session, &seed_volume, &image)
        .map_err(|e| maybe_done(format!("upload the cloud-init seed: {e}")))?;
    let seed_path = seed_volume
        .path()
        .map_err(|e| maybe_done(format!("seed path: {}", text(&e))))?;
    let paths = VolumePaths {
        overlay: &overlay_path,
        seed: &seed_path,
        data: &data_paths,
    };
    let document = xml::domain(&domain_spec, paths);
    let watch = Stopwatch::start();
    let domain = session.conn.define_domain_xml(&document).map_err(|e| {
        maybe_done(format!(
            "define domain {}: {}",
            spec.name,
            one_line(&text(&e), 700)
        ))
    })?;
    settings.metrics.observe_phase("define", watch.seconds());
    made.domain = Some(domain.clone());
    let watch = Stopwatch::start();
    domains::start(&domain, &spec.name)?;
    settings.metrics.observe_phase("start", watch.seconds());
    if let Err(e) = domain.set_autostart(true) {
        warn!(domain = %spec.name, error = %text(&e), "set domain autostart");
    }
    Ok(())
}

/// Removes what `made` records; returns what could not be removed.
fn rollback(session: &Session, settings: &SequenceContext, name: &str, made: Made) -> Vec<String> {
    let mut leftovers = Vec::new();
    if let Some(domain) = made.domain {
        if let Err(e) = domains::remove(&domain, name) {
            leftovers.push(e.message);
        }
    }
    let mut created = made.data;
    created.extend(made.seed.then(|| seed_name(name)));
    created.extend(made.overlay.then(|| overlay_name(name)));
    if !created.is_empty() {
        match volumes::pool(session, &settings.options.storage_pool) {
            Ok(pool) => {
                for volume in &created {
                    if let Err(e) = volumes::delete(&pool, volume) {
                        leftovers.push(e);
                    }
                }
            }
            Err(e) => leftovers.push(e),
        }
    }
    leftovers
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
    volumes::delete_domain_volumes(session, &settings.options.storage_pool, name, data).map_err(
        |e| {
            partly_done(format!(
                "domain {name} is gone but its volumes were not all deleted: {e}"
            ))
        },
    )
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
    ensure_running(&domain, name)
}
