//! Doctor's `devices` lines, one per device class the served types ask for
//! (docs/placement.md): the host's devices of that class, which its domains hold, and which
//! cannot be passed through and why (no IOMMU group, bound to a host driver), with the fix.

use std::collections::BTreeMap;

use super::facts::{Expectations, HostFacts, Probe, Slots};
use super::report::{Check, Status, check};
use crate::render::passthrough::HostDevice;

/// The most devices a line names one by one.
const NAMED: usize = 8;

/// The devices lines of one host; none when no type asks for devices.
pub(super) fn devices(want: &Expectations, host: &HostFacts, slots: &[Slots]) -> Vec<Check> {
    let zone = host.zone.as_str();
    // Per class: the most one machine needs, and what every slot needs.
    let mut asked: BTreeMap<&str, (u64, u64)> = BTreeMap::new();
    for slot in slots {
        for (class, count) in &slot.devices {
            let (one, all) = asked.entry(class.as_str()).or_default();
            *one = (*one).max(u64::from(*count));
            *all = all.saturating_add(u64::from(*count).saturating_mul(slot.count as u64));
        }
    }
    if asked.is_empty() {
        return Vec::new();
    }
    let Some(Probe::Found((topology, _))) = &host.topology else {
        // The placement line already says why the topology could not be read.
        return Vec::new();
    };
    let held = host.held_devices.clone().unwrap_or_default();
    let mut out = Vec::new();
    for (class, (one, all)) in asked {
        let Some(source) = want.classes.get(class).map(|c| &c.source) else {
            continue;
        };
        let found: Vec<&HostDevice> = (topology.devices.iter()).filter(|d| d.is(source)).collect();
        let (usable, unusable): (Vec<&HostDevice>, Vec<&HostDevice>) =
            found.iter().partition(|d| d.unusable().is_none());
        let claimed = usable.iter().filter(|d| held.contains(&d.key)).count();
        let free = (usable.len() - claimed) as u64;
        let mut detail = format!(
            "{class} ({source}): {} usable{}, {claimed} held by domains, {free} free; one \
             machine needs {one}, every slot {all}",
            usable.len(),
            named(&usable)
        );
        let mut fix = String::new();
        if let Some(first) = unusable.first() {
            detail.push_str(&format!(
                "; {} unusable{}",
                unusable.len(),
                named(&unusable)
            ));
            fix = first.unusable().unwrap_or_default();
        }
        let status = if free < one {
            Status::Block
        } else if free < all || !unusable.is_empty() {
            Status::Warn
        } else {
            Status::Ok
        };
        if status != Status::Ok && fix.is_empty() {
            fix = format!(
                "add {source} devices to this host (bound to vfio-pci, in an IOMMU group), or \
                 lower the count of the offerings asking for class {class}"
            );
        }
        if status == Status::Ok {
            fix.clear();
        }
        out.push(check(zone, "devices", status, detail, &fix));
    }
    out
}

/// ` (a, b, …)`: the devices' keys, at most [`NAMED`] of them; nothing for none.
fn named(devices: &[&HostDevice]) -> String {
    if devices.is_empty() {
        return String::new();
    }
    let mut names: Vec<String> = (devices.iter().take(NAMED))
        .map(|d| d.key.to_string())
        .collect();
    if devices.len() > NAMED {
        names.push(format!("and {} more", devices.len() - NAMED));
    }
    format!(" ({})", names.join(", "))
}
