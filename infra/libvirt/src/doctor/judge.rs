//! The doctor's judgement: the configuration-wide checks, then every host's checks in
//! their fixed order, folded into one [`Report`].

use super::budget::{host_budget, host_workers};
use super::checks::{capacity, domain_type, domains, network, storage, version};
use super::facts::{Expectations, HostFacts, Slots};
use super::report::{Check, Report, Status, check};

/// Judges every host's facts against what the flags would run.
#[must_use]
pub fn judge(want: &Expectations, hosts: &[HostFacts]) -> Report {
    let mut checks = Vec::new();
    let zones: Vec<&str> = hosts.iter().map(|h| h.zone.as_str()).collect();
    let slot_count: usize = want
        .slots
        .iter()
        .flat_map(|(_, s)| s)
        .map(|s| s.count)
        .sum();
    checks.push(check(
        "-",
        "configuration",
        Status::Ok,
        format!(
            "{slot_count} slots over zones {}; the flags pass the provider's start-up checks",
            zones.join(", ")
        ),
        "",
    ));
    let idle: Vec<&str> = zones
        .iter()
        .filter(|z| {
            !want
                .slots
                .iter()
                .any(|(zone, s)| zone == *z && !s.is_empty())
        })
        .copied()
        .collect();
    checks.push(if idle.is_empty() {
        check(
            "-",
            "zones",
            Status::Ok,
            "every offering zone has a --connect host, and every host has offerings".to_owned(),
            "",
        )
    } else {
        check(
            "-",
            "zones",
            Status::Warn,
            format!("no offering uses zone {}", idle.join(", ")),
            "add an offering for that zone, or drop its host from --connect",
        )
    });
    checks.push(user_data(want));
    for host in hosts {
        let none = Vec::new();
        let slots = want
            .slots
            .iter()
            .find(|(zone, _)| *zone == host.zone)
            .map_or(&none, |(_, s)| s);
        judge_host(want, host, slots, &mut checks);
    }
    Report::new(checks)
}

fn user_data(want: &Expectations) -> Check {
    match &want.user_data {
        None => check(
            "-",
            "base user data",
            Status::Ok,
            "not set: guests get an empty #cloud-config".to_owned(),
            "",
        ),
        Some((path, Ok(size))) => check(
            "-",
            "base user data",
            Status::Ok,
            format!("{path} reads ({size} bytes)"),
            "",
        ),
        Some((path, Err(e))) => check(
            "-",
            "base user data",
            Status::Block,
            format!("{path}: {e}"),
            "make --base-user-data name a readable file",
        ),
    }
}

fn judge_host(want: &Expectations, host: &HostFacts, slots: &[Slots], out: &mut Vec<Check>) {
    let zone = host.zone.as_str();
    let connection = match &host.connection {
        Ok(c) => c,
        Err(e) => {
            let (detail, fix) = crate::host::credentials::connection_block(&host.uri, e);
            out.push(check(zone, "connection", Status::Block, detail, fix));
            return;
        }
    };
    out.push(check(
        zone,
        "connection",
        Status::Ok,
        format!(
            "{}: driver {}, libvirt {}, hypervisor {}",
            host.uri,
            connection.driver,
            version(connection.libvirt_version),
            version(connection.hypervisor_version)
        ),
        "",
    ));
    out.push(domain_type(want, zone, &host.domain_caps));
    out.extend(super::checks::tpm(zone, &host.domain_caps, slots));
    out.extend(super::checks::secure_boot(zone, &host.domain_caps, slots));
    out.extend(super::checks::ignition(
        zone,
        want.ignition,
        connection.libvirt_version,
    ));
    out.extend(storage(want, host, slots));
    out.push(network(want, zone, host.network.as_ref()));
    out.push(capacity(want, zone, connection, slots));
    out.extend(super::placement::placement(want, host, slots));
    out.extend(super::passthrough::devices(want, host, slots));
    out.push(domains(zone, &host.domains));
    out.extend(super::trial::cpu_trials(zone, host.cpu_trials.as_deref()));
    out.push(host_budget(want, host, &host.max_client_requests));
    out.push(host_workers(want, zone, &host.max_workers));
}
