//! Domain-level building blocks shared by Create, Configure, Drain, Delete and the orphan
//! collector: find a domain *and prove it is ours*, power it on, rewrite its tag, and
//! remove it.
//!
//! Every path that touches an existing domain goes through [`owned`], which refuses a
//! domain whose tag names another provider label or machine id (or has no tag at all).
//! That is what keeps two provider processes on one host out of each other's machines,
//! whatever names they compute.

use virt::domain::{Domain, DomainState};
use virt::sys;

use bigfleet_libvirt_ports::HypervisorError;
use bigfleet_libvirt_ports::claims::PlacedDevice;

use crate::host::error::{context, is_missing_domain, maybe_done, one_line, refused, text};
use crate::host::session::Session;
use crate::render::ownership::{KEY, NAMESPACE, Tag};

/// `VIR_DOMAIN_METADATA_ELEMENT`.
const METADATA_ELEMENT: i32 = sys::VIR_DOMAIN_METADATA_ELEMENT as i32;

/// The ownership tag of a domain's persistent config, if it has a parsable one.
pub(crate) fn read_tag(domain: &Domain) -> Option<Tag> {
    domain
        .metadata(
            METADATA_ELEMENT,
            Some(NAMESPACE),
            sys::VIR_DOMAIN_AFFECT_CONFIG,
        )
        .ok()
        .and_then(|xml| Tag::parse(&xml))
}

/// Looks a domain up by name; `None` when there is none.
pub(crate) fn lookup(session: &Session, name: &str) -> Result<Option<Domain>, HypervisorError> {
    match session.conn.lookup_domain_by_name(name) {
        Ok(domain) => Ok(Some(domain)),
        Err(e) if is_missing_domain(&e) => Ok(None),
        Err(e) => Err(context(&format!("look up domain {name}"), &e)),
    }
}

/// Looks a domain up and proves it belongs to `provider`'s `machine_id`. `None` when
/// there is no domain of that name; a refusal when there is one but it is not ours.
pub(crate) fn owned(
    session: &Session,
    name: &str,
    provider: &str,
    machine_id: &str,
) -> Result<Option<(Domain, Tag)>, HypervisorError> {
    let Some(domain) = lookup(session, name)? else {
        return Ok(None);
    };
    match read_tag(&domain) {
        Some(tag) if tag.is(provider, machine_id) => Ok(Some((domain, tag))),
        Some(tag) => Err(refused(format!(
            "domain {name} exists but is tagged for machine {:?} of provider {:?}, not \
             machine {machine_id:?} of provider {provider:?}; refusing to touch it",
            tag.machine_id, tag.provider
        ))),
        None => Err(refused(format!(
            "domain {name} exists but carries no bigfleet ownership tag; refusing to touch \
             it (rename or remove it if it is stale)"
        ))),
    }
}

/// Whether libvirt counts the state as running (docs/libvirt.md §5.5).
pub(crate) fn is_active(state: DomainState) -> bool {
    matches!(
        state,
        DomainState::Running
            | DomainState::Blocked
            | DomainState::Paused
            | DomainState::PMSuspended
    )
}

/// The domain's state; an unknown state is an error.
pub(crate) fn state(domain: &Domain, name: &str) -> Result<DomainState, HypervisorError> {
    domain
        .info()
        .map_err(|e| context(&format!("get state of domain {name}"), &e))?
        .state
        .known()
        .ok_or_else(|| maybe_done(format!("domain {name} is in a state libvirt did not name")))
}

/// The longest libvirt message a start failure quotes.
const START_MESSAGE_LIMIT: usize = 700;

/// Starts a defined domain and checks that it is still up right after: QEMU that aborts at
/// start (a CPU mode the host cannot run, e.g. `failed to set MSR 0x10a` on nested KVM)
/// fails here with libvirt's words, which quote the tail of the domain's QEMU log, on one
/// bounded line, plus the state libvirt records and where the full log is.
pub(crate) fn start(domain: &Domain, name: &str) -> Result<(), HypervisorError> {
    if let Err(e) = domain.create() {
        return Err(maybe_done(format!(
            "start domain {name}: {}{}; {}",
            one_line(&text(&e), START_MESSAGE_LIMIT),
            shutoff_reason(domain).map_or_else(String::new, |r| format!(" (now {r})")),
            log_hint(name)
        )));
    }
    match domain.state() {
        Ok((found, reason)) if found.is_known_and(|s| !is_active(s)) => Err(maybe_done(format!(
            "domain {name} stopped right after it started (state {}, reason {reason}); {}",
            state_name(found.known()),
            log_hint(name)
        ))),
        _ => Ok(()),
    }
}

/// Adds to a start failure's message the passthrough devices the domain was given and where
/// to check them: libvirt refuses to start a domain whose device the host cannot pass
/// through (no IOMMU or VFIO, a device gone or back on a host driver) in words that need not
/// name the device.
pub(crate) fn name_devices(message: &mut String, devices: &[PlacedDevice]) {
    if devices.is_empty() {
        return;
    }
    let keys: Vec<String> = devices.iter().map(|d| d.key.to_string()).collect();
    message.push_str(&format!(
        "; the domain was given the passthrough device(s) {}: `bigfleet-libvirt doctor` with \
         the provider's flags checks this host's IOMMU, vfio-pci bindings and devices",
        keys.join(", ")
    ));
}

/// Where a domain's QEMU log is on a host of the system libvirt daemon.
fn log_hint(name: &str) -> String {
    format!("QEMU's log of it on the host: /var/log/libvirt/qemu/{name}.log (qemu:///system)")
}

fn state_name(state: Option<DomainState>) -> String {
    state.map_or_else(|| "unknown".to_owned(), |s| format!("{s:?}").to_lowercase())
}

/// `shutoff: failed` when the domain is not running and libvirt says why.
fn shutoff_reason(domain: &Domain) -> Option<String> {
    let (found, reason) = domain.state().ok()?;
    let found = found.known().filter(|s| !is_active(*s))?;
    Some(format!("{}: {reason}", state_name(Some(found))))
}

/// Why a domain cannot answer through its agent when it is not running: its state and
/// libvirt's reason (`shutoff: shutdown`, `crashed: panicked`), where QEMU's log is, and what
/// to do. `None` while it runs (or when its state cannot be read).
pub(crate) fn stopped(domain: &Domain, name: &str) -> Option<String> {
    shutoff_reason(domain).map(|why| {
        format!(
            "domain {name} is not running ({why}): the guest stopped after it was started, so \
             its agent cannot answer; {}; the guest's own console log is the place to look for \
             why (an image that powers off or panics at boot)",
            log_hint(name)
        )
    })
}

/// Starts a shut-off or crashed domain, resumes a paused one, wakes a suspended one, and
/// re-asserts autostart (best effort).
pub(crate) fn ensure_running(domain: &Domain, name: &str) -> Result<(), HypervisorError> {
    let started = match state(domain, name)? {
        DomainState::Shutoff | DomainState::Crashed => {
            start(domain, name).map_err(|e| maybe_done(format!("power on: {}", e.message)))?;
            Ok(())
        }
        DomainState::Paused => domain.resume(),
        DomainState::PMSuspended => domain.pm_wakeup(0),
        _ => Ok(()),
    };
    started.map_err(|e| maybe_done(format!("power on domain {name}: {}", text(&e))))?;
    if let Err(e) = domain.set_autostart(true) {
        tracing::warn!(domain = name, error = %text(&e), "set domain autostart");
    }
    Ok(())
}

/// Rewrites the ownership tag on the persistent config and, when running, the live one.
pub(crate) fn write_tag(domain: &Domain, tag: &Tag) -> Result<(), String> {
    let xml = tag.to_metadata_xml();
    let set = |flags| {
        domain.set_metadata(
            METADATA_ELEMENT,
            Some(&xml),
            Some(KEY),
            Some(NAMESPACE),
            flags,
        )
    };
    set(sys::VIR_DOMAIN_AFFECT_CONFIG | sys::VIR_DOMAIN_AFFECT_LIVE)
        .or_else(|_| set(sys::VIR_DOMAIN_AFFECT_CONFIG))
        .map_err(|e| format!("write the ownership tag: {}", text(&e)))
}

/// Destroys (if active) and undefines a domain. Undefine asks libvirt to drop NVRAM,
/// managed-save and emulated-TPM state too, falling back to fewer flags and then a plain
/// undefine for libvirt versions and drivers that refuse them. A domain that vanished meanwhile counts as removed.
pub(crate) fn remove(domain: &Domain, name: &str) -> Result<(), HypervisorError> {
    let active = match domain.info() {
        Ok(info) => info.state.known().is_some_and(is_active),
        Err(e) if is_missing_domain(&e) => return Ok(()),
        Err(e) => return Err(context(&format!("get state of domain {name}"), &e)),
    };
    if active {
        if let Err(e) = domain.destroy() {
            if is_missing_domain(&e) {
                return Ok(());
            }
            // Stopped on its own in between: undefine below settles it.
            if domain.is_active().unwrap_or(true) {
                return Err(maybe_done(format!("destroy domain {name}: {}", text(&e))));
            }
        }
    }
    // Newest first: libvirt before 8.9 refuses the TPM flag (its undefine removes the
    // emulated TPM's state unless told to keep it), and some drivers refuse all flags.
    let with_state = sys::VIR_DOMAIN_UNDEFINE_MANAGED_SAVE | sys::VIR_DOMAIN_UNDEFINE_NVRAM;
    for flags in [with_state | sys::VIR_DOMAIN_UNDEFINE_TPM, with_state] {
        match domain.undefine_flags(flags) {
            Ok(()) => return Ok(()),
            Err(e) if is_missing_domain(&e) => return Ok(()),
            Err(_) => {}
        }
    }
    match domain.undefine() {
        Ok(()) => Ok(()),
        Err(e) if is_missing_domain(&e) => Ok(()),
        Err(e) => Err(maybe_done(format!("undefine domain {name}: {}", text(&e)))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bigfleet_libvirt_ports::claims::{DeviceKey, PciAddress};

    #[test]
    fn a_start_failure_names_the_devices_the_domain_was_given() {
        let gpu = |bus| PlacedDevice {
            key: DeviceKey::Pci(PciAddress {
                domain: 0,
                bus,
                slot: 0,
                function: 0,
            }),
            vf: false,
            vlan: None,
        };
        let mut message = "start domain d: host doesn't support passthrough".to_owned();
        name_devices(&mut message, &[]);
        assert_eq!(message, "start domain d: host doesn't support passthrough");
        name_devices(&mut message, &[gpu(0xff), gpu(0x3b)]);
        assert!(
            message.ends_with(
                "; the domain was given the passthrough device(s) 0000:ff:00.0, 0000:3b:00.0: \
                 `bigfleet-libvirt doctor` with the provider's flags checks this host's IOMMU, \
                 vfio-pci bindings and devices"
            ),
            "{message}"
        );
    }
}
