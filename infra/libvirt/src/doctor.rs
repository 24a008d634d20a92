//! `bigfleet-libvirt doctor`: a preflight that turns the set-up mistakes which otherwise
//! surface minutes later as FAILED machines (a missing golden image, an inactive pool, no
//! KVM, a missing network) into one line each, with the fix, before anything is served.
//!
//! This file is pure: it judges [`HostFacts`] (what the libvirt adapter's probe read from
//! each host, without changing anything there) against [`Expectations`] (what the flags
//! would run), and renders the [`Report`] as a table or JSON. Keeping the judgement apart
//! from libvirt lets every verdict, including ones the libvirt test driver cannot stage
//! (an inactive pool, KVM missing), be tested directly.

use std::fmt::Write as _;
use std::sync::Arc;

use serde::Serialize;

use crate::golden::GoldenImage;
use crate::{CapacityPolicy, allocatable_for};

/// How one check came out. Ordered by severity.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    /// Fine.
    Ok,
    /// Not checked (named why); does not affect the verdict.
    Skip,
    /// Works, but worth a look.
    Warn,
    /// The provider would fail here.
    Block,
}

impl Status {
    fn shown(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::Skip => "skip",
            Self::Warn => "WARN",
            Self::Block => "BLOCK",
        }
    }
}

/// One line of the report.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Check {
    /// The zone (one libvirt host), or `-` for the configuration as a whole.
    pub zone: String,
    /// What was checked.
    pub check: &'static str,
    /// The outcome.
    pub status: Status,
    /// What was found.
    pub detail: String,
    /// How to fix it; empty when nothing needs fixing.
    pub fix: String,
}

/// Every check and the verdict.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Report {
    /// The checks, configuration first, then zone by zone.
    pub checks: Vec<Check>,
    /// How many checks block.
    pub blockers: usize,
    /// How many checks warn.
    pub warnings: usize,
    /// `ok`, `warnings` or `blocked`.
    pub verdict: &'static str,
}

impl Report {
    fn new(checks: Vec<Check>) -> Self {
        let count = |s| checks.iter().filter(|c| c.status == s).count();
        let (blockers, warnings) = (count(Status::Block), count(Status::Warn));
        let verdict = match (blockers, warnings) {
            (0, 0) => "ok",
            (0, _) => "warnings",
            _ => "blocked",
        };
        Self {
            checks,
            blockers,
            warnings,
            verdict,
        }
    }

    /// The report of a configuration the provider would refuse at start-up.
    #[must_use]
    pub fn refused_configuration(error: &str) -> Self {
        Self::new(vec![check(
            "-",
            "configuration",
            Status::Block,
            error.to_owned(),
            "correct the flag named above; the provider refuses to start with it",
        )])
    }

    /// 0 when nothing blocks or warns, 1 when something blocks, 2 for warnings only.
    #[must_use]
    pub fn exit_code(&self) -> u8 {
        match (self.blockers, self.warnings) {
            (0, 0) => 0,
            (0, _) => 2,
            _ => 1,
        }
    }
}

/// A probe's answer about one object on a host.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Probe<T> {
    /// It exists; what it looks like.
    Found(T),
    /// It does not exist.
    Missing,
    /// The host's driver cannot answer this question (the reason).
    Unsupported(String),
    /// The question failed (the error).
    Failed(String),
}

/// The connection to one host.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Connection {
    /// libvirt's driver name (`QEMU`, `TEST`).
    pub driver: String,
    /// libvirt's version, `major * 1_000_000 + minor * 1000 + release`.
    pub libvirt_version: u32,
    /// The hypervisor's version, in the same encoding.
    pub hypervisor_version: u32,
    /// Physical CPUs.
    pub cpus: u32,
    /// Memory in KiB.
    pub memory_kib: u64,
}

/// What the host says about running the provider's domains.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DomainCaps {
    /// The machine type the `q35` alias resolves to.
    pub machine: String,
    /// Whether the host boots guests of that type (`<os supported='yes'>`).
    pub os_supported: bool,
    /// Whether a `unix` channel (the guest-agent channel) is supported; `None` when this
    /// libvirt does not list channel types.
    pub unix_channel: Option<bool>,
}

/// A storage pool.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pool {
    /// Its type (`dir`, `logical`, …).
    pub kind: String,
    /// Whether it is active.
    pub active: bool,
    /// Capacity in bytes.
    pub capacity: u64,
    /// Free bytes.
    pub available: u64,
}

/// A storage volume.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Volume {
    /// Its format (`qcow2`, `raw`).
    pub format: String,
    /// Virtual size in bytes.
    pub capacity: u64,
}

/// The domains on a host.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Domains {
    /// Domains tagged as this provider's.
    pub ours: usize,
    /// Of those, how many run.
    pub ours_running: usize,
    /// This provider's domains for machine ids no configured slot has (their names).
    pub orphans: Vec<String>,
    /// Domains of anybody else.
    pub others: usize,
}

/// Everything the probe read from one host.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostFacts {
    /// The zone.
    pub zone: String,
    /// The `--connect` URI.
    pub uri: String,
    /// The connection, or why it failed. When it failed nothing else was read.
    pub connection: Result<Connection, String>,
    /// Domain capabilities for `--domain-type`.
    pub domain_caps: Probe<DomainCaps>,
    /// `--storage-pool`.
    pub pool: Probe<Pool>,
    /// `--image` in that pool.
    pub image: Probe<Volume>,
    /// `--network` and whether it is active; `None` when `--network` is empty.
    pub network: Option<Probe<bool>>,
    /// The domains on the host.
    pub domains: Probe<Domains>,
}

/// One instance type's slots in one zone.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Slots {
    /// The instance type.
    pub instance_type: String,
    /// How many slots the offerings declare.
    pub count: usize,
    /// vCPUs per slot.
    pub vcpu: u64,
    /// MiB per slot.
    pub memory_mib: u64,
}

/// What the flags would run.
#[derive(Clone, Debug)]
pub struct Expectations {
    /// `--image`.
    pub image: String,
    /// `--image-source`, read and hashed (then `image` is its volume).
    pub image_source: Option<Arc<GoldenImage>>,
    /// `--storage-pool`.
    pub storage_pool: String,
    /// `--network` (empty: no NIC).
    pub network: String,
    /// `--domain-type`.
    pub domain_type: String,
    /// `--base-user-data`: its path and size, or the read error; `None` when unset.
    pub user_data: Option<(String, Result<usize, String>)>,
    /// The allocation ratios and reserves.
    pub capacity: CapacityPolicy,
    /// Per zone, the slots the offerings declare.
    pub slots: Vec<(String, Vec<Slots>)>,
}

fn check(zone: &str, name: &'static str, status: Status, detail: String, fix: &str) -> Check {
    Check {
        zone: zone.to_owned(),
        check: name,
        status,
        detail,
        fix: fix.to_owned(),
    }
}

fn version(v: u32) -> String {
    format!("{}.{}.{}", v / 1_000_000, (v / 1000) % 1000, v % 1000)
}

fn gib(bytes: u64) -> String {
    #[allow(clippy::cast_precision_loss)]
    let value = bytes as f64 / f64::from(1u32 << 30);
    format!("{value:.1} GiB")
}

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
            let (detail, fix) = crate::credentials::connection_block(&host.uri, e);
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
    out.extend(storage(want, host, slots));
    out.push(network(want, zone, host.network.as_ref()));
    out.push(capacity(want, zone, connection, slots));
    out.push(domains(zone, &host.domains));
}

fn domain_type(want: &Expectations, zone: &str, caps: &Probe<DomainCaps>) -> Check {
    let kind = want.domain_type.as_str();
    let fix = if kind == "kvm" {
        "enable KVM on the host (load kvm_intel or kvm_amd and give libvirt /dev/kvm), or \
         pass --domain-type=qemu for software emulation (slow)"
    } else {
        "install QEMU for x86_64 on the host (qemu-system-x86)"
    };
    match caps {
        Probe::Found(c) if !c.os_supported => check(
            zone,
            "domain type",
            Status::Block,
            format!("{kind} guests of machine type {} cannot boot", c.machine),
            fix,
        ),
        Probe::Found(DomainCaps {
            unix_channel: Some(false),
            ..
        }) => check(
            zone,
            "domain type",
            Status::Block,
            format!("{kind} usable, but no unix channel for the guest agent"),
            "use a libvirt and QEMU with virtio-serial unix channels",
        ),
        Probe::Found(c) => {
            let channel = if c.unix_channel.is_some() {
                "guest-agent channel supported"
            } else {
                "channel types not listed by this libvirt"
            };
            check(
                zone,
                "domain type",
                Status::Ok,
                format!("{kind} usable, machine q35 is {}, {channel}", c.machine),
                "",
            )
        }
        Probe::Missing | Probe::Failed(_) => {
            let why = match caps {
                Probe::Failed(e) => e.as_str(),
                _ => "no domain capabilities",
            };
            check(
                zone,
                "domain type",
                Status::Block,
                format!("{kind} unusable: {why}"),
                fix,
            )
        }
        Probe::Unsupported(why) => check(
            zone,
            "domain type",
            Status::Skip,
            format!("not checked: {why}"),
            "",
        ),
    }
}

fn storage(want: &Expectations, host: &HostFacts, slots: &[Slots]) -> Vec<Check> {
    let (pool_check, usable) = pool(want, host);
    let mut out = vec![pool_check];
    match usable {
        Some(facts) => out.extend(image(want, host, facts, slots)),
        None => out.push(check(
            &host.zone,
            "image",
            Status::Skip,
            format!(
                "not checked: storage pool {} is not usable",
                want.storage_pool
            ),
            "",
        )),
    }
    out
}

/// The pool's check, and its facts when it is usable.
fn pool<'a>(want: &Expectations, host: &'a HostFacts) -> (Check, Option<&'a Pool>) {
    let zone = host.zone.as_str();
    let pool = want.storage_pool.as_str();
    match &host.pool {
        Probe::Found(p) if p.active => (
            check(
                zone,
                "storage pool",
                Status::Ok,
                format!(
                    "{pool}: type {}, active, {} free of {}",
                    p.kind,
                    gib(p.available),
                    gib(p.capacity)
                ),
                "",
            ),
            Some(p),
        ),
        Probe::Found(_) => (
            check(
                zone,
                "storage pool",
                Status::Block,
                format!("{pool} exists but is not active"),
                &format!("start it: virsh pool-start {pool} && virsh pool-autostart {pool}"),
            ),
            None,
        ),
        Probe::Missing => (
            check(
                zone,
                "storage pool",
                Status::Block,
                format!("there is no storage pool {pool}"),
                &format!(
                    "create it (virsh pool-define-as {pool} dir --target /var/lib/libvirt/images \
                         && virsh pool-build {pool} && virsh pool-start {pool} && virsh \
                         pool-autostart {pool}) or pass --storage-pool with an existing pool"
                ),
            ),
            None,
        ),
        Probe::Unsupported(e) | Probe::Failed(e) => (
            check(
                zone,
                "storage pool",
                Status::Block,
                format!("{pool}: {e}"),
                "check that this process may read the pool",
            ),
            None,
        ),
    }
}

/// The image's check and, when it is there, the pool-space check.
fn image(want: &Expectations, host: &HostFacts, pool_facts: &Pool, slots: &[Slots]) -> Vec<Check> {
    let zone = host.zone.as_str();
    let pool = want.storage_pool.as_str();
    let image = want.image.as_str();
    let mut out = Vec::new();
    if let Some(golden) = &want.image_source {
        out.extend(golden::check_source(
            zone,
            pool,
            golden,
            &host.image,
            pool_facts,
        ));
        if matches!(host.image, Probe::Missing) {
            return out;
        }
    }
    match &host.image {
        Probe::Found(v) => {
            let usable = matches!(v.format.as_str(), "qcow2" | "raw");
            out.push(check(
                zone,
                "image",
                if usable { Status::Ok } else { Status::Warn },
                format!(
                    "{image} in {pool}: format {}, virtual size {}",
                    v.format,
                    gib(v.capacity)
                ),
                if usable {
                    ""
                } else {
                    "use a qcow2 or raw golden image"
                },
            ));
            out.push(pool_space(zone, v, pool_facts, slots));
        }
        Probe::Missing => out.push(check(
            zone,
            "image",
            Status::Block,
            format!("there is no golden image volume {image} in pool {pool}"),
            &format!(
                "upload it: virsh vol-create-as {pool} {image} SIZE --format qcow2 && virsh \
                 vol-upload --pool {pool} {image} FILE, or pass --image with a volume of that pool"
            ),
        )),
        Probe::Unsupported(e) | Probe::Failed(e) => out.push(check(
            zone,
            "image",
            Status::Block,
            format!("{image}: {e}"),
            "check that this process may read the volume",
        )),
    }
    out
}

/// Whether the pool could hold every slot's overlay grown to the image's full size.
fn pool_space(zone: &str, v: &Volume, pool_facts: &Pool, slots: &[Slots]) -> Check {
    let count: u64 = slots.iter().map(|s| s.count as u64).sum();
    let worst = v.capacity.saturating_mul(count);
    if worst <= pool_facts.available {
        check(
            zone,
            "pool space",
            Status::Ok,
            format!(
                "overlays are thin; even {count} full overlays ({}) fit in {} free",
                gib(worst),
                gib(pool_facts.available)
            ),
            "",
        )
    } else {
        check(
            zone,
            "pool space",
            Status::Warn,
            format!(
                "overlays are thin, but {count} full overlays would need {} and {} is free",
                gib(worst),
                gib(pool_facts.available)
            ),
            "watch the pool's usage, or grow it",
        )
    }
}

fn network(want: &Expectations, zone: &str, network: Option<&Probe<bool>>) -> Check {
    let name = want.network.as_str();
    match network {
        None => check(
            zone,
            "network",
            Status::Ok,
            "--network is empty: guests get no NIC".to_owned(),
            "",
        ),
        Some(Probe::Found(true)) => {
            check(zone, "network", Status::Ok, format!("{name}: active"), "")
        }
        Some(Probe::Found(false)) => check(
            zone,
            "network",
            Status::Block,
            format!("{name} exists but is not active"),
            &format!("start it: virsh net-start {name} && virsh net-autostart {name}"),
        ),
        Some(Probe::Missing) => check(
            zone,
            "network",
            Status::Block,
            format!("there is no network {name}"),
            "define and start it on the host, pass --network with an existing network, or \
             --network= for guests without a NIC",
        ),
        Some(Probe::Unsupported(e) | Probe::Failed(e)) => check(
            zone,
            "network",
            Status::Block,
            format!("{name}: {e}"),
            "check that this process may read the network",
        ),
    }
}

fn capacity(want: &Expectations, zone: &str, connection: &Connection, slots: &[Slots]) -> Check {
    let total = allocatable_for(connection.cpus, connection.memory_kib, &want.capacity);
    let mut parts = Vec::new();
    let (mut vcpu, mut memory) = (0u64, 0u64);
    for s in slots {
        let alone = (total.vcpu / s.vcpu.max(1)).min(total.memory_mib / s.memory_mib.max(1));
        parts.push(format!(
            "{} {} declared, {alone} fit alone",
            s.instance_type, s.count
        ));
        vcpu = vcpu.saturating_add(s.vcpu.saturating_mul(s.count as u64));
        memory = memory.saturating_add(s.memory_mib.saturating_mul(s.count as u64));
    }
    let detail = format!(
        "{}; all need {vcpu} vCPU and {memory} MiB of {} vCPU and {} MiB allocatable",
        parts.join(", "),
        total.vcpu,
        total.memory_mib
    );
    if vcpu <= total.vcpu && memory <= total.memory_mib {
        check(zone, "capacity", Status::Ok, detail, "")
    } else {
        check(
            zone,
            "capacity",
            Status::Warn,
            detail,
            "not every slot can run at once (the provider withholds what does not fit): add \
             a host, lower the counts, or raise --cpu-allocation-ratio / \
             --memory-allocation-ratio",
        )
    }
}

fn domains(zone: &str, domains: &Probe<Domains>) -> Check {
    match domains {
        Probe::Found(d) if d.orphans.is_empty() => check(
            zone,
            "domains",
            Status::Ok,
            format!(
                "{} of this provider's ({} running), {} others, no orphans",
                d.ours, d.ours_running, d.others
            ),
            "",
        ),
        Probe::Found(d) => check(
            zone,
            "domains",
            Status::Warn,
            format!(
                "{} of this provider's ({} running), {} others; orphans (no configured slot): {}",
                d.ours,
                d.ours_running,
                d.others,
                d.orphans.join(", ")
            ),
            "report only: remove them by hand, or let the provider collect them (--gc-orphans)",
        ),
        Probe::Missing | Probe::Unsupported(_) | Probe::Failed(_) => {
            let why = match domains {
                Probe::Unsupported(e) | Probe::Failed(e) => e.as_str(),
                _ => "no answer",
            };
            check(
                zone,
                "domains",
                Status::Warn,
                format!("cannot list domains: {why}"),
                "check that this process may list the host's domains",
            )
        }
    }
}

/// The report for a person: one line per check, its fix beneath it, then the verdict.
#[must_use]
pub fn table(report: &Report) -> String {
    let width = |f: fn(&Check) -> usize, title: &str| {
        report
            .checks
            .iter()
            .map(f)
            .max()
            .unwrap_or(0)
            .max(title.len())
    };
    let zone_w = width(|c| c.zone.chars().count(), "ZONE");
    let check_w = width(|c| c.check.len(), "CHECK");
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<zone_w$}  {:<check_w$}  STATUS  DETAIL",
        "ZONE", "CHECK"
    );
    for c in &report.checks {
        let detail: String = c
            .detail
            .chars()
            .map(|ch| {
                if ch.is_control() {
                    ch.escape_debug().collect()
                } else {
                    ch.to_string()
                }
            })
            .collect();
        let _ = writeln!(
            out,
            "{:<zone_w$}  {:<check_w$}  {:<6}  {}",
            c.zone,
            c.check,
            c.status.shown(),
            detail
        );
        if !c.fix.is_empty() {
            let _ = writeln!(
                out,
                "{:<zone_w$}  {:<check_w$}          fix: {}",
                "", "", c.fix
            );
        }
    }
    let verdict = match report.verdict {
        "ok" => "nothing blocks: the provider can serve as configured",
        "warnings" => "nothing blocks, but read the warnings",
        _ => "blocked: the provider would fail as configured; fix the BLOCK lines",
    };
    let plural = |n: usize, word: &str| format!("{n} {word}{}", if n == 1 { "" } else { "s" });
    let _ = writeln!(
        out,
        "\nverdict: {} ({}, {})",
        verdict,
        plural(report.blockers, "blocker"),
        plural(report.warnings, "warning")
    );
    out
}

#[cfg(test)]
#[path = "doctor_tests.rs"]
mod tests;

#[path = "doctor_golden.rs"]
mod golden;
