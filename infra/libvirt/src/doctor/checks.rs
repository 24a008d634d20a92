//! The doctor's checks of one host, each judging one probed fact against what the flags
//! would run, with the fix when it fails.

use super::facts::{
    Connection, DomainCaps, Domains, Expectations, HostFacts, Pool, Probe, Slots, Volume,
};
use super::golden;
use super::report::{Check, Status, check, gib};
use crate::host::capacity::{Carved, Node, allocatable};
use crate::options::IgnitionDelivery;

pub(super) fn version(v: u32) -> String {
    format!("{}.{}.{}", v / 1_000_000, (v / 1000) % 1000, v % 1000)
}

pub(super) fn domain_type(want: &Expectations, zone: &str, caps: &Probe<DomainCaps>) -> Check {
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

pub(super) fn storage(want: &Expectations, host: &HostFacts, slots: &[Slots]) -> Vec<Check> {
    let (pool_check, usable) = pool(want, host);
    let mut out = vec![pool_check];
    match usable {
        Some(facts) => {
            out.extend(super::ceph::checks(want, host, facts));
            out.extend(image(want, host, facts, slots));
        }
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

/// An inactive storage pool. libvirt leaves rbd pools inactive after every restart of its
/// daemon, and the provider starts its own when it connects (`host::pools`): a warning. A
/// local pool that is inactive was stopped by someone: it blocks.
fn inactive_pool(zone: &str, pool: &str, kind: &str) -> Check {
    if kind == "rbd" {
        return check(
            zone,
            "storage pool",
            Status::Warn,
            format!(
                "{pool} is an rbd pool and is not active (libvirt leaves rbd pools inactive \
                 whenever its daemon restarts); its space and image are not checked"
            ),
            &format!(
                "the provider starts it when it connects to this host; to start it now: virsh \
                 pool-start {pool}"
            ),
        );
    }
    check(
        zone,
        "storage pool",
        Status::Block,
        format!("{pool} exists but is not active"),
        &format!("start it: virsh pool-start {pool} && virsh pool-autostart {pool}"),
    )
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
        Probe::Found(p) => (inactive_pool(zone, pool, &p.kind), None),
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
            out.push(disk_sizes(zone, v, slots));
            out.push(pool_space(want, zone, v, pool_facts, slots));
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
/// Whether every served type's root holds the image, and each type's disks.
fn disk_sizes(zone: &str, v: &Volume, slots: &[Slots]) -> Check {
    let mut shapes = Vec::new();
    for s in slots {
        let root = match s.disks.root_bytes(&s.instance_type, v.capacity) {
            Ok(root) => root,
            Err(why) => {
                let fix = format!(
                    "set {}'s disk_gib to at least {} in --instance-types, or use a smaller \
                     golden image",
                    s.instance_type,
                    v.capacity.div_ceil(1 << 30)
                );
                return check(zone, "disk sizes", Status::Block, why, &fix);
            }
        };
        let data: Vec<String> = s
            .disks
            .data
            .iter()
            .map(|d| d.size_gib.to_string())
            .collect();
        let data = if data.is_empty() {
            "no data disks".to_owned()
        } else {
            format!("data {} GiB", data.join("+"))
        };
        shapes.push(format!(
            "{}: root {} GiB, {data}",
            s.instance_type,
            root >> 30
        ));
    }
    check(zone, "disk sizes", Status::Ok, shapes.join("; "), "")
}

/// Whether the disk the provider offers (the pool's capacity times
/// `--disk-allocation-ratio`, less the golden image) holds every slot's disks at their
/// virtual size; slots beyond it are withheld.
fn pool_space(
    want: &Expectations,
    zone: &str,
    v: &Volume,
    pool_facts: &Pool,
    slots: &[Slots],
) -> Check {
    let count: u64 = slots.iter().map(|s| s.count as u64).sum();
    let worst = (slots.iter())
        .map(|s| {
            let root = s
                .disks
                .root_bytes(&s.instance_type, v.capacity)
                .unwrap_or(v.capacity);
            let each = root.saturating_add(s.disks.data_bytes());
            each.saturating_mul(s.count as u64)
        })
        .fold(0, u64::saturating_add);
    let ratio = want.capacity.disk_ratio;
    #[allow(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        clippy::cast_precision_loss
    )]
    let offered = ((pool_facts.capacity as f64 * ratio).floor() as u64).saturating_sub(v.capacity);
    let written = pool_facts.capacity.saturating_sub(pool_facts.available);
    let offer = format!(
        "the {} the provider offers (capacity {} × --disk-allocation-ratio {ratio}, less the \
         golden image); {} of the pool is written",
        gib(offered),
        gib(pool_facts.capacity),
        gib(written)
    );
    if worst <= offered {
        let detail = format!("{count} machines' disks ({}) fit in {offer}", gib(worst));
        check(zone, "pool space", Status::Ok, detail, "")
    } else {
        let detail = format!(
            "{count} machines' disks need {} at their virtual size, more than {offer}; the \
             slots beyond it are withheld",
            gib(worst)
        );
        let fix = "grow the pool, lower the counts or the types' disks, or raise \
                   --disk-allocation-ratio if the disks stay thin (and watch the pool's \
                   allocation)";
        check(zone, "pool space", Status::Warn, detail, fix)
    }
}

pub(super) fn network(want: &Expectations, zone: &str, network: Option<&Probe<bool>>) -> Check {
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

pub(super) fn capacity(
    want: &Expectations,
    zone: &str,
    connection: &Connection,
    slots: &[Slots],
) -> Check {
    let total = allocatable(
        Node {
            cpus: connection.cpus,
            memory_kib: connection.memory_kib,
        },
        None,
        &want.capacity,
        Carved::default(),
    );
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

pub(super) fn domains(zone: &str, domains: &Probe<Domains>) -> Check {
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

/// `vtpm`: when a type served on this host asks for a TPM, whether libvirt can emulate one;
/// no line when none does.
pub(super) fn tpm(zone: &str, caps: &Probe<DomainCaps>, slots: &[Slots]) -> Option<Check> {
    let wanted = Wanted {
        line: "vtpm",
        ok: "an emulated TPM 2.0",
        asked: "a TPM",
        cannot: "libvirt cannot emulate one on this host",
        unknown: "this libvirt does not say whether it can emulate one",
        fix: "install swtpm and swtpm-tools on the host and restart libvirtd; `virsh \
              domcapabilities` then lists `emulator` among <tpm>'s backendModel values",
    };
    let asking = slots.iter().filter(|s| s.tpm);
    capability(zone, caps, asking, &wanted, |c| c.tpm_emulator)
}

/// `secure boot`: when a type served on this host asks for Secure Boot, whether libvirt has
/// a UEFI firmware build that enforces it; no line when none does.
pub(super) fn secure_boot(zone: &str, caps: &Probe<DomainCaps>, slots: &[Slots]) -> Option<Check> {
    let wanted = Wanted {
        line: "secure boot",
        ok: "UEFI Secure Boot firmware",
        asked: "Secure Boot",
        cannot: "libvirt finds no Secure Boot firmware on this host",
        unknown: "this libvirt does not say whether it has Secure Boot firmware",
        fix: "install the UEFI firmware with its Secure Boot builds and their descriptors \
              (Debian: ovmf, which ships OVMF_CODE_4M.ms.fd and its descriptor) and restart \
              libvirtd; `virsh domcapabilities` then lists `yes` among the loader's `secure` \
              values",
    };
    let asking = slots.iter().filter(|s| s.secure_boot);
    capability(zone, caps, asking, &wanted, |c| c.secure_boot)
}

/// The first libvirt with `<sysinfo type='fwcfg'>`.
const FW_CFG_SINCE: u32 = 6_005_000;

/// `ignition`: when a type boots by Ignition (`delivery`), whether this host's libvirt can
/// hand the config to QEMU as a firmware configuration entry; no line otherwise.
pub(super) fn ignition(
    zone: &str,
    delivery: Option<IgnitionDelivery>,
    libvirt_version: u32,
) -> Option<Check> {
    let line = |status, detail: String, fix| check(zone, "ignition", status, detail, fix);
    Some(match delivery? {
        IgnitionDelivery::ConfigDrive => line(
            Status::Ok,
            "configs go on a config drive (config-2), which every libvirt attaches".to_owned(),
            "",
        ),
        IgnitionDelivery::FwCfg if libvirt_version >= FW_CFG_SINCE => line(
            Status::Ok,
            format!(
                "libvirt {} hands configs to QEMU as opt/com.coreos/config",
                version(libvirt_version)
            ),
            "",
        ),
        IgnitionDelivery::FwCfg => line(
            Status::Block,
            format!(
                "libvirt {} predates <sysinfo type='fwcfg'> (6.5.0), so Ignition configs \
                 cannot reach QEMU's firmware configuration here",
                version(libvirt_version)
            ),
            "upgrade libvirt on this host to 6.5.0 or later, or use --ignition-delivery \
             config-drive with an image whose Ignition reads an OpenStack config drive",
        ),
    })
}

/// The words of a capability line ([`capability`]).
struct Wanted {
    line: &'static str,
    ok: &'static str,
    asked: &'static str,
    cannot: &'static str,
    unknown: &'static str,
    fix: &'static str,
}

/// A line on a capability the domain capabilities state (`has`), for the types `asking`:
/// none when no type asks, Ok when the host has it, Block when it has not, Warn when this
/// libvirt does not say, Skip when the capabilities could not be read.
fn capability<'a>(
    zone: &str,
    caps: &Probe<DomainCaps>,
    asking: impl Iterator<Item = &'a Slots>,
    wanted: &Wanted,
    has: impl Fn(&DomainCaps) -> Option<bool>,
) -> Option<Check> {
    let asking: Vec<&str> = asking.map(|s| s.instance_type.as_str()).collect();
    if asking.is_empty() {
        return None;
    }
    let (line, types) = (wanted.line, asking.join(", "));
    let found = match caps {
        Probe::Found(c) => has(c),
        Probe::Failed(e) | Probe::Unsupported(e) => {
            let detail = format!("not checked: {e}");
            return Some(check(zone, line, Status::Skip, detail, ""));
        }
        Probe::Missing => {
            let detail = "not checked: no domain capabilities".to_owned();
            return Some(check(zone, line, Status::Skip, detail, ""));
        }
    };
    let (status, detail, fix) = match found {
        Some(true) => (Status::Ok, format!("{} for {types}", wanted.ok), ""),
        Some(false) => {
            let detail = format!("{} for {types}, and {}", wanted.asked, wanted.cannot);
            (Status::Block, detail, wanted.fix)
        }
        None => {
            let detail = format!("{} for {types}; {}", wanted.asked, wanted.unknown);
            (Status::Warn, detail, wanted.fix)
        }
    };
    Some(check(zone, line, status, detail, fix))
}
