//! Reading a host's CPU and huge page topology (its capabilities) and its free huge pages
//! (`virNodeGetFreePages`), and what a domain's definition binds.

use std::collections::BTreeMap;

use bigfleet_libvirt_ports::HypervisorError;
use virt::connect::Connect;
use virt::domain::Domain;

use crate::host::error::context;
use crate::render::placement::{Held, Topology};

/// The host's topology; a host whose capabilities list no NUMA cell (libvirt's test driver
/// on a node file) is one cell of the CPUs its node info counts.
///
/// # Errors
/// libvirt's.
pub(crate) fn read(conn: &Connect) -> Result<Topology, HypervisorError> {
    let capabilities =
        (conn.capabilities()).map_err(|e| context("read the host's capabilities", &e))?;
    if let Some(topology) = Topology::parse(&capabilities) {
        return Ok(topology);
    }
    let info = (conn.node_info()).map_err(|e| context("read node info", &e))?;
    Ok(Topology::flat(info.cpus))
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
