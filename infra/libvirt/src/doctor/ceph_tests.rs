//! The doctor's rbd and seed-pool verdicts, on facts the test driver cannot stage (it holds
//! no secrets): a missing cephx secret, a seed pool that is the rbd pool itself, a missing or
//! rbd `--seed-pool`, and `--image-source` checked against an RBD image by its size.

use super::tests::{good, status, want};
use super::*;
use crate::render::rbd::{PoolKind, pool_kind};

/// `good()`'s host with its storage pool the fixture's rbd pool, its secret `secret`.
fn on_rbd(secret: Probe<()>) -> HostFacts {
    let mut host = good();
    let document = crate::host::fixture::rbd_pool("ceph", "golden", 2 << 30);
    let PoolKind::Rbd(source) = pool_kind(&document).unwrap() else {
        panic!("not rbd");
    };
    host.pool = Probe::Found(Pool {
        kind: "rbd".to_owned(),
        active: true,
        capacity: 100 << 30,
        available: 90 << 30,
        rbd: Some(RbdFacts { source, secret }),
    });
    host.image = Probe::Found(Volume {
        format: "raw".to_owned(),
        capacity: 10 << 30,
    });
    host
}

/// `want()` with `--storage-pool ceph` and `--seed-pool seed`.
fn want_rbd(seed: &str) -> Expectations {
    Expectations {
        storage_pool: "ceph".to_owned(),
        seed_pool: seed.to_owned(),
        ..want()
    }
}

fn dir_pool() -> Probe<Pool> {
    Probe::Found(Pool {
        kind: "dir".to_owned(),
        active: true,
        capacity: 10 << 30,
        available: 9 << 30,
        rbd: None,
    })
}

#[test]
fn an_rbd_pool_with_its_secret_and_a_dir_seed_pool_is_ok() {
    let mut host = on_rbd(Probe::Found(()));
    host.seed_pool = Some(dir_pool());
    let report = judge(&want_rbd("seeds"), &[host]);
    let (s, detail, _) = status(&report, "a", "ceph secret");
    assert_eq!(s, Status::Ok, "{report:#?}");
    assert!(
        detail.contains("client.libvirt") && detail.contains("127.0.0.1:6789"),
        "{detail}"
    );
    assert_eq!(status(&report, "a", "seed pool").0, Status::Ok);
    assert_eq!(report.exit_code(), 0, "{report:#?}");
}

#[test]
fn a_missing_cephx_secret_blocks_with_how_to_define_it() {
    let mut host = on_rbd(Probe::Missing);
    host.seed_pool = Some(dir_pool());
    let report = judge(&want_rbd("seeds"), &[host]);
    let (s, detail, fix) = status(&report, "a", "ceph secret");
    assert_eq!(s, Status::Block);
    assert!(
        detail.contains(crate::host::fixture::RBD_SECRET),
        "{detail}"
    );
    assert!(
        fix.contains("virsh secret-define") && fix.contains("ceph auth get-key client.libvirt"),
        "{fix}"
    );
    assert_eq!(report.exit_code(), 1);
}

#[test]
fn seeds_in_the_rbd_pool_or_a_missing_seed_pool_block_naming_the_flag() {
    let same = judge(&want_rbd("ceph"), &[on_rbd(Probe::Found(()))]);
    let (s, detail, fix) = status(&same, "a", "seed pool");
    assert_eq!(s, Status::Block);
    assert!(detail.contains("rbd pool"), "{detail}");
    assert!(fix.contains("--seed-pool"), "{fix}");
    let mut host = on_rbd(Probe::Found(()));
    host.seed_pool = Some(Probe::Missing);
    let missing = judge(&want_rbd("seeds"), &[host]);
    let (s, detail, _) = status(&missing, "a", "seed pool");
    assert_eq!(s, Status::Block);
    assert!(detail.contains("no storage pool seeds"), "{detail}");
}

#[test]
fn image_source_into_an_rbd_pool_is_checked_by_size_and_uploaded_when_missing() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("golden.qcow2");
    let mut header = b"QFI\xfb".to_vec();
    header.resize(24, 0);
    header.extend_from_slice(&(10u64 << 30).to_be_bytes());
    std::fs::write(&file, &header).unwrap();
    let golden = crate::storage::golden::read(&file).unwrap();
    let mut want = want_rbd("seeds");
    want.image_source = Some(std::sync::Arc::new(golden));
    // The image in the rbd pool is raw, of the file's virtual size: it matches.
    let mut host = on_rbd(Probe::Found(()));
    host.seed_pool = Some(dir_pool());
    let report = judge(&want, &[host.clone()]);
    assert_eq!(
        status(&report, "a", "image-source").0,
        Status::Ok,
        "{report:#?}"
    );
    // Missing: uploaded on connect.
    host.image = Probe::Missing;
    let report = judge(&want, &[host.clone()]);
    let (s, detail, _) = status(&report, "a", "image-source");
    assert_eq!(s, Status::Ok, "{report:#?}");
    assert!(detail.contains("uploads"), "{detail}");
    // Another size: blocks.
    host.image = Probe::Found(Volume {
        format: "raw".to_owned(),
        capacity: 3 << 30,
    });
    let report = judge(&want, &[host]);
    assert_eq!(status(&report, "a", "image-source").0, Status::Block);
}
