//! Machines whose guest takes its node configuration at first boot (an instance type's
//! `"boot": "nocloud"` or `"ignition"`, docs/libvirt.md §5.14): Create defines the domain
//! and leaves it off (`lifecycle::create`); Configure writes the join blob into the guest's
//! configuration (the NoCloud seed's user-data, or the Ignition config the template and the
//! blob make) and starts the domain ([`configure`]); Drain, after the guest's drain hook (or,
//! when the guest's agent forbids `guest-exec`, after asking the guest to shut down,
//! [`LibvirtHypervisor::shut_down`]), stops the domain and writes the configuration back
//! without the blob ([`rest`]); Delete removes it with the other volumes.
//!
//! An Ignition config delivered as QEMU's firmware configuration entry is read by QEMU when
//! the domain starts, so Configure writes the blob out of the file again right after the
//! start (and a replayed Configure that finds the domain running does it too, in case the
//! first attempt stopped in between): the blob is on the host only while QEMU starts.
//!
//! The seed is written only while the domain is off: a replayed Configure that finds its
//! domain running leaves it alone (the guest has read its configuration already), and one
//! that finds it off (the earlier attempt stopped before the start) writes the same seed
//! again. Each write gets the instance-id of the operation that made it, so cloud-init in a
//! drained and re-configured machine runs the new user-data.

use std::sync::Arc;
use std::time::Duration;

use bigfleet_libvirt_domain::catalog::BootMode;
use bigfleet_libvirt_domain::{Machine, OperationId, Timestamp};
use bigfleet_libvirt_ports::{Clock, HypervisorError};
use virt::domain::Domain;

use super::hypervisor::prefixed;
use super::lifecycle::{self, CreateSpec};
use super::{LibvirtHypervisor, SequenceContext};
use crate::guest::bootstrap::DomainAgent;
use crate::host::connection::Host;
use crate::host::domains::{self, ensure_running, owned};
use crate::host::error::{maybe_done, nothing_done, text};
use crate::host::lanes::Lane;
use crate::host::session::Session;
use crate::options::IgnitionDelivery;
use crate::render::ownership::Tag;
use crate::render::{seed, spec, xml};
use crate::storage::{console, volumes};

impl<C: Clock> LibvirtHypervisor<C> {
    /// Whether `machine`'s type takes its configuration at first boot (`boot: nocloud` or
    /// `ignition`).
    pub(super) fn boots_first(&self, machine: &Machine) -> bool {
        self.inner
            .config
            .catalog
            .boots_first(&machine.instance_type)
    }

    /// A first-boot machine's host step ([`first_boot`]): Configure's (`blob`: write it into
    /// the guest's configuration and start the domain) or Drain's (`None`: stop the domain,
    /// renew an Ignition machine's root, and write the configuration back without it).
    pub(super) async fn first_boot(
        &self,
        what: &str,
        lane: Lane,
        machine: &Machine,
        operation_id: &OperationId,
        blob: Option<Vec<u8>>,
    ) -> Result<Arc<Host>, HypervisorError> {
        let (host, name) = self.target(machine)?;
        let settings = Arc::clone(&self.inner.settings);
        let catalog = &self.inner.config.catalog;
        let boot = (catalog.get(&machine.instance_type)).map_or(BootMode::Agent, |t| t.boot);
        let renew = (blob.is_none() && boot == BootMode::Ignition)
            .then(|| self.create_spec(machine, operation_id.as_str()))
            .transpose()?;
        let (id, kind) = (machine.id.to_string(), machine.instance_type.clone());
        let operation = operation_id.to_string();
        host.call(lane, move |s| {
            let target = Target {
                name: &name,
                machine_id: &id,
                instance_type: &kind,
                operation_id: &operation,
                boot,
            };
            match &blob {
                Some(blob) => configure(s, &settings, &target, blob),
                None => rest(s, &settings, &target, renew.as_ref()),
            }
        })
        .await
        .map_err(|e| prefixed(what, e))?;
        Ok(host)
    }

    /// A first-boot machine's Drain when its guest's agent forbids `guest-exec` (Talos):
    /// asks the guest to shut down (the ACPI power button, which such node OSes answer by
    /// leaving their cluster and powering off) and waits for it to stop, up to the Drain's
    /// `grace_seconds` and `until`. A guest still running then is stopped by [`rest`].
    ///
    /// # Errors
    /// The domain could not be asked (gone, not ours: the host's message).
    pub(super) async fn shut_down(
        &self,
        agent: &DomainAgent,
        grace_seconds: i64,
        until: Timestamp,
    ) -> Result<(), HypervisorError> {
        let clock = &self.inner.clock;
        let grace = Duration::from_secs(u64::try_from(grace_seconds.max(1)).unwrap_or(1));
        let stop_by = clock.now().saturating_add(grace).min(until);
        let name = agent.name.clone();
        let active = move |s: &Session, shut: bool| {
            let domain = (s.conn.lookup_domain_by_name(&name)).map_err(|e| maybe_done(text(&e)))?;
            let active = domain.is_active().map_err(|e| maybe_done(text(&e)))?;
            if active && shut {
                domain
                    .shutdown()
                    .map_err(|e| maybe_done(format!("shut down domain {name}: {}", text(&e))))?;
            }
            Ok(active)
        };
        let ask = active.clone();
        let mut running = (agent.host.call(Lane::Teardown, move |s| ask(s, true)).await)
            .map_err(|e| prefixed("drain", e))?;
        while running && clock.now() < stop_by {
            let next = clock.now().saturating_add(SHUTDOWN_POLL).min(stop_by);
            clock.sleep_until(next).await;
            let poll = active.clone();
            running = (agent.host.call(Lane::Read, move |s| poll(s, false)).await)
                .map_err(|e| prefixed("drain", e))?;
        }
        tracing::info!(
            domain = %agent.name,
            stopped = !running,
            "drain: the guest's agent runs no hook; asked the guest to shut down"
        );
        Ok(())
    }
}

/// How often a shutting-down guest is looked at.
const SHUTDOWN_POLL: Duration = Duration::from_secs(1);

/// The machine a first-boot step acts on.
pub(crate) struct Target<'a> {
    /// Its domain's name.
    pub(crate) name: &'a str,
    /// Its machine id.
    pub(crate) machine_id: &'a str,
    /// Its instance type.
    pub(crate) instance_type: &'a str,
    /// The operation writing the seed (its instance-id).
    pub(crate) operation_id: &'a str,
    /// How its type boots (`nocloud` or `ignition`).
    pub(crate) boot: BootMode,
}

/// Configure's part on the host: unless the domain already runs, writes the seed with
/// `blob` as its user-data and starts the domain (autostarted from then on). The blob is a
/// secret: it goes into the seed volume only, never into a message.
///
/// # Errors
/// The domain is missing or not ours, the seed could not be written, or the start failed
/// (with the console's last lines).
pub(crate) fn configure(
    session: &Session,
    settings: &SequenceContext,
    target: &Target<'_>,
    blob: &[u8],
) -> Result<(), HypervisorError> {
    let (domain, _) = ours(session, settings, target)?;
    if domain.is_active().map_err(|e| maybe_done(text(&e)))? {
        return scrub_fw_cfg(session, settings, target);
    }
    write_configuration(session, settings, target, Some(blob))?;
    ensure_running(&domain, target.name).map_err(|mut e| {
        let timeline = &settings.metrics.timeline;
        console::explain(
            &mut e.message,
            session,
            &domain,
            target.machine_id,
            timeline,
        );
        e
    })?;
    if let Err(e) = domain.set_autostart(true) {
        tracing::warn!(domain = %target.name, error = %text(&e), "set domain autostart");
    }
    scrub_fw_cfg(session, settings, target)
}

/// For an Ignition config QEMU read from a file at the domain's start: writes the file
/// again without the join blob (nothing else needs it: QEMU keeps what it read).
fn scrub_fw_cfg(
    session: &Session,
    settings: &SequenceContext,
    target: &Target<'_>,
) -> Result<(), HypervisorError> {
    let fw_cfg = (settings.options.ignition.as_ref())
        .is_some_and(|setup| setup.delivery == IgnitionDelivery::FwCfg);
    if target.boot == BootMode::Ignition && fw_cfg {
        write_configuration(session, settings, target, None)?;
    }
    Ok(())
}

/// Drain's part on the host, after the guest's drain hook: unbinds the domain from its
/// cluster (first, so that the drift watch sees a resting domain, not a stopped one), stops
/// it and writes the configuration back without the blob, so no copy of the join blob stays
/// on the host and the next Configure starts the machine with its own. An Ignition machine
/// (`renew`: what its Create asked for) also gets a fresh root from the golden image, as
/// Ignition runs only at a first boot.
///
/// # Errors
/// The domain is missing or not ours, would not stop, or the seed could not be written.
pub(crate) fn rest(
    session: &Session,
    settings: &SequenceContext,
    target: &Target<'_>,
    renew: Option<&CreateSpec>,
) -> Result<(), HypervisorError> {
    let (domain, mut tag) = ours(session, settings, target)?;
    tag.cluster_id.clear();
    domains::write_tag(&domain, &tag).map_err(maybe_done)?;
    if let Err(e) = domain.set_autostart(false) {
        tracing::warn!(domain = %target.name, error = %text(&e), "clear domain autostart");
    }
    if domain.is_active().map_err(|e| maybe_done(text(&e)))? {
        domain
            .destroy()
            .map_err(|e| maybe_done(format!("stop domain {}: {}", target.name, text(&e))))?;
    }
    if let Some(spec) = renew {
        lifecycle::renew_root(session, settings, spec)?;
    }
    write_configuration(session, settings, target, None)
}

/// The domain of `target`, proven ours, and its ownership tag.
fn ours(
    session: &Session,
    settings: &SequenceContext,
    target: &Target<'_>,
) -> Result<(Domain, Tag), HypervisorError> {
    let found = owned(session, target.name, &settings.provider, target.machine_id)?;
    found.ok_or_else(|| {
        nothing_done(format!(
            "domain {} does not exist (removed outside the provider?); delete and re-create \
             the machine",
            target.name
        ))
    })
}

/// Writes the guest's configuration with the join `blob` (`None`: without one): the
/// Ignition config of an Ignition type, the seed's user-data (the base user-data without a
/// blob) of a NoCloud type.
fn write_configuration(
    session: &Session,
    settings: &SequenceContext,
    target: &Target<'_>,
    blob: Option<&[u8]>,
) -> Result<(), HypervisorError> {
    if target.boot != BootMode::Ignition {
        return write_seed(
            session,
            settings,
            target,
            blob.unwrap_or(&settings.user_data),
        );
    }
    let bytes = seed::ignition_bytes(&settings.options, target.name, blob).map_err(nothing_done)?;
    let name = spec::ignition_name(target.name);
    replace_volume(session, settings, &name, &bytes, "the Ignition config")
}

/// Replaces the domain's seed volume (the domain is off) with a seed whose user-data is
/// `user_data`, at its new size.
fn write_seed(
    session: &Session,
    settings: &SequenceContext,
    target: &Target<'_>,
    user_data: &[u8],
) -> Result<(), HypervisorError> {
    let options = &settings.options;
    let instance_id = seed::instance_id(target.name, target.operation_id);
    let network = (options.addresses.get(target.machine_id)).map(|address| {
        let macs = &settings.macs;
        let nics = spec::nics(options, macs, target.machine_id, target.instance_type);
        seed::network_config(&nics, address)
    });
    let image = seed::build(target.name, &instance_id, user_data, network.as_deref())
        .map_err(nothing_done)?;
    let name = spec::seed_name(target.name);
    replace_volume(session, settings, &name, &image, "the seed")
}

/// Replaces volume `name` of the seed pool with one holding `bytes` (`what` names it in
/// errors).
fn replace_volume(
    session: &Session,
    settings: &SequenceContext,
    name: &str,
    bytes: &[u8],
    what: &str,
) -> Result<(), HypervisorError> {
    let pool = volumes::pool(session, settings.options.seed_pool()).map_err(nothing_done)?;
    if let Ok(old) = pool.lookup_storage_vol_by_name(name) {
        old.delete(0)
            .map_err(|e| maybe_done(format!("replace {what} {name}: {}", text(&e))))?;
    }
    let size = u64::try_from(bytes.len()).unwrap_or(u64::MAX);
    let (volume, _) =
        volumes::create_or_adopt(&pool, name, &xml::seed_volume(name, size)).map_err(maybe_done)?;
    volumes::upload(session, &volume, bytes)
        .map_err(|e| maybe_done(format!("write {what} {name}: {e}")))
}
