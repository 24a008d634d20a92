//! Ceph RBD pools on the test driver: roots made as clones of the golden image at the type's
//! size, data disks as RBD images, the seed in `--seed-pool`, every disk of the domain a
//! network disk on the pool's monitors with its cephx secret, and Delete leaving only the
//! golden image; a storage pool that is rbd without a local seed pool refuses Create with
//! the fix, before anything is made.

use bigfleet_libvirt_config::instance_types_from_json;
use bigfleet_libvirt_config::naming::domain_name;

use super::*;
use crate::host::fixture::{RBD_SECRET, rbd_pool};
use crate::render::spec::{console_name, rbd_data_name, rbd_root_name, seed_name};

/// `kvm.small` with a 20 GiB root and two data disks.
const SHAPED: &str = r#"{"kvm.small": {"vcpu": 2, "memory_mib": 4096, "disk_gib": 20,
    "data_disks": [{"size_gib": 5}, {"name": "scratch", "size_gib": 64}]}}"#;

/// A rig whose `--storage-pool` is the rbd pool `ceph` (golden image `golden`, 8 GiB raw)
/// and whose seeds go to `seed_pool` (empty: the storage pool).
async fn rbd_rig(seed_pool: &str) -> Rig {
    let catalog = instance_types_from_json(SHAPED, "types.json").unwrap();
    let fixture = Fixture {
        pools: vec![rbd_pool("ceph", "golden", 8 << 30)],
        ..Fixture::default()
    };
    let seed_pool = seed_pool.to_owned();
    rig_with(&fixture, slots("libvirt", ZONE, "kvm.small", 2), |config| {
        config.catalog = catalog;
        config.options.image = "golden".to_owned();
        config.options.storage_pool = "ceph".to_owned();
        config.options.seed_pool = seed_pool;
    })
    .await
}

#[tokio::test]
async fn an_rbd_pool_gets_cloned_roots_rbd_data_disks_and_seeds_in_the_seed_pool() {
    let rig = rbd_rig("default").await;
    let machine = create(&rig.hv, &rig.slots[0]).await.unwrap();
    let name = domain_name("libvirt", rig.slots[0].id.as_str());
    let mut want = vec![
        ("golden".to_owned(), 8 << 30),
        (rbd_root_name(&name), 20 << 30),
        (rbd_data_name(&name, "data1"), 5 << 30),
        (rbd_data_name(&name, "scratch"), 64 << 30),
    ];
    want.sort();
    assert_eq!(sized(&rig, "ceph").await, want);
    assert_eq!(
        volumes(&rig.hv, ZONE, "default").await,
        [
            "base.qcow2".to_owned(),
            seed_name(&name),
            console_name(&name)
        ]
    );
    let probe = name.clone();
    let document = on_host(&rig.hv, ZONE, move |s| {
        (s.conn.lookup_domain_by_name(&probe).unwrap())
            .xml_desc(0)
            .unwrap()
    })
    .await;
    let root = roxmltree::Document::parse(&document).unwrap();
    let network: Vec<_> = (root.descendants())
        .filter(|n| n.has_tag_name("disk") && n.attribute("type") == Some("network"))
        .collect();
    let images: Vec<(&str, &str)> = (network.iter())
        .map(|disk| {
            let source = disk.children().find(|n| n.has_tag_name("source")).unwrap();
            let serial = disk.children().find(|n| n.has_tag_name("serial")).unwrap();
            assert_eq!(source.attribute("protocol"), Some("rbd"), "{document}");
            let host = source.children().find(|n| n.has_tag_name("host")).unwrap();
            assert_eq!(
                (host.attribute("name"), host.attribute("port")),
                (Some("127.0.0.1"), Some("6789"))
            );
            let secret = disk
                .descendants()
                .find(|n| n.has_tag_name("secret"))
                .unwrap();
            assert_eq!(secret.attribute("uuid"), Some(RBD_SECRET), "{document}");
            (source.attribute("name").unwrap(), serial.text().unwrap())
        })
        .collect();
    let (root_image, data1, scratch) = (
        format!("bigfleet/{}", rbd_root_name(&name)),
        format!("bigfleet/{}", rbd_data_name(&name, "data1")),
        format!("bigfleet/{}", rbd_data_name(&name, "scratch")),
    );
    assert_eq!(
        images,
        [
            (root_image.as_str(), "root"),
            (data1.as_str(), "data1"),
            (scratch.as_str(), "scratch")
        ]
    );
    assert!(
        document.contains("-cidata.iso'/>") && document.contains("type='file'"),
        "the seed stays a file: {document}"
    );
    delete(&rig.hv, &machine).await.unwrap();
    assert_eq!(volumes(&rig.hv, ZONE, "ceph").await, ["golden"]);
    assert_eq!(volumes(&rig.hv, ZONE, "default").await, ["base.qcow2"]);
}

#[tokio::test]
async fn an_rbd_storage_pool_without_a_seed_pool_refuses_create_with_the_fix() {
    let rig = rbd_rig("").await;
    let error = create(&rig.hv, &rig.slots[0]).await.unwrap_err();
    assert!(
        error.message.contains("--seed-pool") && error.message.contains("rbd pool"),
        "{error:?}"
    );
    assert_eq!(
        error.side_effects,
        bigfleet_libvirt_ports::SideEffects::None,
        "{error:?}"
    );
    assert_eq!(volumes(&rig.hv, ZONE, "ceph").await, ["golden"]);
    assert!(domains(&rig.hv, ZONE).await.is_empty());
}

#[tokio::test]
async fn image_source_reaches_the_rbd_pool_staged_in_the_seed_pool_and_machines_clone_it() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("golden.raw");
    std::fs::write(&file, vec![7u8; 4096]).unwrap();
    let golden = std::sync::Arc::new(crate::storage::golden::read(&file).unwrap());
    let volume = golden.volume.clone();
    let catalog = instance_types_from_json(SHAPED, "types.json").unwrap();
    let fixture = Fixture {
        pools: vec![rbd_pool("ceph", "other", 8 << 30)],
        ..Fixture::default()
    };
    let rig = rig_with(&fixture, slots("libvirt", ZONE, "kvm.small", 1), |config| {
        config.catalog = catalog;
        config.options.image = golden.volume.clone();
        config.options.image_source = Some(golden);
        config.options.storage_pool = "ceph".to_owned();
        config.options.seed_pool = "default".to_owned();
    })
    .await;
    create(&rig.hv, &rig.slots[0]).await.unwrap();
    let name = domain_name("libvirt", rig.slots[0].id.as_str());
    let mut want = vec![
        volume.clone(),
        format!("{volume}.upload"),
        "other".to_owned(),
        rbd_root_name(&name),
        rbd_data_name(&name, "data1"),
        rbd_data_name(&name, "scratch"),
    ];
    want.sort();
    assert_eq!(volumes(&rig.hv, ZONE, "ceph").await, want);
    assert_eq!(
        volumes(&rig.hv, ZONE, "default").await,
        [
            "base.qcow2".to_owned(),
            seed_name(&name),
            console_name(&name)
        ],
        "the staged copy is gone once the Ceph pool holds the image"
    );
}

/// libvirt leaves rbd pools inactive after its daemon restarts; the dial starts the
/// provider's rbd pools again and leaves an inactive local pool (stopped by someone) alone.
#[tokio::test]
async fn a_dial_starts_the_providers_inactive_rbd_pools_and_no_other() {
    use crate::host::pools::{Woken, start_rbd_pools};
    let rig = rbd_rig("default").await;
    let woken = on_host(&rig.hv, ZONE, |s| {
        for name in ["ceph", "default"] {
            let pool = s.conn.lookup_storage_pool_by_name(name).unwrap();
            pool.destroy().unwrap();
        }
        let names = ["ceph", "default", "ceph", "absent", ""].map(str::to_owned);
        let woken = start_rbd_pools(&s.conn, ZONE, &names);
        let active = |name: &str| {
            (s.conn.lookup_storage_pool_by_name(name).unwrap())
                .is_active()
                .unwrap()
        };
        (woken, active("ceph"), active("default"))
    })
    .await;
    let want = vec![
        ("absent".to_owned(), Woken::Untouched),
        ("ceph".to_owned(), Woken::Started),
        ("default".to_owned(), Woken::Untouched),
    ];
    assert_eq!(woken, (want, true, false));
}
