//! Reading a host's CPU and huge page topology (its capabilities), its passthrough devices
//! (its node devices), its free huge pages (`virNodeGetFreePages`), and what a domain's
//! definition binds.

use std::collections::{BTreeMap, BTreeSet};

use bigfleet_libvirt_ports::HypervisorError;
use virt::connect::Connect;
use virt::domain::Domain;

use crate::host::error::context;
use crate::render::passthrough::FromNodeDevice;
use crate::render::passthrough::HostDevice;
use crate::render::placement::FromCapabilities;
use crate::render::placement::FromDefinition;
use crate::render::placement::{Held, Topology};

/// The host's topology, with its passthrough devices when `devices`; a host whose
/// capabilities list no NUMA cell (libvirt's test driver on a node file) is one cell of the
/// CPUs its node info counts.
///
/// # Errors
/// libvirt's.
pub(crate) fn read(conn: &Connect, devices: bool) -> Result<Topology, HypervisorError> {
    let capabilities =
        (conn.capabilities()).map_err(|e| context("read the host's capabilities", &e))?;
    let mut topology = match Topology::parse(&capabilities) {
        Some(topology) => topology,
        None => {
            let info = (conn.node_info()).map_err(|e| context("read node info", &e))?;
            Topology::flat(info.cpus)
        }
    };
    if devices {
        topology.devices = node_devices(conn)?;
    }
    Ok(topology)
}

/// The host's PCI devices (VFs among them) and mediated devices, by address (then UUID), so
/// claims pick them in the same order whatever order libvirt lists them in. One that
/// vanishes between the listing and the read is left out. A mediated device that is defined
/// and not started is marked inactive (libvirt 7.3 and later say which; an older daemon
/// lists only the devices that exist).
///
/// # Errors
/// libvirt's, for the listing.
pub(crate) fn node_devices(conn: &Connect) -> Result<Vec<HostDevice>, HypervisorError> {
    let kinds = virt::sys::VIR_CONNECT_LIST_NODE_DEVICES_CAP_PCI_DEV
        | virt::sys::VIR_CONNECT_LIST_NODE_DEVICES_CAP_MDEV;
    let listed = (conn.list_all_node_devices(kinds))
        .map_err(|e| context("list the host's node devices", &e))?;
    let inactive: BTreeSet<String> = conn
        .list_all_node_devices(kinds | virt::sys::VIR_CONNECT_LIST_NODE_DEVICES_INACTIVE)
        .map(|devices| devices.iter().filter_map(|d| d.name().ok()).collect())
        .unwrap_or_default();
    let mut devices: Vec<HostDevice> = (listed.iter())
        .filter_map(|device| device.xml_desc(0).ok())
        .filter_map(|xml| HostDevice::parse(&xml))
        .map(|device| HostDevice {
            active: !inactive.contains(&device.name),
            ..device
        })
        .collect();
    devices.sort_by(|a, b| a.key.cmp(&b.key));
    Ok(devices)
}

/// The host's free huge pages of each size `topology` has a pool of, summed over its cells.
///
/// # Errors
/// libvirt's.
pub(crate) fn free_pages(
    conn: &Connect,
    topology: &Topology,
) -> Result<BTreeMap<u64, u64>, HypervisorError> {
    let sizes: Vec<u32> = (topology.pages.keys())
        .filter_map(|size| u32::try_from(*size).ok())
        .collect();
    let cells = u32::try_from(topology.cells.len()).unwrap_or(u32::MAX);
    if sizes.is_empty() || cells == 0 {
        return Ok(BTreeMap::new());
    }
    let first = topology.cells.iter().map(|c| c.id).min().unwrap_or(0);
    let counts = (conn.free_pages(&sizes, first, cells, 0))
        .map_err(|e| context("read the host's free huge pages", &e))?;
    // libvirt answers cell by cell, each with one count per size in the order asked.
    let mut free = BTreeMap::new();
    for chunk in counts.chunks(sizes.len()) {
        for (size, count) in sizes.iter().zip(chunk) {
            *free.entry(u64::from(*size)).or_default() += *count;
        }
    }
    Ok(free)
}

/// What `domain`'s persistent definition binds; an unreadable one binds nothing.
pub(crate) fn held(domain: &Domain) -> Held {
    let inactive = virt::sys::VIR_DOMAIN_XML_INACTIVE;
    domain
        .xml_desc(inactive)
        .map(|xml| Held::parse(&xml))
        .unwrap_or_default()
}
