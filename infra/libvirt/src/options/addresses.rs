//! Static address pools (`--address-pools`): fixed IPv4 addresses for the machines of an
//! offering, on node networks without DHCP.
//!
//! The file is a JSON list of pools. A pool serves one offering (an instance type in a
//! zone): slot number `i` of that type in that zone (the last component of its machine id)
//! gets `first + i`. The address is therefore a function of the slot alone: re-creating the
//! slot gives it the same address, a restart changes nothing, and offering more slots only
//! adds addresses at the end of the range. No record needs to remember it, and no two
//! machines can share one, because [`AddressPools::book`] refuses, before anything starts,
//! pools whose ranges overlap or run out of their network, and ranges that contain the
//! gateway or a DNS server. docs/libvirt.md §3.7 is the operator's side.
//!
//! The address goes on the machine's first NIC, delivered in the NoCloud seed as a
//! `network-config` (version 2) matched by the NIC's MAC (`render::seed`); a pool's `vlan`
//! tags that NIC (`render::devices`), which only NIC sources that carry tags may ask for.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::sync::Arc;

use bigfleet_libvirt_domain::Machine;
use bigfleet_libvirt_domain::catalog::parse_machine_id;
use ipnet::Ipv4Net;
use serde::Deserialize;

use super::devices::{DirectMode, NicSource};

/// The flag that names the file.
pub const FLAG: &str = "--address-pools";
/// The largest pools file read (the pools are a few lines each).
pub const MAX_FILE_BYTES: u64 = 1 << 20;
/// The longest network prefix a pool may have: /30 leaves two host addresses.
const MAX_PREFIX: u8 = 30;

/// One pool as the file writes it.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawAddressPool {
    /// The offering's instance type.
    pub instance_type: String,
    /// The offering's zone.
    pub zone: String,
    /// The network, `10.20.0.0/24`.
    pub cidr: String,
    /// The address of slot 0; slot `i` gets `first + i`.
    pub first: String,
    /// The default route's gateway (none: no default route).
    #[serde(default)]
    pub gateway: Option<String>,
    /// DNS servers.
    #[serde(default)]
    pub dns: Vec<String>,
    /// DNS search domains.
    #[serde(default)]
    pub search: Vec<String>,
    /// An 802.1Q tag for the first NIC (1–4094).
    #[serde(default)]
    pub vlan: Option<i64>,
}

/// A pool's network settings, shared by every address it hands out.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Subnet {
    /// The network.
    pub network: Ipv4Net,
    /// The default route's gateway.
    pub gateway: Option<Ipv4Addr>,
    /// DNS servers.
    pub dns: Vec<Ipv4Addr>,
    /// DNS search domains.
    pub search: Vec<String>,
    /// The first NIC's 802.1Q tag.
    pub vlan: Option<u16>,
}

/// One checked pool.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AddressPool {
    /// The offering's instance type.
    pub instance_type: String,
    /// The offering's zone.
    pub zone: String,
    /// Slot 0's address.
    pub first: Ipv4Addr,
    /// The network settings.
    pub subnet: Arc<Subnet>,
}

impl AddressPool {
    /// How the errors name the pool: its place in the file and its offering.
    fn label(&self, index: usize) -> String {
        format!("pool {index} ({} in {})", self.instance_type, self.zone)
    }
}

/// The fixed address of one machine's first NIC.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StaticAddress {
    /// The address.
    pub address: Ipv4Addr,
    /// Its pool's network settings.
    pub subnet: Arc<Subnet>,
}

impl StaticAddress {
    /// `address/prefix`, as network configurations write it.
    #[must_use]
    pub fn with_prefix(&self) -> String {
        format!("{}/{}", self.address, self.subnet.network.prefix_len())
    }
}

/// The checked pools of a `--address-pools` file.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AddressPools {
    pools: Vec<AddressPool>,
}

/// The address of every configured slot a pool serves.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AddressBook {
    assigned: BTreeMap<String, StaticAddress>,
}

impl AddressBook {
    /// The address of `machine_id`'s first NIC, when a pool serves its offering.
    #[must_use]
    pub fn get(&self, machine_id: &str) -> Option<&StaticAddress> {
        self.assigned.get(machine_id)
    }

    /// How many slots have an address.
    #[must_use]
    pub fn len(&self) -> usize {
        self.assigned.len()
    }

    /// Whether no slot has one.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.assigned.is_empty()
    }
}

impl AddressPools {
    /// Parses and checks a pools file's `text`; `source` names the file in errors.
    ///
    /// # Errors
    /// What is wrong, naming the file, the pool and the fix.
    pub fn parse(text: &[u8], source: &str) -> Result<Self, String> {
        let raw: Vec<RawAddressPool> = serde_json::from_slice(text).map_err(|e| {
            format!(
                "{FLAG} {source}: not a JSON list of pools ({e}); each pool is {{\"instance_type\", \
                 \"zone\", \"cidr\", \"first\"}} with optional \"gateway\", \"dns\", \"search\" \
                 and \"vlan\" (docs/libvirt.md §3.7)"
            )
        })?;
        if raw.is_empty() {
            return Err(format!(
                "{FLAG} {source} lists no pool; add one, or drop the flag"
            ));
        }
        let mut pools: Vec<AddressPool> = Vec::with_capacity(raw.len());
        for (index, entry) in raw.iter().enumerate() {
            let pool = pool(entry).map_err(|problem| {
                format!(
                    "{FLAG} {source}: pool {index} ({} in {}): {problem}",
                    entry.instance_type, entry.zone
                )
            })?;
            if let Some(other) = (pools.iter())
                .position(|p| p.instance_type == pool.instance_type && p.zone == pool.zone)
            {
                return Err(format!(
                    "{FLAG} {source}: {} serves the same offering as pool {other}; give each \
                     offering one pool",
                    pool.label(index)
                ));
            }
            pools.push(pool);
        }
        Ok(Self { pools })
    }

    /// Whether there are no pools.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.pools.is_empty()
    }

    /// Gives every slot of `slots` a pool serves its address, after checking that the pools
    /// fit the slots: each pool serves an offering that exists, whose machines have a NIC
    /// (`nics` says what a type's NICs are) able to carry the pool's VLAN tag, and its range
    /// (`first` up to the highest slot number's address) stays inside its network and
    /// clear of its gateway, its DNS servers and every other pool's range.
    ///
    /// # Errors
    /// The first pool that does not fit, what is wrong and the fix.
    pub fn book(
        &self,
        slots: &[Machine],
        nics: impl Fn(&str) -> Vec<NicSource>,
    ) -> Result<AddressBook, String> {
        let mut ranges = Vec::with_capacity(self.pools.len());
        let mut assigned = BTreeMap::new();
        for (index, pool) in self.pools.iter().enumerate() {
            let served = served_slots(pool, slots);
            let fits = fit(pool, &served, &nics(&pool.instance_type));
            let last =
                fits.map_err(|problem| format!("{FLAG}: {}: {problem}", pool.label(index)))?;
            ranges.push((u32::from(pool.first), u32::from(last), index));
            for (id, slot) in served {
                let address = Ipv4Addr::from(u32::from(pool.first) + slot);
                let subnet = Arc::clone(&pool.subnet);
                assigned.insert(id.to_owned(), StaticAddress { address, subnet });
            }
        }
        ranges.sort_unstable();
        for pair in ranges.windows(2) {
            let ((a_first, a_last, a), (b_first, _, b)) = (pair[0], pair[1]);
            if b_first <= a_last {
                return Err(format!(
                    "{FLAG}: {} hands out {}–{}, and {} starts at {}, inside that range; move \
                     one pool's first address so the ranges do not overlap",
                    self.pools[a].label(a),
                    Ipv4Addr::from(a_first),
                    Ipv4Addr::from(a_last),
                    self.pools[b].label(b),
                    Ipv4Addr::from(b_first),
                ));
            }
        }
        Ok(AddressBook { assigned })
    }
}

/// The machine ids and slot numbers of `pool`'s offering among `slots`.
fn served_slots<'a>(pool: &AddressPool, slots: &'a [Machine]) -> Vec<(&'a str, u32)> {
    (slots.iter())
        .filter(|m| m.instance_type == pool.instance_type && m.zone == pool.zone)
        .filter_map(|m| {
            let parsed = parse_machine_id(m.id.as_str())?;
            Some((m.id.as_str(), u32::try_from(parsed.index).ok()?))
        })
        .collect()
}

/// Whether `pool` fits the slots it serves (`served`), whose NICs are `nics`: the last
/// address it hands out, or what is wrong.
fn fit(pool: &AddressPool, served: &[(&str, u32)], nics: &[NicSource]) -> Result<Ipv4Addr, String> {
    let Some(highest) = served.iter().map(|(_, slot)| *slot).max() else {
        return Err(
            "no offering has slots of that type in that zone; fix the pool's instance_type or \
             zone, or remove the pool"
                .to_owned(),
        );
    };
    let mut numbers: Vec<u32> = served.iter().map(|(_, slot)| *slot).collect();
    numbers.sort_unstable();
    if let Some(pair) = numbers.windows(2).find(|pair| pair[0] == pair[1]) {
        return Err(format!(
            "two of its slots have the number {} (offerings of different capacity types),              and would share an address; give those offerings different instance types",
            pair[0]
        ));
    }
    let subnet = &pool.subnet;
    let network = subnet.network;
    let last_host = u32::from(network.broadcast()) - 1;
    let last = u32::from(pool.first)
        .checked_add(highest)
        .filter(|last| *last <= last_host)
        .ok_or_else(|| {
            format!(
                "slot numbers run up to {highest}, so the pool needs {} addresses from {}, \
                 past {network}'s last host address {}; widen the cidr, lower first, or \
                 offer fewer slots",
                u64::from(highest) + 1,
                pool.first,
                Ipv4Addr::from(last_host),
            )
        })?;
    let inside = |address: Ipv4Addr| (u32::from(pool.first)..=last).contains(&u32::from(address));
    if let Some(gateway) = subnet.gateway.filter(|g| inside(*g)) {
        return Err(format!(
            "its range {}–{} contains the gateway {gateway}; start the range past it",
            pool.first,
            Ipv4Addr::from(last)
        ));
    }
    if let Some(dns) = subnet.dns.iter().find(|d| inside(**d)) {
        return Err(format!(
            "its range {}–{} contains the DNS server {dns}; start the range past it",
            pool.first,
            Ipv4Addr::from(last)
        ));
    }
    match (nics.first(), subnet.vlan) {
        (None, _) => Err(
            "its machines have no NIC; give the type one (--network, --nic or --instance-nic)"
                .to_owned(),
        ),
        (Some(source), Some(vlan)) if !carries_a_tag(source) => Err(format!(
            "asks for VLAN {vlan} on the first NIC, {source}, which cannot carry a tag; \
             plug it into an Open vSwitch bridge (ovs=NAME), an SR-IOV virtual function in \
             macvtap passthrough mode (direct=DEV:passthrough) or a libvirt network that tags \
             (network=NAME), or drop \"vlan\" and tag on the host's side"
        )),
        _ => Ok(Ipv4Addr::from(last)),
    }
}

/// Whether libvirt can tag the frames of a NIC on `source` without the guest knowing: an
/// Open vSwitch port, an SR-IOV virtual function in macvtap passthrough mode, or a libvirt
/// network (which tags when it is one over Open vSwitch or of VFs; libvirt refuses the
/// definition otherwise). A Linux bridge and the other macvtap modes cannot.
fn carries_a_tag(source: &NicSource) -> bool {
    match source {
        NicSource::Bridge(_) => false,
        NicSource::Direct { mode, .. } => *mode == DirectMode::Passthrough,
        _ => true,
    }
}

/// Checks one raw pool.
fn pool(raw: &RawAddressPool) -> Result<AddressPool, String> {
    for (field, value) in [("instance_type", &raw.instance_type), ("zone", &raw.zone)] {
        if value.is_empty() {
            return Err(format!("{field} is empty; name the offering's {field}"));
        }
    }
    let network: Ipv4Net = (raw.cidr.parse()).map_err(|_| {
        format!(
            "cidr {:?} is not an IPv4 network such as 10.20.0.0/24",
            raw.cidr
        )
    })?;
    if network.prefix_len() > MAX_PREFIX {
        return Err(format!(
            "cidr {network} leaves no host addresses to hand out; use a /{MAX_PREFIX} or wider"
        ));
    }
    if network.addr() != network.network() {
        return Err(format!(
            "cidr {:?} has host bits set; write the network itself, {}",
            raw.cidr,
            network.trunc()
        ));
    }
    let host = |field: &str, text: &str| -> Result<Ipv4Addr, String> {
        let address: Ipv4Addr =
            (text.parse()).map_err(|_| format!("{field} {text:?} is not an IPv4 address"))?;
        if !network.contains(&address)
            || address == network.network()
            || address == network.broadcast()
        {
            return Err(format!(
                "{field} {address} is not a host address of {network}; pick one inside it"
            ));
        }
        Ok(address)
    };
    let first = host("first", &raw.first)?;
    let gateway = (raw.gateway.as_deref())
        .map(|g| host("gateway", g))
        .transpose()?;
    let dns = (raw.dns.iter())
        .map(|d| (d.parse()).map_err(|_| format!("dns {d:?} is not an IPv4 address")))
        .collect::<Result<_, _>>()?;
    if let Some(bad) = raw.search.iter().find(|d| !is_domain_name(d)) {
        return Err(format!(
            "search domain {bad:?} is not a DNS name (letters, digits, '-' and '.', at most \
             253 characters)"
        ));
    }
    let vlan = match raw.vlan {
        None => None,
        Some(tag @ 1..=4094) => Some(u16::try_from(tag).map_err(|e| e.to_string())?),
        Some(tag) => return Err(format!("vlan {tag} is not a VLAN id; use 1 to 4094")),
    };
    let subnet = Subnet {
        network,
        gateway,
        dns,
        search: raw.search.clone(),
        vlan,
    };
    Ok(AddressPool {
        instance_type: raw.instance_type.clone(),
        zone: raw.zone.clone(),
        first,
        subnet: Arc::new(subnet),
    })
}

/// Whether `name` is a DNS name a network configuration can carry as it is.
fn is_domain_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && (name.bytes()).all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.')
}

#[cfg(test)]
#[path = "addresses_tests.rs"]
mod tests;
