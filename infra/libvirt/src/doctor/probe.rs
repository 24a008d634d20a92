//! What `bigfleet-libvirt doctor` reads from one host: the connection and versions, domain
//! capabilities for `--domain-type`, the storage pool, the golden image, the network and
//! the domains. Only lookups: nothing on the host is created, started or changed, unless
//! `--trial-domain` asks for the throw-away paused domains of `trial`.
//!
//! The judgement lives in [`crate::doctor`]; this file only turns libvirt answers into
//! [`HostFacts`], telling "missing" apart from "this driver cannot say" and from errors.

use std::collections::{BTreeMap, BTreeSet};

use virt::connect::Connect;
use virt::error::{Error as VirtError, ErrorNumber};
use virt::storage_pool::StoragePool;

use super::facts::{Connection, DomainCaps, Domains, HostFacts, Pool, Probe, Volume};
use super::trial_domain::{self, TrialPlan};
use crate::host::domains::{is_active, read_tag};
use crate::host::error::{is_unsupported, text};
use crate::render::passthrough::DeviceKey;
use crate::render::placement::Topology;
use crate::render::xml;

/// What the probe looks for.
#[derive(Clone, Debug)]
pub struct ProbeTarget {
    /// The provider label (`--provider`): whose ownership tags count as ours.
    pub provider: String,
    /// `--storage-pool`.
    pub storage_pool: String,
    /// `--seed-pool`, resolved (`--storage-pool` when not given).
    pub seed_pool: String,
    /// `--image`.
    pub image: String,
    /// `--network`; empty = none.
    pub network: String,
    /// `--domain-type`.
    pub domain_type: String,
    /// Every configured slot's machine id (a tagged domain for any other id is an orphan).
    pub machine_ids: BTreeSet<String>,
    /// `--trial-domain`: the CPU choices to try on throw-away domains; `None`: none.
    pub trial: Option<TrialPlan>,
    /// Whether to read the host's CPU and huge page topology (some type holds part of a
    /// host alone, or `--dedicated-cpus` is set).
    pub placement: bool,
    /// Whether to read its node devices and what its domains hold (some type asks for
    /// passthrough devices).
    pub devices: bool,
}

fn answer<T>(result: Result<T, VirtError>, missing: ErrorNumber) -> Probe<T> {
    match result {
        Ok(value) => Probe::Found(value),
        Err(e) if e.code().is(missing) => Probe::Missing,
        Err(e) if is_unsupported(&e) => Probe::Unsupported(text(&e)),
        Err(e) => Probe::Failed(text(&e)),
    }
}

/// Reads every fact about the host at `uri` (blocking; run it off the async runtime).
#[must_use]
pub fn probe(zone: &str, uri: &str, target: &ProbeTarget) -> HostFacts {
    // Remote transports need libvirt's event loop: without it a large answer (domain
    // capabilities) over qemu+libssh:// never arrives.
    crate::host::dial::ensure_event_loop();
    fn skipped<T>() -> Probe<T> {
        Probe::Unsupported("no connection".to_owned())
    }
    let mut facts = HostFacts {
        zone: zone.to_owned(),
        uri: uri.to_owned(),
        connection: Err(String::new()),
        domain_caps: skipped(),
        pool: skipped(),
        seed_pool: None,
        image: skipped(),
        network: None,
        domains: skipped(),
        cpu_trials: None,
        max_client_requests: skipped(),
        max_workers: skipped(),
        topology: None,
        held_devices: None,
    };
    let conn = match Connect::open(Some(uri)) {
        Ok(conn) => conn,
        Err(e) => {
            facts.connection = Err(crate::host::credentials::connect_failure(uri, &e));
            return facts;
        }
    };
    facts.connection = connection(&conn);
    if facts.connection.is_ok() {
        facts.domain_caps = domain_caps(&conn, &target.domain_type);
        let pool = answer(
            conn.lookup_storage_pool_by_name(&target.storage_pool),
            ErrorNumber::NoStoragePool,
        );
        facts.pool = pool_probe(&conn, &pool);
        if target.seed_pool != target.storage_pool {
            let seed = answer(
                conn.lookup_storage_pool_by_name(&target.seed_pool),
                ErrorNumber::NoStoragePool,
            );
            facts.seed_pool = Some(pool_probe(&conn, &seed));
        }
        if let Probe::Found(p) = &pool {
            facts.image = volume(p, &target.image);
        }
        if !target.network.is_empty() {
            facts.network = Some(network(&conn, &target.network));
        }
        facts.domains = domains(&conn, target);
        if target.placement {
            facts.topology = Some(topology(&conn, target.devices));
        }
        if target.devices {
            facts.held_devices = Some(held_devices(&conn));
        }
        // After the domain count, so the trial domains are never in it.
        if let Some(plan) = &target.trial {
            facts.cpu_trials = Some(trial_domain::run(&conn, &target.provider, plan));
        }
        facts.max_client_requests = Probe::Unsupported(NO_ADMIN_API.to_owned());
        facts.max_workers = Probe::Unsupported(NO_ADMIN_API.to_owned());
    }
    drop(conn);
    facts
}

/// Why `max_client_requests` and `max_workers` are not read: libvirt does not report
/// `max_client_requests` at all, and `max_workers` only through its admin API
/// (`virAdmConnectOpen` on the daemon's admin socket, local to the host), which the `virt`
/// crate does not bind; the operator states the former (`--host-max-client-requests`).
const NO_ADMIN_API: &str = "libvirt's admin API is not available to the provider";

fn connection(conn: &Connect) -> Result<Connection, String> {
    let read = |what: &str, e: VirtError| format!("read {what}: {}", text(&e));
    let info = conn.node_info().map_err(|e| read("node info", e))?;
    Ok(Connection {
        driver: conn.driver_type().map_err(|e| read("driver type", e))?,
        libvirt_version: conn.lib_version().map_err(|e| read("libvirt version", e))?,
        hypervisor_version: conn
            .hyp_version()
            .map_err(|e| read("hypervisor version", e))?,
        cpus: info.cpus,
        memory_kib: info.memory,
    })
}

fn domain_caps(conn: &Connect, domain_type: &str) -> Probe<DomainCaps> {
    let xml =
        match conn.domain_capabilities(None, Some("x86_64"), Some("q35"), Some(domain_type), 0) {
            Ok(xml) => xml,
            Err(e) if is_unsupported(&e) => {
                return Probe::Unsupported(format!(
                    "this libvirt driver reports no domain capabilities ({})",
                    text(&e)
                ));
            }
            Err(e) => return Probe::Failed(text(&e)),
        };
    match parse_domain_caps(&xml) {
        Some(caps) => Probe::Found(caps),
        None => Probe::Failed("the domain capabilities do not parse".to_owned()),
    }
}

/// Whether network `name` exists and is active.
fn network(conn: &Connect, name: &str) -> Probe<bool> {
    match answer(conn.lookup_network_by_name(name), ErrorNumber::NoNetwork) {
        Probe::Found(n) => match n.is_active() {
            Ok(active) => Probe::Found(active),
            Err(e) => Probe::Failed(text(&e)),
        },
        Probe::Missing => Probe::Missing,
        Probe::Unsupported(e) => Probe::Unsupported(e),
        Probe::Failed(e) => Probe::Failed(e),
    }
}

/// The passthrough devices every domain of the host holds (by its persistent definition, as
/// the provider's scans read them); none when the domains cannot be listed.
fn held_devices(conn: &Connect) -> BTreeSet<DeviceKey> {
    let domains = conn.list_all_domains(0).unwrap_or_default();
    (domains.iter())
        .flat_map(|domain| crate::host::topology::held(domain).devices)
        .collect()
}

/// The host's topology (with its node devices when `devices`) and its free huge pages by
/// size (as the provider's scans read them).
fn topology(conn: &Connect, devices: bool) -> Probe<(Topology, BTreeMap<u64, u64>)> {
    let read = crate::host::topology::read(conn, devices)
        .and_then(|t| crate::host::topology::free_pages(conn, &t).map(|free| (t, free)));
    match read {
        Ok(found) => Probe::Found(found),
        Err(e) => Probe::Failed(e.message),
    }
}

/// The parts of a `<domainCapabilities>` document the provider's domain XML relies on.
fn parse_domain_caps(xml: &str) -> Option<DomainCaps> {
    let document = roxmltree::Document::parse(xml).ok()?;
    let root = document.root_element();
    fn child<'a, 'i>(node: roxmltree::Node<'a, 'i>, name: &str) -> Option<roxmltree::Node<'a, 'i>> {
        node.children()
            .find(|n| n.is_element() && n.has_tag_name(name))
    }
    let machine = child(root, "machine")
        .and_then(|n| n.text())
        .unwrap_or("q35")
        .to_owned();
    let os_supported = child(root, "os").and_then(|n| n.attribute("supported")) == Some("yes");
    let unix_channel = child(root, "devices")
        .and_then(|d| child(d, "channel"))
        .map(|channel| {
            channel.attribute("supported") == Some("yes")
                && channel
                    .descendants()
                    .any(|n| n.has_tag_name("value") && n.text() == Some("unix"))
        });
    let tpm_emulator = child(root, "devices")
        .and_then(|d| child(d, "tpm"))
        .map(|tpm| {
            let backends = tpm
                .children()
                .find(|n| n.has_tag_name("enum") && n.attribute("name") == Some("backendModel"));
            tpm.attribute("supported") == Some("yes")
                && backends.is_some_and(|b| {
                    b.children()
                        .any(|v| v.has_tag_name("value") && v.text() == Some("emulator"))
                })
        });
    let secure_boot = child(root, "os")
        .and_then(|os| child(os, "loader"))
        .and_then(|loader| {
            (loader.children())
                .find(|n| n.has_tag_name("enum") && n.attribute("name") == Some("secure"))
        })
        .map(|secure| {
            (secure.children()).any(|v| v.has_tag_name("value") && v.text() == Some("yes"))
        });
    Some(DomainCaps {
        machine,
        os_supported,
        unix_channel,
        tpm_emulator,
        secure_boot,
    })
}

fn pool_probe(conn: &Connect, pool: &Probe<StoragePool>) -> Probe<Pool> {
    match pool {
        Probe::Found(p) => pool_facts(conn, p),
        Probe::Missing => Probe::Missing,
        Probe::Unsupported(e) => Probe::Unsupported(e.clone()),
        Probe::Failed(e) => Probe::Failed(e.clone()),
    }
}

fn pool_facts(conn: &Connect, pool: &StoragePool) -> Probe<Pool> {
    let info = match pool.info() {
        Ok(info) => info,
        Err(e) => return Probe::Failed(text(&e)),
    };
    let document = pool.xml_desc(0).unwrap_or_default();
    let kind = roxmltree::Document::parse(&document)
        .ok()
        .and_then(|d| d.root_element().attribute("type").map(str::to_owned))
        .unwrap_or_else(|| "unknown".to_owned());
    Probe::Found(Pool {
        kind,
        active: pool.is_active().unwrap_or(false),
        capacity: info.capacity,
        available: info.available,
        rbd: super::ceph::rbd_facts(conn, &document),
    })
}

fn volume(pool: &StoragePool, name: &str) -> Probe<Volume> {
    match answer(
        pool.lookup_storage_vol_by_name(name),
        ErrorNumber::NoStorageVolume,
    ) {
        Probe::Found(vol) => match vol.info() {
            Ok(info) => Probe::Found(Volume {
                format: vol
                    .xml_desc(0)
                    .ok()
                    .and_then(|desc| xml::volume_format(&desc))
                    .unwrap_or_else(|| "unknown".to_owned()),
                capacity: info.capacity,
            }),
            Err(e) => Probe::Failed(text(&e)),
        },
        Probe::Missing => Probe::Missing,
        Probe::Unsupported(e) => Probe::Unsupported(e),
        Probe::Failed(e) => Probe::Failed(e),
    }
}

fn domains(conn: &Connect, target: &ProbeTarget) -> Probe<Domains> {
    let listed = match conn.list_all_domains(0) {
        Ok(listed) => listed,
        Err(e) => return Probe::Failed(text(&e)),
    };
    let mut facts = Domains::default();
    for domain in listed {
        let Ok(name) = domain.name() else { continue };
        match read_tag(&domain).filter(|t| t.provider == target.provider) {
            Some(tag) => {
                facts.ours += 1;
                let running = domain
                    .info()
                    .is_ok_and(|i| i.state.known().is_some_and(is_active));
                if running {
                    facts.ours_running += 1;
                }
                if !target.machine_ids.contains(&tag.machine_id) {
                    facts.orphans.push(name);
                }
            }
            None => facts.others += 1,
        }
    }
    Probe::Found(facts)
}

#[cfg(test)]
mod tests {
    use super::parse_domain_caps;

    #[test]
    fn domain_capabilities_parse_machine_os_and_channel() {
        let xml = "<domainCapabilities><path>/usr/bin/qemu-system-x86_64</path>\
            <domain>kvm</domain><machine>pc-q35-7.2</machine><arch>x86_64</arch>\
            <os supported='yes'/><devices><channel supported='yes'><enum name='type'>\
            <value>pty</value><value>unix</value></enum></channel></devices>\
            </domainCapabilities>";
        let caps = parse_domain_caps(xml).unwrap();
        assert_eq!(caps.machine, "pc-q35-7.2");
        assert!(caps.os_supported);
        assert_eq!(caps.unix_channel, Some(true));
        let old = "<domainCapabilities><machine>pc-q35-5.2</machine>\
            <os supported='no'/><devices/></domainCapabilities>";
        let caps = parse_domain_caps(old).unwrap();
        assert!(!caps.os_supported);
        assert_eq!(caps.unix_channel, None, "channel types not listed");
        assert_eq!(caps.tpm_emulator, None, "TPM support not listed");
        assert_eq!(caps.secure_boot, None, "loaders not listed");
    }

    #[test]
    fn domain_capabilities_say_whether_secure_boot_firmware_exists() {
        let with = |secure: &str| {
            format!(
                "<domainCapabilities><machine>pc-q35-7.2</machine><os supported='yes'>\
                 <enum name='firmware'><value>bios</value><value>efi</value></enum>\
                 <loader supported='yes'><value>/usr/share/OVMF/OVMF_CODE_4M.fd</value>\
                 <enum name='type'><value>pflash</value></enum>\
                 <enum name='secure'>{secure}</enum></loader></os><devices/>\
                 </domainCapabilities>"
            )
        };
        let ovmf = with("<value>no</value><value>yes</value>");
        assert_eq!(parse_domain_caps(&ovmf).unwrap().secure_boot, Some(true));
        let plain = with("<value>no</value>");
        assert_eq!(parse_domain_caps(&plain).unwrap().secure_boot, Some(false));
    }

    #[test]
    fn domain_capabilities_say_whether_a_tpm_can_be_emulated() {
        let with = |backends: &str| {
            format!(
                "<domainCapabilities><machine>pc-q35-7.2</machine><os supported='yes'/>\
                 <devices><tpm supported='yes'><enum name='model'><value>tpm-crb</value>\
                 </enum><enum name='backendModel'>{backends}</enum></tpm></devices>\
                 </domainCapabilities>"
            )
        };
        let swtpm = with("<value>passthrough</value><value>emulator</value>");
        assert_eq!(parse_domain_caps(&swtpm).unwrap().tpm_emulator, Some(true));
        let passthrough_only = with("<value>passthrough</value>");
        let caps = parse_domain_caps(&passthrough_only).unwrap();
        assert_eq!(caps.tpm_emulator, Some(false), "no swtpm on the host");
        let unsupported = "<domainCapabilities><os supported='yes'/><devices>\
            <tpm supported='no'/></devices></domainCapabilities>";
        let caps = parse_domain_caps(unsupported).unwrap();
        assert_eq!(caps.tpm_emulator, Some(false));
    }
}
