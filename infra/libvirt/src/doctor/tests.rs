//! The doctor's judgement on facts the libvirt test driver cannot stage: an inactive pool
//! or network, KVM missing, a host whose guests cannot boot, orphans, and the exit codes.

use super::*;
use crate::options::{CapacityPolicy, IgnitionDelivery};

pub(super) fn want() -> Expectations {
    Expectations {
        image: "base.qcow2".to_owned(),
        image_source: None,
        storage_pool: "default".to_owned(),
        seed_pool: "default".to_owned(),
        network: "default".to_owned(),
        domain_type: "kvm".to_owned(),
        user_data: None,
        capacity: CapacityPolicy::default(),
        budget: crate::host::lanes::Budget::default(),
        connections: 4,
        max_client_requests: 5,
        slots: vec![(
            "a".to_owned(),
            vec![Slots {
                instance_type: "kvm.small".to_owned(),
                count: 2,
                vcpu: 2,
                memory_mib: 4096,
                disks: bigfleet_libvirt_domain::catalog::DiskShape::default(),
                placement: bigfleet_libvirt_domain::catalog::Placement::default(),
                devices: std::collections::BTreeMap::new(),
                tpm: false,
                secure_boot: false,
            }],
        )],
        classes: bigfleet_libvirt_domain::catalog::DeviceClasses::default(),
        ignition: None,
    }
}

pub(super) fn good() -> HostFacts {
    HostFacts {
        zone: "a".to_owned(),
        uri: "qemu:///system".to_owned(),
        connection: Ok(Connection {
            driver: "QEMU".to_owned(),
            libvirt_version: 9_000_000,
            hypervisor_version: 7_002_000,
            cpus: 16,
            memory_kib: 64 << 20,
        }),
        domain_caps: Probe::Found(DomainCaps {
            machine: "pc-q35-7.2".to_owned(),
            os_supported: true,
            unix_channel: Some(true),
            tpm_emulator: Some(false),
            secure_boot: None,
        }),
        seed_pool: None,
        pool: Probe::Found(Pool {
            kind: "dir".to_owned(),
            active: true,
            capacity: 100 << 30,
            available: 90 << 30,
            rbd: None,
        }),
        image: Probe::Found(Volume {
            format: "qcow2".to_owned(),
            capacity: 10 << 30,
        }),
        network: Some(Probe::Found(true)),
        domains: Probe::Found(Domains::default()),
        cpu_trials: None,
        max_client_requests: Probe::Unsupported("no admin API".to_owned()),
        max_workers: Probe::Unsupported("no admin API".to_owned()),
        topology: None,
        held_devices: None,
    }
}

pub(super) fn status(report: &Report, zone: &str, name: &str) -> (Status, String, String) {
    let check = report
        .checks
        .iter()
        .find(|c| c.zone == zone && c.check == name)
        .unwrap_or_else(|| panic!("no {name} in {report:#?}"));
    (check.status, check.detail.clone(), check.fix.clone())
}

#[test]
fn a_good_host_is_ok_with_exit_0() {
    let report = judge(&want(), &[good()]);
    assert_eq!(report.verdict, "ok", "{report:#?}");
    assert_eq!(report.exit_code(), 0);
    let (_, detail, _) = status(&report, "a", "connection");
    assert!(
        detail.contains("libvirt 9.0.0, hypervisor 7.2.0"),
        "{detail}"
    );
}

/// The doctor's report on a good host whose storage pool, of `kind`, is inactive.
fn with_inactive_pool(kind: &str) -> Report {
    let mut host = good();
    host.pool = Probe::Found(Pool {
        kind: kind.to_owned(),
        active: false,
        capacity: 0,
        available: 0,
        rbd: None,
    });
    judge(&want(), &[host])
}

#[test]
fn an_inactive_pool_blocks_and_says_how_to_start_it() {
    let report = with_inactive_pool("dir");
    assert_eq!(report.exit_code(), 1);
    let (s, detail, fix) = status(&report, "a", "storage pool");
    assert_eq!(s, Status::Block);
    assert!(detail.contains("not active"), "{detail}");
    assert!(fix.contains("virsh pool-start default"), "{fix}");
    assert_eq!(status(&report, "a", "image").0, Status::Skip);
}

#[test]
fn an_inactive_rbd_pool_warns_that_the_provider_starts_it() {
    let report = with_inactive_pool("rbd");
    let (s, detail, fix) = status(&report, "a", "storage pool");
    assert_eq!(s, Status::Warn, "{detail}");
    assert!(detail.contains("daemon restarts"), "{detail}");
    assert!(fix.contains("the provider starts it"), "{fix}");
    assert!(fix.contains("virsh pool-start default"), "{fix}");
}

#[test]
fn an_inactive_network_blocks() {
    let mut host = good();
    host.network = Some(Probe::Found(false));
    let report = judge(&want(), &[host]);
    let (s, _, fix) = status(&report, "a", "network");
    assert_eq!(s, Status::Block);
    assert!(fix.contains("virsh net-start default"), "{fix}");
}

#[test]
fn kvm_unusable_blocks_and_offers_qemu() {
    let mut host = good();
    host.domain_caps = Probe::Failed(
        "invalid argument: KVM is not supported by '/usr/bin/qemu-system-x86_64' on this host"
            .to_owned(),
    );
    let report = judge(&want(), &[host]);
    let (s, detail, fix) = status(&report, "a", "domain type");
    assert_eq!(s, Status::Block);
    assert!(
        detail.starts_with("kvm unusable: invalid argument"),
        "{detail}"
    );
    assert!(fix.contains("--domain-type=qemu"), "{fix}");
}

#[test]
fn guests_that_cannot_boot_or_talk_to_the_agent_block() {
    let mut host = good();
    host.domain_caps = Probe::Found(DomainCaps {
        machine: "pc-q35-7.2".to_owned(),
        os_supported: false,
        unix_channel: Some(true),
        tpm_emulator: None,
        secure_boot: None,
    });
    assert_eq!(
        status(&judge(&want(), &[host.clone()]), "a", "domain type").0,
        Status::Block
    );
    host.domain_caps = Probe::Found(DomainCaps {
        machine: "pc-q35-7.2".to_owned(),
        os_supported: true,
        unix_channel: Some(false),
        tpm_emulator: None,
        secure_boot: None,
    });
    let (s, detail, _) = status(&judge(&want(), &[host]), "a", "domain type");
    assert_eq!(s, Status::Block);
    assert!(detail.contains("guest agent"), "{detail}");
}

#[test]
fn an_unreachable_host_blocks_its_connection_only() {
    let mut host = good();
    host.connection = Err("connect: Failed to connect socket".to_owned());
    let report = judge(&want(), &[host]);
    let (s, detail, fix) = status(&report, "a", "connection");
    assert_eq!(s, Status::Block);
    assert!(detail.contains("qemu:///system: connect"), "{detail}");
    assert!(fix.contains("--connect"), "{fix}");
    assert!(
        !report.checks.iter().any(|c| c.check == "image"),
        "nothing else is claimed about an unreachable host"
    );
}

#[test]
fn orphans_and_tight_pools_warn_with_exit_2() {
    let mut host = good();
    host.domains = Probe::Found(Domains {
        ours: 3,
        ours_running: 2,
        orphans: vec!["bigfleet-0123".to_owned()],
        others: 1,
    });
    host.pool = Probe::Found(Pool {
        kind: "logical".to_owned(),
        active: true,
        capacity: 20 << 30,
        available: 15 << 30,
        rbd: None,
    });
    let report = judge(&want(), &[host]);
    assert_eq!(report.verdict, "warnings");
    assert_eq!(report.exit_code(), 2);
    let (s, detail, fix) = status(&report, "a", "domains");
    assert_eq!(s, Status::Warn);
    assert!(detail.contains("bigfleet-0123"), "{detail}");
    assert!(fix.contains("--gc-orphans"), "{fix}");
    assert_eq!(status(&report, "a", "pool space").0, Status::Warn);
}

/// `want()` with the slots' type given `disk_gib` and data disks of `data_gib` each.
fn shaped(disk_gib: u64, data_gib: &[u64]) -> Expectations {
    let mut expectations = want();
    let data = (data_gib.iter().enumerate())
        .map(
            |(i, &size_gib)| bigfleet_libvirt_domain::catalog::DataDisk {
                name: format!("data{}", i + 1),
                size_gib,
            },
        )
        .collect();
    expectations.slots[0].1[0].disks = bigfleet_libvirt_domain::catalog::DiskShape {
        root_gib: Some(disk_gib),
        data,
    };
    expectations
}

#[test]
fn a_root_smaller_than_the_image_blocks_naming_the_type_both_sizes_and_the_fix() {
    let report = judge(&shaped(8, &[]), &[good()]);
    assert_eq!(report.exit_code(), 1);
    let (s, detail, fix) = status(&report, "a", "disk sizes");
    assert_eq!(s, Status::Block);
    assert!(
        detail.contains("\"kvm.small\" has a 8 GiB root disk"),
        "{detail}"
    );
    assert!(detail.contains("10737418240 bytes (10 GiB"), "{detail}");
    assert!(fix.contains("disk_gib to at least 10"), "{fix}");
    let report = judge(&shaped(10, &[]), &[good()]);
    let (s, detail, _) = status(&report, "a", "disk sizes");
    assert_eq!(s, Status::Ok, "{detail}");
    assert!(
        detail.contains("kvm.small: root 10 GiB, no data disks"),
        "{detail}"
    );
}

#[test]
fn pool_space_counts_every_slots_root_and_data_disks() {
    // Two slots of 20 GiB roots and 5 + 20 GiB of data: 90 GiB, what the pool has free.
    let report = judge(&shaped(20, &[5, 20]), &[good()]);
    let (s, detail, _) = status(&report, "a", "pool space");
    assert_eq!(s, Status::Ok, "{detail}");
    assert!(detail.contains("90.0 GiB"), "{detail}");
    let (_, detail, _) = status(&report, "a", "disk sizes");
    assert!(
        detail.contains("kvm.small: root 20 GiB, data 5+20 GiB"),
        "{detail}"
    );
    let report = judge(&shaped(20, &[5, 21]), &[good()]);
    let (s, detail, _) = status(&report, "a", "pool space");
    assert_eq!(s, Status::Warn, "{detail}");
    assert!(detail.contains("92.0 GiB"), "{detail}");
    assert!(
        detail.contains("the slots beyond it are withheld"),
        "{detail}"
    );
    // Thin disks at twice the pool: 190 GiB offered.
    let mut thin = shaped(20, &[5, 21]);
    thin.capacity.disk_ratio = 2.0;
    let report = judge(&thin, &[good()]);
    let (s, detail, _) = status(&report, "a", "pool space");
    assert_eq!(s, Status::Ok, "{detail}");
    assert!(
        detail.contains("fit in the 190.0 GiB the provider offers"),
        "{detail}"
    );
    assert!(
        detail.contains("10.0 GiB of the pool is written"),
        "{detail}"
    );
}

#[test]
fn unreadable_user_data_blocks() {
    let mut expectations = want();
    expectations.user_data = Some(("/etc/user-data".to_owned(), Err("No such file".to_owned())));
    let report = judge(&expectations, &[good()]);
    assert_eq!(status(&report, "-", "base user data").0, Status::Block);
}

#[test]
fn a_refused_configuration_is_one_blocker() {
    let report = Report::refused_configuration("--image is required");
    assert_eq!(report.exit_code(), 1);
    assert_eq!(report.checks.len(), 1);
    let text = table(&report);
    assert!(text.contains("BLOCK   --image is required"), "{text}");
    assert!(text.contains("verdict: blocked"), "{text}");
}

#[test]
fn without_trial_domain_the_cpu_trial_is_skipped_and_says_how_to_ask() {
    let report = judge(&want(), &[good()]);
    let (s, detail, _) = status(&report, "a", "cpu trial");
    assert_eq!(s, Status::Skip);
    assert!(detail.contains("--trial-domain"), "{detail}");
    assert_eq!(
        report.verdict, "ok",
        "a skipped trial does not change the verdict"
    );
}

#[test]
fn a_cpu_mode_that_aborts_blocks_with_qemus_words_and_a_named_model_as_fix() {
    let mut host = good();
    host.cpu_trials = Some(vec![
        CpuTrial {
            cpu: "host-passthrough (the default)".to_owned(),
            host_cpu: true,
            used_by: vec!["kvm.small".to_owned()],
            outcome: Err(
                "libvirt would not start the trial domain t: internal error: qemu \
                          unexpectedly closed the monitor: failed to set MSR 0x10a"
                    .to_owned(),
            ),
        },
        CpuTrial {
            cpu: "qemu64".to_owned(),
            host_cpu: false,
            used_by: vec!["kvm.large".to_owned()],
            outcome: Ok("QEMU started the trial domain and it stayed up 1000ms".to_owned()),
        },
    ]);
    let report = judge(&want(), &[host]);
    assert_eq!(report.verdict, "blocked");
    let lines: Vec<&Check> = report
        .checks
        .iter()
        .filter(|c| c.check == "cpu trial")
        .collect();
    assert_eq!(lines.len(), 2, "{lines:#?}");
    assert_eq!(lines[0].status, Status::Block);
    assert!(
        lines[0].detail.contains("failed to set MSR 0x10a"),
        "{lines:#?}"
    );
    assert!(lines[0].detail.contains("for kvm.small"), "{lines:#?}");
    assert!(lines[0].fix.contains("--cpu"), "{lines:#?}");
    assert!(lines[0].fix.contains("nested KVM"), "{lines:#?}");
    assert_eq!(lines[1].status, Status::Ok);
    assert!(
        lines[1].detail.starts_with("qemu64 (for kvm.large)"),
        "{lines:#?}"
    );
}

#[test]
fn a_connection_loaded_to_libvirtds_limit_warns_and_names_the_settings() {
    let mut host = good();
    let (s, detail, _) = status(&judge(&want(), &[host.clone()]), "a", "host budget");
    assert_eq!(s, Status::Ok, "{detail}");
    assert!(
        detail.contains("at most 2 call(s) on a connection"),
        "{detail}"
    );
    assert!(
        detail.contains("below --host-max-client-requests 5 (libvirt does not report"),
        "{detail}"
    );
    // Unknown limit: the stated --host-max-client-requests is the yardstick. Six calls over two
    // connections put three on one: six requests with uploads.
    let mut over = want();
    over.budget = crate::host::lanes::Budget::new(6, 1).unwrap();
    over.connections = 2;
    let report = judge(&over, &[host.clone()]);
    let (s, detail, fix) = status(&report, "a", "host budget");
    assert_eq!(s, Status::Warn, "{detail}");
    assert!(
        detail.contains("at most 3 call(s) on a connection, 6 requests"),
        "{detail}"
    );
    assert!(fix.contains("set --host-connections 3"), "{fix}");
    assert!(fix.contains("lower --host-budget to 4"), "{fix}");
    assert!(
        fix.contains("max_client_requests in the host's libvirtd.conf"),
        "{fix}"
    );
    assert_eq!(report.exit_code(), 2, "a warning, not a blocker");
    // The same budget over three connections fits.
    over.connections = 3;
    assert_eq!(
        status(&judge(&over, &[host.clone()]), "a", "host budget").0,
        Status::Ok
    );
    // A limit read from the host wins over the default, both ways.
    over.connections = 2;
    host.max_client_requests = Probe::Found(20);
    assert_eq!(
        status(&judge(&over, &[host.clone()]), "a", "host budget").0,
        Status::Ok
    );
    host.max_client_requests = Probe::Found(3);
    let (s, _, fix) = status(&judge(&want(), &[host]), "a", "host budget");
    assert_eq!(s, Status::Warn);
    assert!(fix.contains("set --host-connections 7"), "{fix}");
}

#[test]
fn a_budget_near_libvirtds_workers_warns_and_names_the_setting() {
    let mut host = good();
    let (s, detail, _) = status(&judge(&want(), &[host.clone()]), "a", "host workers");
    assert_eq!(s, Status::Ok, "{detail}");
    assert!(
        detail.contains("--host-budget 7 leaves 13 of libvirtd's default max_workers"),
        "{detail}"
    );
    let mut busy = want();
    busy.budget = crate::host::lanes::Budget::new(16, 1).unwrap();
    busy.connections = 8;
    let report = judge(&busy, &[host.clone()]);
    let (s, detail, fix) = status(&report, "a", "host workers");
    assert_eq!(s, Status::Warn, "{detail}");
    assert!(detail.contains("leaves 4 of"), "{detail}");
    assert!(fix.contains("lower --host-budget to 15"), "{fix}");
    assert!(fix.contains("raise max_workers"), "{fix}");
    assert!(fix.contains("to 21 or more"), "{fix}");
    // A value read from the host wins over the default.
    host.max_workers = Probe::Found(40);
    assert_eq!(
        status(&judge(&busy, &[host]), "a", "host workers").0,
        Status::Ok
    );
}

#[test]
fn a_type_with_a_tpm_needs_swtpm_on_its_hosts() {
    let vtpm = |host: &HostFacts, want: &Expectations| {
        let report = judge(want, std::slice::from_ref(host));
        let found = report.checks.iter().find(|c| c.check == "vtpm");
        found.map(|c| (c.status, c.detail.clone(), c.fix.clone()))
    };
    let host = good();
    assert_eq!(vtpm(&host, &want()), None, "no type asks: no line");
    let mut asks = want();
    asks.slots[0].1[0].tpm = true;
    let (s, detail, fix) = vtpm(&host, &asks).unwrap();
    assert_eq!(s, Status::Block, "the good host has no swtpm");
    assert!(
        detail.starts_with("a TPM for kvm.small, and libvirt cannot"),
        "{detail}"
    );
    assert!(fix.contains("swtpm"), "{fix}");
    let mut with_swtpm = good();
    if let Probe::Found(caps) = &mut with_swtpm.domain_caps {
        caps.tpm_emulator = Some(true);
    }
    assert_eq!(vtpm(&with_swtpm, &asks).unwrap().0, Status::Ok);
    if let Probe::Found(caps) = &mut with_swtpm.domain_caps {
        caps.tpm_emulator = None;
    }
    assert_eq!(vtpm(&with_swtpm, &asks).unwrap().0, Status::Warn);
}

#[test]
fn a_secure_boot_type_needs_secure_boot_firmware_on_its_hosts() {
    let line = |host: &HostFacts, want: &Expectations| {
        let report = judge(want, std::slice::from_ref(host));
        let found = report.checks.iter().find(|c| c.check == "secure boot");
        found.map(|c| (c.status, c.detail.clone(), c.fix.clone()))
    };
    let mut host = good();
    assert_eq!(line(&host, &want()), None, "no type asks: no line");
    let mut asks = want();
    asks.slots[0].1[0].secure_boot = true;
    let (s, detail, fix) = line(&host, &asks).unwrap();
    assert_eq!(s, Status::Warn, "the good host's libvirt does not say");
    assert!(
        detail.starts_with("Secure Boot for kvm.small; "),
        "{detail}"
    );
    assert!(fix.contains("ovmf"), "{fix}");
    for (has, wanted) in [(Some(true), Status::Ok), (Some(false), Status::Block)] {
        if let Probe::Found(caps) = &mut host.domain_caps {
            caps.secure_boot = has;
        }
        assert_eq!(line(&host, &asks).unwrap().0, wanted, "{has:?}");
    }
}

#[test]
fn an_ignition_delivery_by_fw_cfg_needs_libvirt_6_5_on_its_hosts() {
    let line = |host: &HostFacts, want: &Expectations| {
        let report = judge(want, std::slice::from_ref(host));
        let found = report.checks.iter().find(|c| c.check == "ignition");
        found.map(|c| (c.status, c.detail.clone(), c.fix.clone()))
    };
    let mut host = good();
    assert_eq!(
        line(&host, &want()),
        None,
        "no type boots by Ignition: no line"
    );
    let mut fw_cfg = want();
    fw_cfg.ignition = Some(IgnitionDelivery::FwCfg);
    let (status, detail, _) = line(&host, &fw_cfg).unwrap();
    assert_eq!(status, Status::Ok, "{detail}");
    assert!(detail.contains("opt/com.coreos/config"), "{detail}");
    if let Ok(connection) = &mut host.connection {
        connection.libvirt_version = 6_004_000;
    }
    let (status, detail, fix) = line(&host, &fw_cfg).unwrap();
    assert_eq!(status, Status::Block);
    assert!(detail.starts_with("libvirt 6.4.0 predates"), "{detail}");
    assert!(fix.contains("--ignition-delivery config-drive"), "{fix}");
    let mut drive = want();
    drive.ignition = Some(IgnitionDelivery::ConfigDrive);
    assert_eq!(
        line(&host, &drive).unwrap().0,
        Status::Ok,
        "any libvirt attaches a disk"
    );
}
