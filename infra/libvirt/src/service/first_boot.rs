//! Machines whose guest takes its node configuration at first boot (an instance type's
//! `"boot": "nocloud"`, docs/libvirt.md §5.14): Create defines the domain and leaves it off
//! (`lifecycle::create`); Configure writes the join blob as the NoCloud seed's user-data and
//! starts the domain ([`configure`]); Drain, after the guest's drain hook, stops the domain
//! and writes the seed back without the blob ([`rest`]); Delete removes the seed with the
//! other volumes.
//!
//! The seed is written only while the domain is off: a replayed Configure that finds its
//! domain running leaves it alone (the guest has read its configuration already), and one
//! that finds it off (the earlier attempt stopped before the start) writes the same seed
//! again. Each write gets the instance-id of the operation that made it, so cloud-init in a
//! drained and re-configured machine runs the new user-data.

use std::sync::Arc;

use bigfleet_libvirt_domain::{Machine, OperationId};
use bigfleet_libvirt_ports::{Clock, HypervisorError};
use virt::domain::Domain;

use super::hypervisor::prefixed;
use super::{LibvirtHypervisor, SequenceContext};
use crate::host::connection::Host;
use crate::host::domains::{self, ensure_running, owned};
use crate::host::error::{maybe_done, nothing_done, text};
use crate::host::lanes::Lane;
use crate::host::session::Session;
use crate::render::ownership::Tag;
use crate::render::{seed, spec, xml};
use crate::storage::{console, volumes};

impl<C: Clock> LibvirtHypervisor<C> {
    /// Whether `machine`'s type takes its configuration at first boot (`boot: nocloud`).
    pub(super) fn boots_first(&self, machine: &Machine) -> bool {
        self.inner
            .config
            .catalog
            .boots_first(&machine.instance_type)
    }

    /// A first-boot machine's host step ([`first_boot`]): Configure's (`blob`: write it as
    /// the seed's user-data and start the domain) or Drain's (`None`: stop the domain and
    /// write the seed back without it).
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
        let (id, kind) = (machine.id.to_string(), machine.instance_type.clone());
        let operation = operation_id.to_string();
        host.call(lane, move |s| {
            let target = Target {
                name: &name,
                machine_id: &id,
                instance_type: &kind,
                operation_id: &operation,
            };
            match &blob {
                Some(blob) => configure(s, &settings, &target, blob),
                None => rest(s, &settings, &target),
            }
        })
        .await
        .map_err(|e| prefixed(what, e))?;
        Ok(host)
    }
}

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
        return Ok(());
    }
    write_seed(session, settings, target, blob)?;
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
    Ok(())
}

/// Drain's part on the host, after the guest's drain hook: unbinds the domain from its
/// cluster (first, so that the drift watch sees a resting domain, not a stopped one), stops
/// it and writes the seed back with the base user-data, so no copy of the join blob stays on
/// the host and the next Configure starts the machine with its own.
///
/// # Errors
/// The domain is missing or not ours, would not stop, or the seed could not be written.
pub(crate) fn rest(
    session: &Session,
    settings: &SequenceContext,
    target: &Target<'_>,
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
    write_seed(session, settings, target, &settings.user_data)
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
    let pool = volumes::pool(session, options.seed_pool()).map_err(nothing_done)?;
    let name = spec::seed_name(target.name);
    if let Ok(old) = pool.lookup_storage_vol_by_name(&name) {
        old.delete(0)
            .map_err(|e| maybe_done(format!("replace the seed {name}: {}", text(&e))))?;
    }
    let bytes = u64::try_from(image.len()).unwrap_or(u64::MAX);
    let (volume, _) = volumes::create_or_adopt(&pool, &name, &xml::seed_volume(&name, bytes))
        .map_err(maybe_done)?;
    volumes::upload(session, &volume, &image)
        .map_err(|e| maybe_done(format!("write the seed {name}: {e}")))
}
