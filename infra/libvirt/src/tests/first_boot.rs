//! Machines that configure at first boot (`"boot": "nocloud"`) on libvirt's test driver:
//! Create defines the domain and leaves it off; the drift watch does not report that resting
//! domain as stopped (while it still reports a destroyed one); Configure replaces the seed at
//! the size of the one holding the join blob and starts the domain (the test driver has no
//! guest agent, so the Configure then fails at once, as every Configure there does). The
//! seed's bytes and the guest reading them are walked in the real-QEMU tier.
//!
//! A type whose image runs no guest agent (`"guest_agent": false`) is Configured once its
//! domain runs with the blob, and its Drain shuts the guest down and writes the seed back.
//!
//! An Ignition type (`"boot": "ignition"`) gets its config volume with the domain, named
//! in the domain's `fwcfg` entry; Configure writes the blob into it for the start and out
//! again right after; Delete removes it.

use std::sync::Arc;
use std::time::Duration;

use bigfleet_libvirt_config::instance_types_from_json;
use bigfleet_libvirt_domain::OperationId;
use bigfleet_libvirt_ports::{BootstrapBlob, ConfigureRequest, DrainRequest, Hypervisor};

use super::watch::{destroy_behind, drift, pause, until};
use super::*;
use crate::options::{IgnitionDelivery, IgnitionSetup};
use crate::storage::volumes::{ignition_name, seed_name};
use bigfleet_libvirt_config::naming::domain_name;

/// The Ignition template of these tests.
const TEMPLATE: &[u8] = br#"{"ignition": {"version": "3.3.0"}}"#;

/// A first-boot `kvm.small` (booting by `boot`) and an agent-booted `kvm.medium`, one slot
/// each, watched every 100 ms; an Ignition template delivered by firmware configuration.
async fn first_boot_rig(boot: &str) -> Rig {
    first_boot_rig_with(&format!(r#""boot": "{boot}""#)).await
}

/// As [`first_boot_rig`], with `fields` (JSON members) in `kvm.small`'s entry.
async fn first_boot_rig_with(fields: &str) -> Rig {
    let catalog = instance_types_from_json(
        &format!(
            r#"{{"kvm.small": {{"vcpu": 2, "memory_mib": 4096, {fields}}},
                "kvm.medium": {{"vcpu": 2, "memory_mib": 4096}}}}"#
        ),
        "types.json",
    )
    .unwrap();
    let mut all = slots("libvirt", ZONE, "kvm.small", 1);
    all.extend(slots("libvirt", ZONE, "kvm.medium", 1));
    let setup = IgnitionSetup::parse(TEMPLATE, "t.ign", IgnitionDelivery::FwCfg).unwrap();
    rig_with(&Fixture::default(), all, |config| {
        config.catalog = catalog;
        config.hosts.watch_interval = Duration::from_millis(100);
        config.options.ignition = Some(setup);
    })
    .await
}

/// A Configure of `machine` with a 64 KiB blob, which fails (the test driver has no guest
/// agent) without quoting the blob.
async fn configure_fails_for_want_of_an_agent(rig: &Rig, machine: &Arc<Machine>) {
    let error = rig.hv.configure(configuring(machine)).await.unwrap_err();
    assert!(error.message.contains("guest agent"), "{}", error.message);
    assert!(
        !error.message.contains("xxxx"),
        "the blob is never in a message"
    );
}

/// A Configure of `machine` with a 64 KiB blob, as operation `op-9`.
fn configuring(machine: &Arc<Machine>) -> ConfigureRequest {
    ConfigureRequest {
        machine: Arc::clone(machine),
        cluster_id: "c1".to_owned(),
        bootstrap_blob: BootstrapBlob::new(vec![b'x'; 64 * 1024]),
        operation_id: OperationId::from_stored("op-9".to_owned()),
    }
}

/// The virtual size of volume `volume` in the default pool, if it exists.
async fn size_of(rig: &Rig, volume: &str) -> Option<u64> {
    (sized(rig, "default").await.into_iter())
        .find(|(n, _)| n == volume)
        .map(|(_, bytes)| bytes)
}

/// (active, autostart) of domain `name`.
async fn power(rig: &Rig, name: &str) -> (bool, bool) {
    let name = name.to_owned();
    on_host(&rig.hv, ZONE, move |s| {
        let domain = s.conn.lookup_domain_by_name(&name).unwrap();
        (domain.is_active().unwrap(), domain.autostart().unwrap())
    })
    .await
}

/// The watch reports the agent machine's domain `other` once it is destroyed, and never the
/// resting first-boot domain beside it.
async fn destroyed_is_reported_resting_is_not(rig: &Rig, other: &str) {
    destroy_behind(rig, other).await;
    until(&rig.metrics, "stopped", 1).await;
    pause(400).await;
    assert_eq!(
        drift(&rig.metrics, "stopped"),
        1,
        "the resting domain is not drift"
    );
}

#[tokio::test]
async fn a_first_boot_machine_rests_off_until_its_configure_starts_it() {
    let rig = first_boot_rig("nocloud").await;
    let (first, other) = (rig.slots[0].clone(), rig.slots[1].clone());
    let machine = Arc::new(create(&rig.hv, &first).await.unwrap());
    create(&rig.hv, &other).await.unwrap();
    let name = domain_name("libvirt", first.id.as_str());
    assert_eq!(
        power(&rig, &name).await,
        (false, false),
        "defined, off, not autostarted"
    );
    let other_name = domain_name("libvirt", other.id.as_str());
    assert_eq!(
        power(&rig, &other_name).await,
        (true, true),
        "the agent type runs"
    );

    destroyed_is_reported_resting_is_not(&rig, &other_name).await;

    let before = size_of(&rig, &seed_name(&name)).await.unwrap();
    configure_fails_for_want_of_an_agent(&rig, &machine).await;
    assert_eq!(
        power(&rig, &name).await,
        (true, true),
        "Configure started it"
    );
    let after = size_of(&rig, &seed_name(&name)).await.unwrap();
    // The 64 KiB blob takes the place of the base user-data's one sector.
    assert!(
        after >= before + 64 * 1024 - 2048,
        "the seed was replaced at the size of the one with the blob: {before} -> {after}"
    );
}

#[tokio::test]
async fn an_ignition_machine_gets_its_config_as_a_firmware_entry_and_the_blob_leaves_the_host() {
    let rig = first_boot_rig("ignition").await;
    let first = rig.slots[0].clone();
    let machine = Arc::new(create(&rig.hv, &first).await.unwrap());
    let name = domain_name("libvirt", first.id.as_str());
    let volume = ignition_name(&name);
    assert_eq!(power(&rig, &name).await, (false, false), "defined, off");
    let template_bytes = u64::try_from(TEMPLATE.len()).unwrap();
    assert_eq!(size_of(&rig, &volume).await, Some(template_bytes));
    let definition = {
        let name = name.clone();
        on_host(&rig.hv, ZONE, move |s| {
            let domain = s.conn.lookup_domain_by_name(&name).unwrap();
            domain.xml_desc(0).unwrap()
        })
        .await
    };
    assert!(
        definition.contains("<sysinfo type='fwcfg'>")
            && definition.contains("<entry name='opt/com.coreos/config' file='/")
            && definition.contains(&format!("/{volume}'/>")),
        "{definition}"
    );

    configure_fails_for_want_of_an_agent(&rig, &machine).await;
    assert_eq!(
        power(&rig, &name).await,
        (true, true),
        "Configure started it"
    );
    assert_eq!(
        size_of(&rig, &volume).await,
        Some(template_bytes),
        "right after the start the config is the template again: the blob left the host"
    );

    delete(&rig.hv, &machine).await.unwrap();
    assert_eq!(
        size_of(&rig, &volume).await,
        None,
        "Delete removed the config"
    );
}

#[tokio::test]
async fn a_machine_without_an_agent_is_configured_once_it_runs_and_drains_by_shutting_down() {
    let rig = first_boot_rig_with(r#""boot": "nocloud", "guest_agent": false"#).await;
    let machine = Arc::new(create(&rig.hv, &rig.slots[0]).await.unwrap());
    let name = domain_name("libvirt", machine.id.as_str());
    let seed = seed_name(&name);
    let resting = size_of(&rig, &seed).await.unwrap();
    assert_eq!(power(&rig, &name).await, (false, false), "defined, off");

    rig.hv.configure(configuring(&machine)).await.unwrap();
    assert_eq!(
        power(&rig, &name).await,
        (true, true),
        "running with the blob"
    );
    assert!(size_of(&rig, &seed).await.unwrap() >= resting + 64 * 1024 - 2048);

    let drain = DrainRequest {
        machine: Arc::clone(&machine),
        grace_period_seconds: 5,
        operation_id: OperationId::from_stored("op-10".to_owned()),
    };
    rig.hv.drain(drain).await.unwrap();
    assert_eq!(
        power(&rig, &name).await,
        (false, false),
        "shut down, not restarted"
    );
    assert_eq!(
        size_of(&rig, &seed).await,
        Some(resting),
        "the seed is written back without the blob"
    );
}
