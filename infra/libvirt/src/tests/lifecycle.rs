//! Create, Delete, Configure and Drain on one private test-driver host: define and start,
//! the ownership tag, the volumes and their rollback, destroy and undefine.

use std::sync::Arc;

use bigfleet_libvirt_domain::{MachineState, OperationId};
use bigfleet_libvirt_ports::{BootstrapBlob, ConfigureRequest, DrainRequest, Hypervisor};

use super::*;
use crate::host::domains::read_tag;
use crate::render::ownership::Tag;
use crate::render::xml;
use crate::service::lifecycle;
use crate::storage::volumes::{console_name, overlay_name, seed_name};
use bigfleet_libvirt_config::naming::domain_name;

#[tokio::test]
async fn create_defines_a_tagged_running_domain_with_its_volumes() {
    let rig = rig().await;
    let slot = &rig.slots[0];
    let machine = create(&rig.hv, slot).await.unwrap();
    let name = domain_name("libvirt", slot.id.as_str());
    let host = machine.host.clone().unwrap();
    assert_eq!(host.provider, "libvirt");
    assert_eq!(host.reference, format!("{ZONE}/{name}"));
    assert_eq!(domains(&rig.hv, ZONE).await, std::slice::from_ref(&name));
    assert_eq!(
        volumes(&rig.hv, ZONE, "default").await,
        [
            "base.qcow2".to_owned(),
            seed_name(&name),
            console_name(&name),
            overlay_name(&name)
        ]
    );
    let probe = name.clone();
    let (running, autostart, tag, document, overlay) = on_host(&rig.hv, ZONE, move |s| {
        let d = s.conn.lookup_domain_by_name(&probe).unwrap();
        let pool = s.conn.lookup_storage_pool_by_name("default").unwrap();
        let overlay = pool
            .lookup_storage_vol_by_name(&overlay_name(&probe))
            .unwrap();
        (
            d.is_active().unwrap(),
            d.autostart().unwrap(),
            read_tag(&d),
            d.xml_desc(0).unwrap(),
            (
                overlay.info().unwrap().capacity,
                overlay.xml_desc(0).unwrap(),
            ),
        )
    })
    .await;
    assert!(running && autostart);
    assert_eq!(tag, Some(Tag::new("libvirt", slot.id.as_str())));
    assert!(document.contains(xml::AGENT_CHANNEL), "{document}");
    assert!(
        document.contains("<source network='default'/>"),
        "{document}"
    );
    assert!(
        document.contains("<vcpu placement='static'>2</vcpu>"),
        "{document}"
    );
    assert_eq!(overlay.0, 40 << 30, "kvm.small's root is 40 GiB");
    assert!(
        overlay.1.contains("/var/lib/libvirt/images/base.qcow2"),
        "{}",
        overlay.1
    );
    assert_eq!(xml::volume_format(&overlay.1).as_deref(), Some("qcow2"));
    // The serial console's log is the console volume, which libvirt can read back.
    let console_path = on_host(&rig.hv, ZONE, move |s| {
        let pool = s.conn.lookup_storage_pool_by_name("default").unwrap();
        let volume = pool.lookup_storage_vol_by_name(&console_name(&name));
        volume.unwrap().path().unwrap()
    })
    .await;
    let logged = crate::storage::console::log_path(&document);
    assert_eq!(logged, Some(console_path), "{document}");
}

#[tokio::test]
async fn the_configured_platform_reaches_the_defined_domain() {
    let rig = rig_with(
        &Fixture::default(),
        slots("libvirt", ZONE, "kvm.small", 1),
        |config| {
            config.options.network = String::new();
            config.options.platform = xml::Platform {
                domain_type: xml::DomainType::Qemu,
                kernel: Some(xml::DirectKernel {
                    kernel: "/guest/vmlinuz".to_owned(),
                    initrd: Some("/guest/initrd.img".to_owned()),
                    cmdline: "console=ttyS0 panic=-1".to_owned(),
                }),
                firmware: xml::Firmware::Bios,
                seed_bus: xml::SeedBus::Sata,
            };
        },
    )
    .await;
    let slot = &rig.slots[0];
    create(&rig.hv, slot).await.unwrap();
    let name = domain_name("libvirt", slot.id.as_str());
    let document = on_host(&rig.hv, ZONE, move |s| {
        let d = s.conn.lookup_domain_by_name(&name).unwrap();
        d.xml_desc(0).unwrap()
    })
    .await;
    assert!(document.contains("<domain type='qemu'"), "{document}");
    assert!(
        document.contains("<kernel>/guest/vmlinuz</kernel>"),
        "{document}"
    );
    assert!(
        document.contains("<initrd>/guest/initrd.img</initrd>"),
        "{document}"
    );
    assert!(
        document.contains("<cmdline>console=ttyS0 panic=-1</cmdline>"),
        "{document}"
    );
    assert!(!document.contains("<interface"), "{document}");
    assert!(
        document.contains("<target dev='sda' bus='sata'/>"),
        "--seed-bus sata puts the seed on a SATA CD-ROM: {document}"
    );
}

#[tokio::test]
async fn create_is_idempotent_and_adopts_a_stopped_domain() {
    let rig = rig().await;
    let slot = &rig.slots[1];
    let first = create(&rig.hv, slot).await.unwrap();
    let second = create(&rig.hv, slot).await.unwrap();
    assert_eq!(first.host, second.host);
    assert_eq!(domains(&rig.hv, ZONE).await.len(), 1);
    let name = domain_name("libvirt", slot.id.as_str());
    let stop = name.clone();
    on_host(&rig.hv, ZONE, move |s| {
        s.conn
            .lookup_domain_by_name(&stop)
            .unwrap()
            .destroy()
            .unwrap();
    })
    .await;
    create(&rig.hv, slot).await.unwrap();
    let running = on_host(&rig.hv, ZONE, move |s| {
        s.conn
            .lookup_domain_by_name(&name)
            .unwrap()
            .is_active()
            .unwrap()
    })
    .await;
    assert!(running, "a retried Create powers the adopted domain on");
    assert_eq!(domains(&rig.hv, ZONE).await.len(), 1);
}

#[tokio::test]
async fn a_failed_create_rolls_back_only_what_it_made() {
    let rig = rig().await;
    let slot = rig.slots[2].clone();
    let name = domain_name("libvirt", slot.id.as_str());
    // An earlier attempt left the overlay behind: it is adopted, so it must survive.
    let earlier = xml::overlay_volume(&overlay_name(&name), 1 << 30, "/b", "qcow2");
    on_host(&rig.hv, ZONE, move |s| {
        let pool = s.conn.lookup_storage_pool_by_name("default").unwrap();
        virt::storage_vol::StorageVol::create_xml(&pool, &earlier, 0).unwrap();
    })
    .await;
    let error = create_refused_at_define(&rig, &slot, Default::default()).await;
    let host = Arc::clone(&rig.hv.inner.hosts[ZONE]);
    assert!(error.message.contains("define domain"), "{}", error.message);
    assert!(domains(&rig.hv, ZONE).await.is_empty());
    assert_eq!(
        volumes(&rig.hv, ZONE, "default").await,
        ["base.qcow2".to_owned(), overlay_name(&name)]
    );
    assert!(
        !host.ledger().is_pending(&name),
        "the reservation is released"
    );
    assert!(host.ledger().used().vcpu == 0);
}

#[tokio::test]
async fn delete_removes_the_domain_and_its_volumes_but_never_the_base() {
    let rig = rig().await;
    let machine = create(&rig.hv, &rig.slots[0]).await.unwrap();
    delete(&rig.hv, &machine).await.unwrap();
    assert!(domains(&rig.hv, ZONE).await.is_empty());
    assert_eq!(volumes(&rig.hv, ZONE, "default").await, ["base.qcow2"]);
    // Deleting again is a success too.
    delete(&rig.hv, &machine).await.unwrap();
}

#[tokio::test]
async fn create_and_delete_record_their_phase_durations() {
    let rig = rig().await;
    let phase_count = |rig: &Rig, phase: &str| {
        // The family rendered alone: clones share its samples.
        let mut registry = prometheus_client::registry::Registry::default();
        registry.register(
            "bigfleet_libvirt_phase_duration_seconds",
            "phases",
            rig.metrics.phases.clone(),
        );
        let mut rendered = String::new();
        prometheus_client::encoding::text::encode(&mut rendered, &registry).unwrap();
        let needle = format!("bigfleet_libvirt_phase_duration_seconds_count{{phase=\"{phase}\"}} ");
        rendered
            .lines()
            .find_map(|l| l.strip_prefix(needle.as_str()))
            .map_or(0, |n| n.trim().parse::<u64>().unwrap())
    };
    let machine = create(&rig.hv, &rig.slots[0]).await.unwrap();
    assert_eq!(phase_count(&rig, "define"), 1);
    assert_eq!(phase_count(&rig, "start"), 1);
    assert_eq!(phase_count(&rig, "delete"), 0);
    delete(&rig.hv, &machine).await.unwrap();
    assert_eq!(phase_count(&rig, "delete"), 1);
}

#[tokio::test]
async fn deleting_a_vanished_domain_still_cleans_its_volumes() {
    let rig = rig().await;
    let machine = create(&rig.hv, &rig.slots[0]).await.unwrap();
    let name = domain_name("libvirt", rig.slots[0].id.as_str());
    on_host(&rig.hv, ZONE, move |s| {
        let d = s.conn.lookup_domain_by_name(&name).unwrap();
        d.destroy().unwrap();
        d.undefine().unwrap();
    })
    .await;
    // The compensating Delete of a failed Create carries no host ref.
    let mut hostless = machine.clone();
    hostless.host = None;
    hostless.state = MachineState::Failed;
    delete(&rig.hv, &hostless).await.unwrap();
    assert_eq!(volumes(&rig.hv, ZONE, "default").await, ["base.qcow2"]);
}

#[tokio::test]
async fn configure_and_drain_fail_clearly_without_a_guest_agent() {
    let rig = rig().await;
    let machine = Arc::new(create(&rig.hv, &rig.slots[0]).await.unwrap());
    let request = ConfigureRequest {
        machine: Arc::clone(&machine),
        cluster_id: "c1".to_owned(),
        bootstrap_blob: BootstrapBlob::new(b"secret".to_vec()),
        operation_id: OperationId::from_stored("op-3".to_owned()),
    };
    let error = rig.hv.configure(request).await.unwrap_err();
    assert!(
        error.message.starts_with("configure: "),
        "{}",
        error.message
    );
    assert!(error.message.contains("guest agent"), "{}", error.message);
    assert!(error.message.contains("not supported"), "{}", error.message);
    assert!(!error.message.contains("secret"));
    let request = DrainRequest {
        machine: Arc::clone(&machine),
        grace_period_seconds: 30,
        operation_id: OperationId::from_stored("op-4".to_owned()),
    };
    let error = rig.hv.drain(request).await.unwrap_err();
    assert!(error.message.starts_with("drain: "), "{}", error.message);
    let name = domain_name("libvirt", machine.id.as_str());
    let tag = on_host(&rig.hv, ZONE, move |s| {
        read_tag(&s.conn.lookup_domain_by_name(&name).unwrap())
    })
    .await
    .unwrap();
    assert_eq!(tag.cluster_id, "", "a failed bootstrap binds nothing");
}

#[tokio::test]
async fn the_tag_is_rewritten_on_the_live_and_persistent_domain() {
    let rig = rig().await;
    let machine = create(&rig.hv, &rig.slots[0]).await.unwrap();
    let (settings, id) = (Arc::clone(&rig.hv.inner.settings), machine.id.to_string());
    let name = domain_name("libvirt", &id);
    let tag = on_host(&rig.hv, ZONE, move |s| {
        lifecycle::retag(s, &settings, &name, &id, "cluster-7").unwrap();
        read_tag(&s.conn.lookup_domain_by_name(&name).unwrap())
    })
    .await
    .unwrap();
    assert_eq!(tag.cluster_id, "cluster-7");
}

/// The interfaces of `slot`'s domain as (type, source attributes, MAC).
async fn interfaces(rig: &Rig, slot: &Machine) -> (Vec<(String, Vec<String>, String)>, String) {
    let name = domain_name("libvirt", slot.id.as_str());
    let document = on_host(&rig.hv, ZONE, move |s| {
        let d = s.conn.lookup_domain_by_name(&name).unwrap();
        d.xml_desc(0).unwrap()
    })
    .await;
    let parsed = roxmltree::Document::parse(&document).unwrap();
    let nics = parsed
        .descendants()
        .filter(|n| n.has_tag_name("interface"))
        .map(|n| {
            let child = |tag: &str| n.children().find(|c| c.has_tag_name(tag)).unwrap();
            let source = child("source")
                .attributes()
                .map(|a| format!("{}={}", a.name(), a.value()))
                .collect();
            let mac = child("mac").attribute("address").unwrap().to_owned();
            (n.attribute("type").unwrap().to_owned(), source, mac)
        })
        .collect();
    (nics, document)
}

#[tokio::test]
async fn every_nic_source_and_the_cpu_choice_reach_the_defined_domain() {
    let mut slots = slots("libvirt", ZONE, "kvm.small", 1);
    slots.extend(super::slots("libvirt", ZONE, "kvm.medium", 1));
    let rig = rig_with(&Fixture::default(), slots, |config| {
        let parse = |s: &str| crate::NicSource::parse(s).unwrap();
        config.options.nics = vec![parse("network=default"), parse("bridge=br0")];
        config
            .options
            .instance_nics
            .insert("kvm.medium".to_owned(), vec![parse("direct=eth0:vepa")]);
        config.options.cpu = Some(crate::CpuChoice::parse("host-model").unwrap());
        config.options.instance_cpu.insert(
            "kvm.medium".to_owned(),
            crate::CpuChoice::parse("qemu64,-svm").unwrap(),
        );
    })
    .await;
    let (small, medium) = (&rig.slots[0], &rig.slots[1]);
    let made = create(&rig.hv, small).await.unwrap();
    create(&rig.hv, medium).await.unwrap();
    let mac = |slot: &Machine, index| {
        crate::render::devices::Mac::derive("libvirt", slot.id.as_str(), index, 0).to_string()
    };
    let (nics, document) = interfaces(&rig, small).await;
    let strings = |v: &[&str]| v.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
    assert_eq!(
        nics,
        [
            (
                "network".to_owned(),
                strings(&["network=default"]),
                mac(small, 0)
            ),
            ("bridge".to_owned(), strings(&["bridge=br0"]), mac(small, 1)),
        ],
        "{document}"
    );
    assert!(document.contains("mode='host-model'"), "{document}");
    let (nics, document) = interfaces(&rig, medium).await;
    assert_eq!(
        nics,
        [(
            "direct".to_owned(),
            strings(&["dev=eth0", "mode=vepa"]),
            mac(medium, 0)
        )],
        "{document}"
    );
    assert!(document.contains(">qemu64</model>"), "{document}");
    assert!(document.contains("name='svm'"), "{document}");
    // Re-created, the slot keeps its addresses (DHCP reservations hold).
    delete(&rig.hv, &made).await.unwrap();
    create(&rig.hv, small).await.unwrap();
    let (again, _) = interfaces(&rig, small).await;
    assert_eq!(again[0].2, mac(small, 0));
    assert_eq!(again[1].2, mac(small, 1));
}

/// A domain libvirt refuses says why in the Create's error (the machine's `last_error`):
/// libvirt's own words, on one line. (The test driver starts whatever it defines, so the
/// start-time abort is walked on the real-QEMU tier instead.)
#[tokio::test]
async fn a_refused_cpu_fails_create_with_libvirts_words() {
    let rig = rig_with(
        &Fixture::default(),
        slots("libvirt", ZONE, "kvm.small", 1),
        |config| {
            config.options.cpu =
                Some(crate::CpuChoice::parse("Skylake-Server,+pcid,-pcid").unwrap());
        },
    )
    .await;
    let error = create(&rig.hv, &rig.slots[0]).await.unwrap_err();
    let message = &error.message;
    assert!(message.contains("define domain"), "{message}");
    assert!(
        message.contains("CPU feature 'pcid' specified more than once"),
        "{message}"
    );
    assert!(!message.contains('\n'), "{message}");
    assert!(domains(&rig.hv, ZONE).await.is_empty(), "rolled back");
}
