//! Issue 42 — Ceph RBD on a real cluster: the tier's single-node Ceph (`scripts/qemu-tier/ceph.sh`:
//! one monitor, one manager, one OSD on a file-backed BlueStore, loopback only) behind the rbd
//! pool `bigfleet-rbd` that zones `a` and `b` both define, with the cephx secret in each.
//!
//! The golden image is the tier's real Debian image, which the provider uploads with
//! `--image-source` into the Ceph pool once for the cluster (staged in the seed pool and
//! copied by QEMU, docs/libvirt.md §5.12); both zones clone their machines' roots from that
//! one image. One provider runs the
//! tier's tiny guests (`--guest-kernel`) in both zones on it; another boots the real image
//! itself, its own boot loader on the RBD clone, to its agent. Each walk checks the clone's
//! parent and size in Ceph, the disks the guest sees by serial, Configure, Drain and Delete,
//! and that Delete leaves no image of the machine in Ceph and no seed in the seed pool.
//! Zone b's libvirtd is restarted first, which leaves its rbd pool inactive (libvirt cannot
//! check an rbd pool at start): the provider starts it when it connects.
//! `#[ignore]`d outside the tier (`scripts/qemu-tier/run.sh ci`).

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Instant;

use bigfleet_libvirt_proto::v1alpha1 as pb;
use pb::MachineState as S;
use serde_json::json;
use virt::connect::Connect;
use virt::domain::Domain;

use crate::harness::*;
use crate::qemu_image::{WallTime, guest};
use crate::qemu_zones::{BOOT, Tier, Zone, domain_name, gauge_until, ids_in, until_explained};

/// The machines' type: a 8 GiB root and two data disks.
const TYPES: &str = r#"{ "rbd.small": { "vcpu": 1, "memory_mib": 1024, "disk_gib": 8,
    "data_disks": [{ "size_gib": 1 }, { "name": "scratch", "size_gib": 2 }] } }"#;
const DATA: [(&str, u64); 2] = [("data1", 1), ("scratch", 2)];

fn var(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| {
        panic!("{name} is not set: these tests run inside the real-QEMU tier with Ceph started")
    })
}

/// The cluster, as `scripts/qemu-tier/run.sh ceph env` exports it.
struct Ceph {
    rbd_pool: String,
    ceph_pool: String,
    script: String,
}

impl Ceph {
    fn from_env() -> Self {
        Self {
            rbd_pool: var("BIGFLEET_QEMU_RBD_POOL"),
            ceph_pool: var("BIGFLEET_QEMU_CEPH_POOL"),
            script: var("BIGFLEET_QEMU_TIER_SCRIPT"),
        }
    }

    /// A command in the cluster's root as client.admin (`run.sh ceph cli`): its status and
    /// output.
    fn cli(&self, args: &[&str]) -> (bool, String) {
        let out = Command::new(&self.script)
            .args(["ceph", "cli"])
            .args(args)
            .stdin(Stdio::null())
            .output()
            .expect("run the tier script");
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.success(), text)
    }

    /// The pool's images, sorted.
    fn images(&self) -> Vec<String> {
        let (ok, text) = self.cli(&["rbd", "ls", &self.ceph_pool]);
        assert!(ok, "rbd ls: {text}");
        let mut names: Vec<String> = text.lines().map(str::to_owned).collect();
        names.sort();
        names
    }

    /// Removes every golden image an earlier run on this machine left in the cluster (the
    /// cluster's data outlives a tier run, and a rebuilt image has another name): each image
    /// named `<stem>…` with its upload parent (`….upload`) and their snapshots, so the upload
    /// always happens here and only this run's image is left at the end.
    fn forget_goldens(&self, stem: &str) {
        let pool = &self.ceph_pool;
        let mut names: Vec<String> = (self.images().into_iter())
            .filter(|i| i.starts_with(stem))
            .collect();
        // A golden image before its parent (clones before the images they are cloned from).
        names.sort_by_key(|n| n.ends_with(".upload"));
        for name in &names {
            let script = format!(
                "i={pool}/{name}; \
                 for s in $(rbd snap ls $i 2>/dev/null | awk 'NR > 1 {{ print $2 }}'); do \
                 rbd snap unprotect $i@$s 2>/dev/null; done; \
                 rbd snap purge --no-progress $i 2>/dev/null; rbd rm --no-progress $i 2>/dev/null; true"
            );
            let (ok, text) = self.cli(&["sh", "-c", &script]);
            assert!(ok, "forget {name}: {text}");
        }
        let images = self.images();
        assert!(
            !images.iter().any(|i| i.starts_with(stem)),
            "earlier golden images are still there: {images:?}"
        );
    }
}

/// The provider's flags for `count` slots of `rbd.small` per zone of `zones`, its disks in
/// the rbd pool and its seeds in the tier's dir pool, plus `extra`.
fn flags(
    (tier, ceph, image): (&Tier, &Ceph, &str),
    dir: &Path,
    label: &str,
    zones: &[&Zone],
) -> Vec<String> {
    let types = dir.join(format!("{label}-types.json"));
    std::fs::write(&types, TYPES).unwrap();
    let offerings = dir.join(format!("{label}-offerings.json"));
    let entries: Vec<String> = (zones.iter())
        .map(|z| {
            format!(
                r#"{{ "instance_type": "rbd.small", "zone": "{}", "count": 1 }}"#,
                z.label
            )
        })
        .collect();
    std::fs::write(&offerings, format!("[{}]", entries.join(","))).unwrap();
    let connect: Vec<String> = zones
        .iter()
        .map(|z| format!("{}={}", z.label, z.uri))
        .collect();
    vec![
        format!("--connect={}", connect.join(",")),
        format!("--provider={label}"),
        image.to_owned(),
        format!("--storage-pool={}", ceph.rbd_pool),
        format!("--seed-pool={}", tier.pool),
        "--network=".to_owned(),
        "--domain-type=qemu".to_owned(),
        format!("--instance-types={}", types.display()),
        format!("--offerings={}", offerings.display()),
        "--host-reserve-cpu=0".to_owned(),
        "--host-reserve-memory-mib=0".to_owned(),
    ]
}

/// One machine's walk: Create → agent answers, its disks checked in Ceph and in the guest,
/// Configure, Drain, Delete → nothing of it left in Ceph or the seed pool.
async fn walk(server: &Server, (ceph, golden): (&Ceph, &str), zone: &Zone, id: &str, real: bool) {
    let seeds = Tier::from_env().pool;
    let mut c = server.client().await;
    let start = Instant::now();
    let accepted = create(&mut c, id, None).await;
    let (idle, _) = settle(&mut c, id, accepted, S::Idle, BOOT, start).await;
    let name = domain_name(&idle);
    let conn = Connect::open(Some(&zone.uri)).expect("connect to the zone");
    let domain = conn
        .lookup_domain_by_name(&name)
        .expect("Create defined it");
    until_explained(&format!("{name}'s guest agent answering"), BOOT, || {
        guest::agent(&domain, &json!({"execute": "guest-ping"})).map(|_| ())
    })
    .await;
    println!(
        "qemu_ceph: {name} on {} ({}) answers its agent {:.1?} after Create",
        zone.label,
        if real {
            "the real image, booted from its RBD clone"
        } else {
            "tiny guest"
        },
        start.elapsed()
    );
    assert_in_ceph(ceph, &name, golden);
    assert_disks_seen(&domain, real);

    let accepted = configure_map(
        &mut c,
        id,
        "rbd-cluster",
        md(&[]),
        b"# rbd\n".to_vec(),
        None,
    )
    .await;
    let (configured, _) = settle(&mut c, id, accepted, S::Configured, BOOT, Instant::now()).await;
    assert_eq!(configured.last_error, "");
    let accepted = drain(&mut c, id, 5, None).await;
    let (drained, _) = settle(&mut c, id, accepted, S::Idle, BOOT, Instant::now()).await;
    assert_eq!(drained.cluster, "");
    let accepted = delete(&mut c, id, None).await;
    let (gone, _) = settle(&mut c, id, accepted, S::Speculative, BOOT, Instant::now()).await;
    assert!(!host_set(&gone), "{gone:?}");
    assert!(
        conn.lookup_domain_by_name(&name).is_err(),
        "{name} is undefined"
    );
    let left: Vec<String> = (ceph.images().into_iter())
        .filter(|i| i.starts_with(&name))
        .collect();
    assert_eq!(
        left,
        Vec::<String>::new(),
        "Delete removed the clone and the data disks"
    );
    let pool = conn
        .lookup_storage_pool_by_name(&seeds)
        .expect("the seed pool");
    pool.refresh(0).expect("refresh the seed pool");
    let seeds_left: Vec<String> = (pool.list_volumes().expect("list the seed pool").into_iter())
        .filter(|v| v.starts_with(&name))
        .collect();
    assert_eq!(seeds_left, Vec::<String>::new(), "Delete removed the seed");
}

/// The root is a copy-on-write clone of the golden image grown to 8 GiB; the data disks
/// are RBD images of their sizes.
fn assert_in_ceph(ceph: &Ceph, name: &str, golden: &str) {
    let (ok, info) = ceph.cli(&["rbd", "info", &format!("{}/{name}-root", ceph.ceph_pool)]);
    assert!(ok, "rbd info of the root: {info}");
    assert!(
        info.contains(&format!("parent: {}/{golden}@", ceph.ceph_pool)),
        "the root is a clone of the golden image: {info}"
    );
    assert!(
        info.contains("size 8 GiB"),
        "the root is grown to 8 GiB: {info}"
    );
    for (disk, gib) in DATA {
        let image = format!("{}/{name}-data-{disk}", ceph.ceph_pool);
        let (ok, info) = ceph.cli(&["rbd", "info", &image]);
        assert!(ok, "rbd info {image}: {info}");
        assert!(info.contains(&format!("size {gib} GiB")), "{image}: {info}");
    }
}

/// Through the agent: each disk's serial and size as the guest's kernel sees them.
fn assert_disks_seen(domain: &Domain, real: bool) {
    let seen = guest::run(
        domain,
        "for d in /sys/block/vd*; do echo \"$(cat $d/serial) $(cat $d/size)\"; done",
    );
    println!(
        "qemu_ceph: the guest's disks (serial, 512-byte sectors): {}",
        seen.trim()
    );
    let sectors = |gib: u64| (gib << 30) / 512;
    let lines: Vec<&str> = seen.lines().map(str::trim).collect();
    assert!(
        lines.contains(&format!("root {}", sectors(8)).as_str()),
        "{seen}"
    );
    for (disk, gib) in DATA {
        assert!(
            lines.contains(&format!("{disk} {}", sectors(gib)).as_str()),
            "{seen}"
        );
    }
    if real {
        let root = guest::run(domain, "findmnt -no SOURCE /");
        assert!(
            root.trim().starts_with("/dev/vda"),
            "/ is on the RBD root: {root}"
        );
    }
}

/// One provider over zones a and b with tiny guests and `--image-source`: one upload for
/// the cluster, and a machine walked in each zone, both cloned from that one image.
async fn tiny_guests_in_two_zones(cluster: (&Tier, &Ceph, &str), dir: &Path, golden: &str) {
    let (tier, ceph, _) = cluster;
    // libvirt leaves an rbd pool inactive whenever its daemon restarts (and autostart runs
    // once per host boot): zone b's libvirtd restarted, as an upgrade would, and the
    // provider starts the pool again when it connects.
    tier.libvirtd(&tier.b, "term");
    tier.libvirtd(&tier.b, "start");
    let rbd_active = || {
        (Connect::open(Some(&tier.b.uri)).expect("connect to zone b"))
            .lookup_storage_pool_by_name(&ceph.rbd_pool)
            .and_then(|p| p.is_active())
            .expect("zone b's rbd pool")
    };
    assert!(!rbd_active(), "libvirtd left zone b's rbd pool inactive");
    // The tiny guests, one in each zone, both cloned from the one golden image.
    let mut args = flags(cluster, dir, "rbd-tiny", &[&tier.a, &tier.b]);
    args.extend([
        format!("--guest-kernel={}", tier.kernel),
        format!("--guest-initrd={}", tier.initrd),
        format!("--guest-cmdline={}", tier.cmdline),
    ]);
    let tiny = Server::start(&args.iter().map(String::as_str).collect::<Vec<_>>());
    let mut c = tiny.client().await;
    let (in_a, in_b) = (
        ids_in(&mut c, tier.a.label).await,
        ids_in(&mut c, tier.b.label).await,
    );
    // Both zones' rbd pools name the one cluster: one of them uploaded, the other found it.
    for zone in [&tier.a, &tier.b] {
        golden_ready(&tiny, zone).await;
    }
    assert!(rbd_active(), "the provider started zone b's rbd pool");
    let log = tiny.log_text();
    assert_eq!(
        log.matches("rbd storage pool was inactive").count(),
        1,
        "zone b's pool, started once: {log}"
    );
    let uploads = log
        .matches("golden image uploaded into the Ceph pool")
        .count();
    assert_eq!(
        uploads, 1,
        "one upload for the cluster, not one per host: {log}"
    );
    let (ok, info) = ceph.cli(&["rbd", "info", &format!("{}/{golden}", ceph.ceph_pool)]);
    assert!(
        ok && info.contains(&format!("parent: {}/{golden}.upload@", ceph.ceph_pool)),
        "the golden image is named by a clone of its completed upload: {info}"
    );
    tokio::join!(
        walk(&tiny, (ceph, golden), &tier.a, &in_a[0], false),
        walk(&tiny, (ceph, golden), &tier.b, &in_b[0], false)
    );
}

/// Waits until `server`'s golden image is ready on `zone` (uploaded, or found).
async fn golden_ready(server: &Server, zone: &Zone) {
    let labels = [("zone", zone.label), ("state", "ready")];
    let took = gauge_until(server, "bigfleet_libvirt_golden_image", &labels, 1.0, BOOT).await;
    println!(
        "qemu_ceph: the golden image is ready on {} after {took:.1?}",
        zone.label
    );
}

// Guest reads block their worker; the gRPC connections keep their own threads (as in
// `qemu_image`).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs the real-QEMU tier: run scripts/qemu-tier/run.sh ci"]
async fn rbd_clones_in_two_zones_and_the_real_image_booted_from_ceph() {
    let _wall = WallTime::start("rbd");
    let (tier, ceph) = (Tier::from_env(), Ceph::from_env());
    // `--image-source`: the tier's real image as the provider reads it, and the
    // content-addressed name it gets (`<stem>-<first 16 hex of its sha256>.qcow2`).
    let file = tier.a.root.join("guest/debian-12-bigfleet.qcow2");
    let out = Command::new("sha256sum")
        .arg(&file)
        .output()
        .expect("sha256sum");
    let hash: String = String::from_utf8_lossy(&out.stdout)
        .chars()
        .take(16)
        .collect();
    assert!(
        out.status.success() && hash.len() == 16,
        "{}",
        file.display()
    );
    let golden = format!("debian-12-bigfleet-{hash}.qcow2");
    ceph.forget_goldens("debian-12-bigfleet-");
    let source = format!("--image-source={}", file.display());
    let cluster = (&tier, &ceph, source.as_str());
    let dir = tempfile::tempdir().unwrap();

    tiny_guests_in_two_zones(cluster, dir.path(), &golden).await;

    // The real image, its own boot loader on its clone, in zone a.
    let args = flags(cluster, dir.path(), "rbd-real", &[&tier.a]);
    let real = Server::start(&args.iter().map(String::as_str).collect::<Vec<_>>());
    let mut c = real.client().await;
    let id = ids_in(&mut c, tier.a.label).await.remove(0);
    golden_ready(&real, &tier.a).await;
    assert!(
        !real.log_text().contains("golden image uploaded"),
        "a second provider finds the image in the cluster"
    );
    walk(&real, (&ceph, &golden), &tier.a, &id, true).await;
    let left: Vec<String> = (ceph.images().into_iter())
        .filter(|image| !image.starts_with(&golden))
        .collect();
    assert_eq!(
        left,
        Vec::<String>::new(),
        "only golden images are left in the pool"
    );
}
