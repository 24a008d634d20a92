//! A storage pool with no room, on the real-QEMU tier's libvirtd: a tmpfs of a few pages as
//! a transient `dir` pool. The golden image's upload into one is in `image_source`; here a
//! full `--seed-pool` fails a Create with the pool named in `last_error`, leaves no volume
//! behind, and defines no domain.

use bigfleet_libvirt_proto::v1alpha1 as pb;
use pb::MachineState as S;

use super::{Libvirt, Tier};
use crate::harness::*;

/// A transient `dir` pool on a tmpfs of a few pages inside the daemon's root: too small for
/// the uploads here. Dropping it destroys the pool and unmounts the tmpfs.
pub(super) struct TinyPool {
    pub(super) pool: virt::storage_pool::StoragePool,
    mount: std::path::PathBuf,
}

impl TinyPool {
    pub(super) const NAME: &'static str = "e2e-tiny";

    /// `size`: the tmpfs's `size=` option ("64k").
    pub(super) fn make(lv: &Libvirt, size: &str) -> Self {
        let inside = "/var/tmp/bigfleet-e2e-tiny";
        let mount = lv.tier.root.join(inside.trim_start_matches('/'));
        std::fs::create_dir_all(&mount).unwrap();
        let status = std::process::Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size}"),
                "bigfleet-e2e-tiny",
            ])
            .arg(&mount)
            .status()
            .expect("run mount");
        assert!(status.success(), "mount a tmpfs at {}", mount.display());
        let xml = format!(
            "<pool type='dir'><name>{}</name><target><path>{inside}</path></target></pool>",
            Self::NAME
        );
        let pool = lv
            .conn
            .create_storage_pool_xml(&xml, 0)
            .expect("create the tiny pool");
        Self { pool, mount }
    }

    /// The volumes in the pool now.
    pub(super) fn volumes(&self) -> Vec<String> {
        self.pool.refresh(0).unwrap();
        self.pool.list_volumes().unwrap()
    }
}

impl Drop for TinyPool {
    fn drop(&mut self) {
        let _ = self.pool.destroy();
        let _ = std::process::Command::new("umount")
            .arg(&self.mount)
            .status();
        let _ = std::fs::remove_dir(&self.mount);
    }
}

#[tokio::test]
#[ignore = "needs the real-QEMU tier: run scripts/qemu-tier/run.sh ci"]
async fn a_full_seed_pool_fails_the_create_and_leaves_nothing() {
    let tier = Tier::from_env();
    let lv = Libvirt::open(Tier::from_env());
    let dir = tempfile::tempdir().unwrap();
    // One page: smaller than any seed ISO.
    let tiny = TinyPool::make(&lv, "4k");
    let mut args = tier.flags(dir.path(), "e2e-seedfull", "qemu");
    args.push(format!("--seed-pool={}", TinyPool::NAME));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let server = Server::start(&args);
    let mut c = server.client().await;
    let domains_before = lv.conn.list_all_domains(0).unwrap().len();
    let id = pick(&server, &mut c).await;
    create(&mut c, &id, None).await.expect("Create accepted");
    let failed = reach(&mut c, &id, S::Failed, std::time::Duration::from_secs(60)).await;
    println!("last_error: {}", failed.last_error);
    let pool = format!("cidata.iso in pool \"{}\"", TinyPool::NAME);
    assert!(failed.last_error.contains(&pool), "{}", failed.last_error);
    assert!(
        failed.last_error.contains("No space left on device"),
        "{}",
        failed.last_error
    );
    assert_eq!(tiny.volumes(), Vec::<String>::new(), "no seed volume left");
    let overlays: Vec<String> = (lv.pool().list_volumes().unwrap().into_iter())
        .filter(|v| v.contains("overlay"))
        .collect();
    assert!(
        overlays.iter().all(|v| !v.contains(&id)),
        "no overlay left: {overlays:?}"
    );
    assert_eq!(
        lv.conn.list_all_domains(0).unwrap().len(),
        domains_before,
        "no domain defined"
    );
    drop(c);
    drop(server);
    drop(tiny);
}
