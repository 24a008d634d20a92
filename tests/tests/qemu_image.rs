//! Issue 26 — the real golden image, booted the way production boots it: the tier's Debian 12
//! image (`scripts/qemu-tier/image.sh`: its own GRUB for BIOS and UEFI, systemd, cloud-init,
//! qemu-guest-agent, the bigfleet hooks and a stand-in kubelet join unit) on the tier's image
//! zone `c`, whose libvirtd runs in a network namespace with libvirt's NAT network `default`.
//! The provider runs with the production domain XML: no `--guest-kernel`, the default
//! `--network default`, `--domain-type kvm` where the zone's QEMU can use `/dev/kvm` (else
//! `qemu`), with a CPU mode that works there.
//!
//! Everything the tests check in the guest is read through the guest agent over the zone's
//! local socket, independently of the provider. `#[ignore]`d outside the tier
//! (`scripts/qemu-tier/run.sh ci`).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use base64::engine::general_purpose::STANDARD;
use bigfleet_libvirt_proto::v1alpha1 as pb;
use pb::MachineState as S;
use serde_json::json;
use virt::connect::Connect;
use virt::domain::Domain;

use crate::harness::*;
use crate::qemu_zones::{domain_name, until_explained};

pub mod guest;
mod identity;
mod ignition;
mod kvm;
mod network;

/// A full Debian boot (systemd, cloud-init) under TCG takes a while (cloud-init done up to
/// 206 s on the shared 2-core machine, docs/testing.md); KVM is much faster. No shorter than the
/// provider's own deadlines (Configure 8 min), as `qemu_zones::BOOT`.
const BOOT: Duration = Duration::from_secs(600);
/// The CPU mode the KVM guests run with, unless `BIGFLEET_QEMU_KVM_CPU` names another: a named
/// model, since on some nested KVM hosts `host-passthrough` and `host-model` abort QEMU 7.2 at
/// start (it cannot set MSR 0x10a); `kvm64` is one libvirt accepts on Intel and AMD hosts
/// (`qemu64` needs `svm`, which Intel hosts refuse).
const KVM_CPU: &str = "kvm64";

fn var(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| {
        panic!(
            "{name} is not set: these tests run inside the real-QEMU tier (scripts/qemu-tier/run.sh ci)"
        )
    })
}

/// The image zone of the tier the script started.
#[derive(Clone, Debug)]
pub struct ImageTier {
    uri: String,
    /// Where the zone's file system is on this host.
    root: PathBuf,
    pool: String,
    image: String,
    /// `Ok` when the zone's QEMU can use KVM, else why not.
    kvm: Result<(), String>,
}

/// How a guest is run: the domain type and CPU mode, as the test output reports them.
#[derive(Clone, Debug)]
pub struct Accel {
    pub domain_type: &'static str,
    pub cpu: Option<String>,
}

impl Accel {
    fn flags(&self) -> Vec<String> {
        let mut flags = vec![format!("--domain-type={}", self.domain_type)];
        flags.extend(self.cpu.iter().map(|cpu| format!("--cpu={cpu}")));
        flags
    }

    pub fn describe(&self) -> String {
        let engine = if self.domain_type == "kvm" {
            "KVM"
        } else {
            "TCG (no KVM)"
        };
        format!(
            "{engine}, --domain-type {}, CPU {}",
            self.domain_type,
            self.cpu.as_deref().unwrap_or("QEMU's default model")
        )
    }
}

impl ImageTier {
    /// The image zone, with what an earlier scenario left behind removed first (see `sweep`).
    pub fn from_env() -> Self {
        let kvm = var("BIGFLEET_QEMU_KVM");
        let tier = Self {
            uri: var("BIGFLEET_QEMU_URI_C"),
            root: PathBuf::from(var("BIGFLEET_QEMU_ROOT_C")),
            pool: var("BIGFLEET_QEMU_POOL"),
            image: var("BIGFLEET_QEMU_REAL_IMAGE"),
            kvm: if kvm == "yes" { Ok(()) } else { Err(kvm) },
        };
        Libvirt::open(&tier).sweep();
        tier
    }

    /// KVM with the working CPU mode where the zone has it, else TCG with QEMU's default model.
    /// `BIGFLEET_QEMU_IMAGE_TCG=1` forces TCG (to measure it on a KVM host).
    pub fn accel(&self) -> Accel {
        let tcg = std::env::var("BIGFLEET_QEMU_IMAGE_TCG").as_deref() == Ok("1");
        if self.kvm.is_ok() && !tcg {
            self.kvm_accel()
        } else {
            Accel {
                domain_type: "qemu",
                cpu: None,
            }
        }
    }

    pub fn kvm_accel(&self) -> Accel {
        let cpu = std::env::var("BIGFLEET_QEMU_KVM_CPU").unwrap_or_else(|_| KVM_CPU.to_owned());
        Accel {
            domain_type: "kvm",
            cpu: Some(cpu),
        }
    }

    /// The provider's flags: `count` slots of a 1 vCPU / 1 GiB type with `disks` in zone
    /// `local` on the image zone, the real image, the default NIC, `accel`, plus `extra`.
    pub fn flags(
        &self,
        dir: &Path,
        label: &str,
        count: u32,
        accel: &Accel,
        extra: &[&str],
        disks: &DiskPlan,
    ) -> Vec<String> {
        let types = dir.join(format!("{label}-types.json"));
        std::fs::write(&types, disks.types_json()).unwrap();
        let offerings = dir.join(format!("{label}-offerings.json"));
        let offer =
            format!(r#"[{{ "instance_type": "img.small", "zone": "local", "count": {count} }}]"#);
        std::fs::write(&offerings, offer).unwrap();
        let mut args = vec![
            format!("--connect={}", self.uri),
            format!("--provider={label}"),
            format!("--image={}", self.image),
            format!("--storage-pool={}", self.pool),
            format!("--instance-types={}", types.display()),
            format!("--offerings={}", offerings.display()),
            "--host-reserve-cpu=0".to_owned(),
            "--host-reserve-memory-mib=0".to_owned(),
        ];
        args.extend(accel.flags());
        args.extend(extra.iter().map(|a| (*a).to_owned()));
        args
    }

    pub fn provider(
        &self,
        dir: &Path,
        label: &str,
        count: u32,
        accel: &Accel,
        extra: &[&str],
        disks: &DiskPlan,
    ) -> Server {
        let args = self.flags(dir, label, count, accel, extra, disks);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        Server::start(&args)
    }

    /// A file of the zone's file system, by its path there.
    pub fn host_path(&self, path: &str) -> PathBuf {
        self.root.join(path.trim_start_matches('/'))
    }
}

/// The image tier type's disks: a root of `root_gib` (none: as the image asks) and data
/// disks by name and GiB; with `secure`, the type also boots with Secure Boot and has a
/// virtual TPM.
#[derive(Clone, Debug, Default)]
pub struct DiskPlan {
    pub root_gib: Option<u64>,
    pub data: Vec<(&'static str, u64)>,
    pub secure: bool,
    /// The type's `boot` (none: the default, `agent`).
    pub boot: Option<&'static str>,
}

impl DiskPlan {
    /// The instance-types file: `img.small`, 1 vCPU / 1 GiB, with these disks.
    fn types_json(&self) -> String {
        let mut shape = json!({ "vcpu": 1, "memory_mib": 1024 });
        if let Some(gib) = self.root_gib {
            shape["disk_gib"] = json!(gib);
        }
        if !self.data.is_empty() {
            let data: Vec<_> = (self.data.iter())
                .map(|(name, gib)| json!({ "name": name, "size_gib": gib }))
                .collect();
            shape["data_disks"] = json!(data);
        }
        if self.secure {
            shape["secure_boot"] = json!(true);
            shape["tpm"] = json!(true);
        }
        if let Some(boot) = self.boot {
            shape["boot"] = json!(boot);
        }
        json!({ "img.small": shape }).to_string()
    }

    /// Checks, through the agent, what the guest sees: the root file system grown to the
    /// planned root (cloud-init's growpart and resize) and every data disk by its serial at
    /// its size.
    fn assert_seen(&self, domain: &Domain) {
        let seen = guest::run(domain, "findmnt -bno SIZE /; ls /dev/disk/by-id");
        println!(
            "cloud_image: the guest's / (bytes) and disks by id: {}",
            seen.split_whitespace().collect::<Vec<_>>().join(" ")
        );
        let root = guest::run(domain, "readlink -f /dev/disk/by-id/virtio-root");
        assert!(
            root.trim().starts_with("/dev/vd"),
            "the root disk by serial: {root}"
        );
        if let Some(gib) = self.root_gib {
            let size = guest::run(domain, "findmnt -bno SIZE /");
            let bytes: u64 = size
                .trim()
                .parse()
                .unwrap_or_else(|e| panic!("{size:?}: {e}"));
            // The file system spans the grown partition: all of the disk but the boot
            // partitions and ext4's own overhead.
            let (low, high) = ((gib - 2) << 30, gib << 30);
            assert!(
                (low..high).contains(&bytes),
                "/ is {bytes} bytes, not grown to the {gib} GiB root"
            );
        }
        for (name, gib) in &self.data {
            let script = format!("blockdev --getsize64 /dev/disk/by-id/virtio-{name}");
            let size = guest::run(domain, &script);
            assert_eq!(size.trim(), (gib << 30).to_string(), "data disk {name}");
        }
    }
}

/// A direct connection to the image zone's libvirtd.
pub struct Libvirt {
    conn: Connect,
    pool: String,
    /// Where the zone's file system is on this host.
    root: PathBuf,
}

impl Libvirt {
    pub fn open(tier: &ImageTier) -> Self {
        virt::error::clear_error_callback();
        let conn = Connect::open(Some(&tier.uri)).expect("connect to the image zone's libvirtd");
        Self {
            conn,
            pool: tier.pool.clone(),
            root: tier.root.clone(),
        }
    }

    pub fn domain(&self, name: &str) -> Option<Domain> {
        self.conn.lookup_domain_by_name(name).ok()
    }

    /// The bytes of domain `name`'s seed as the zone's host holds them.
    pub fn seed_bytes(&self, name: &str) -> Vec<u8> {
        (self.volume_bytes(&format!("{name}-cidata.iso"))).expect("the domain's seed volume")
    }

    /// The bytes of volume `volume` of the pool as the zone's host holds them (`None`: no
    /// such volume).
    pub fn volume_bytes(&self, volume: &str) -> Option<Vec<u8>> {
        let pool = (self.conn.lookup_storage_pool_by_name(&self.pool)).expect("the tier's pool");
        pool.refresh(0).expect("refresh the pool");
        let volume = pool.lookup_storage_vol_by_name(volume).ok()?;
        let path = volume.path().expect("the volume's path");
        Some(std::fs::read(self.root.join(path.trim_start_matches('/'))).expect("read the volume"))
    }

    /// The bytes the host has allocated to volume `volume` of the pool (`None`: no such
    /// volume).
    pub fn volume_allocation(&self, volume: &str) -> Option<u64> {
        let pool = (self.conn.lookup_storage_pool_by_name(&self.pool)).expect("the tier's pool");
        pool.refresh(0).expect("refresh the pool");
        let volume = pool.lookup_storage_vol_by_name(volume).ok()?;
        Some(volume.info().expect("the volume's info").allocation)
    }

    pub fn volumes(&self) -> Vec<String> {
        let pool = self
            .conn
            .lookup_storage_pool_by_name(&self.pool)
            .expect("the tier's pool");
        pool.refresh(0).expect("refresh the pool");
        let mut names = pool.list_volumes().expect("list volumes");
        names.sort();
        names
    }

    /// Removes every provider domain (`bigfleet-*`) in the zone and the volumes named after
    /// it. The image scenarios run one at a time and each starts with an empty zone: a scenario
    /// that failed part-way leaves its guests running, and those would otherwise take the
    /// next scenario's CPU (TCG) and its provider's slots (`not enough Speculative machines`).
    fn sweep(&self) {
        let leftovers: Vec<(Domain, String)> = (self.conn.list_all_domains(0))
            .expect("list the zone's domains")
            .into_iter()
            .map(|d| {
                let name = d.name().expect("a domain's name");
                (d, name)
            })
            .filter(|(_, n)| n.starts_with("bigfleet-"))
            .collect();
        for (domain, name) in &leftovers {
            if domain.is_active().expect("is the domain running") {
                domain.destroy().expect("destroy a leftover domain");
            }
            domain
                .undefine_flags(virt::sys::VIR_DOMAIN_UNDEFINE_NVRAM)
                .or_else(|_| domain.undefine())
                .expect("undefine a leftover domain");
            println!("qemu_image: removed {name}, left by an earlier scenario");
        }
        let pool = self
            .conn
            .lookup_storage_pool_by_name(&self.pool)
            .expect("the tier's pool");
        for volume in self.volumes() {
            if leftovers
                .iter()
                .any(|(_, n)| volume.starts_with(n.as_str()))
            {
                let vol = pool
                    .lookup_storage_vol_by_name(&volume)
                    .expect("a leftover volume");
                vol.delete(0).expect("delete a leftover volume");
                println!("qemu_image: removed volume {volume}");
            }
        }
    }
}

/// The sha256 of `bytes` as hex, by the host's `sha256sum`.
fn sha256_hex(bytes: &[u8]) -> String {
    use std::io::Write as _;
    let mut child = std::process::Command::new("sha256sum")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("run sha256sum");
    child.stdin.take().unwrap().write_all(bytes).unwrap();
    let out = child.wait_with_output().expect("sha256sum");
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .to_owned()
}

/// A binary bootstrap blob of `len` bytes (every byte value).
fn blob(len: u32) -> Vec<u8> {
    (0..len)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect()
}

/// Prints a scenario's wall time when it ends, also when it fails part-way (the tier's
/// output then shows where its minutes went).
pub struct WallTime(&'static str, Instant);

impl WallTime {
    pub fn start(scenario: &'static str) -> Self {
        Self(scenario, Instant::now())
    }
}

impl Drop for WallTime {
    fn drop(&mut self) {
        println!("{}: wall time {:.1?}", self.0, self.1.elapsed());
    }
}

/// What one walk measured.
#[derive(Debug, Default)]
pub struct Timings {
    pub create_idle: Duration,
    pub agent_ready: Duration,
    pub configured: Duration,
    pub cloud_init_done: Duration,
    pub drain: Duration,
    pub delete: Duration,
    /// The guest's own account of its boot: `systemd-analyze` (firmware, loader, kernel,
    /// initrd, userspace), the chain the agent's unit waited on, and the slowest units.
    pub boot: String,
}

impl Timings {
    pub fn print(&self, what: &str) {
        println!("{what}:");
        println!(
            "  Create → Idle (domain running)      {:>9.2?}",
            self.create_idle
        );
        println!(
            "  Create → guest agent answers (boot) {:>9.2?}",
            self.agent_ready
        );
        println!(
            "  Create → Configured                 {:>9.2?}",
            self.configured
        );
        println!(
            "  Create → cloud-init done            {:>9.2?}",
            self.cloud_init_done
        );
        println!("  Drain → Idle                        {:>9.2?}", self.drain);
        println!(
            "  Delete → Speculative                {:>9.2?}",
            self.delete
        );
        println!("  the guest's boot, as systemd saw it:");
        for line in self.boot.lines() {
            println!("    {line}");
        }
    }
}

/// Create → Idle, then the time until the guest agent answers (both since the Create).
/// Returns the Idle machine, its domain, and the two durations.
async fn create_and_boot(
    c: &mut Client,
    virt: &Libvirt,
    id: &str,
) -> (pb::Machine, Domain, Duration, Duration) {
    let start = Instant::now();
    let accepted = create(c, id, None).await;
    let (idle, create_idle) = settle(c, id, accepted, S::Idle, BOOT, start).await;
    let name = domain_name(&idle);
    let domain = virt.domain(&name).expect("Create defined the domain");
    assert!(domain.is_active().unwrap(), "{name} is running");
    until_explained(&format!("{name}'s guest agent answering"), BOOT, || {
        guest::agent(&domain, &json!({"execute": "guest-ping"})).map(|_| ())
    })
    .await;
    (idle, domain, create_idle, start.elapsed())
}

/// The volumes of `virt`'s pool that belong to domain `name` (another walk may share the
/// pool at the same time).
fn own_volumes(virt: &Libvirt, name: &str) -> Vec<String> {
    (virt.volumes().into_iter())
        .filter(|v| v.starts_with(&format!("{name}-")))
        .collect()
}

/// Deletes `id` (domain `name`) and checks that its domain, its volumes and the host files in
/// `left` are gone; returns how long the Delete took.
async fn delete_and_check(
    c: &mut Client,
    id: &str,
    virt: &Libvirt,
    name: &str,
    left: Vec<PathBuf>,
) -> Duration {
    let delete_start = Instant::now();
    let accepted = delete(c, id, None).await;
    let (gone, delete_wall) = settle(c, id, accepted, S::Speculative, BOOT, delete_start).await;
    assert!(!host_set(&gone), "{gone:?}");
    assert!(virt.domain(name).is_none(), "{name} is undefined");
    assert_eq!(
        own_volumes(virt, name),
        Vec::<String>::new(),
        "Delete removed every volume it made"
    );
    for file in left {
        assert!(!file.exists(), "Delete removed {}", file.display());
    }
    delete_wall
}

/// The whole lifecycle of one slot of `server` on the real image, with every in-guest check
/// of `cloud_image`, its type's disks as `disks` plans them; returns what it measured.
pub async fn walk(server: &Server, virt: &Libvirt, cluster: &str, disks: &DiskPlan) -> Timings {
    let mut c = server.client().await;
    let id = pick(server, &mut c).await;
    let start = Instant::now();
    let (idle, domain, create_idle, agent_ready) = create_and_boot(&mut c, virt, &id).await;
    let name = domain_name(&idle);
    assert_eq!(
        own_volumes(virt, &name).len(),
        3 + disks.data.len(),
        "Create made the overlay, the seed, the console log and the data disks of {name}"
    );

    let blob = blob(64 * 1024);
    let accepted = configure_map(
        &mut c,
        &id,
        cluster,
        md(&[("team", "image")]),
        blob.clone(),
        None,
    )
    .await;
    let (configured, _) = settle(&mut c, &id, accepted, S::Configured, BOOT, start).await;
    let configured_at = start.elapsed();
    assert_eq!(configured.cluster, cluster);
    assert_eq!(configured.last_error, "");
    guest::cloud_init_done(&domain, &name).await;
    let cloud_init_done = start.elapsed();
    let boot = guest::run(
        &domain,
        "systemd-analyze time; systemd-analyze critical-chain --no-pager \
         qemu-guest-agent.service; systemd-analyze blame --no-pager | head -n 15",
    );
    disks.assert_seen(&domain);
    let secure = disks
        .secure
        .then(|| guest::assert_secure(&domain, &virt.root, &name));
    guest::assert_joined(&domain, cluster, &sha256_hex(&blob));

    // A fresh connection: the provider closes client connections left idle while the guest
    // was read.
    let mut c = server.client().await;
    let drain_start = Instant::now();
    let accepted = drain(&mut c, &id, 30, None).await;
    let (drained, drain_wall) = settle(&mut c, &id, accepted, S::Idle, BOOT, drain_start).await;
    assert_eq!(drained.cluster, "");
    guest::assert_drained(&domain, 30);

    let delete_wall = delete_and_check(&mut c, &id, virt, &name, secure.unwrap_or_default()).await;
    Timings {
        create_idle,
        agent_ready,
        configured: configured_at,
        cloud_init_done,
        drain: drain_wall,
        delete: delete_wall,
        boot,
    }
}

// The guest reads (`guest::`) call the agent synchronously and block their worker; on a
// runtime of its own threads the gRPC connections' tasks keep answering the provider's HTTP/2
// keepalive pings meanwhile (a ping unanswered for 10 s drops the connection, and with it a
// call in flight: seen under load when two walks shared one thread).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs the real-QEMU tier: run scripts/qemu-tier/run.sh ci"]
async fn cloud_image() {
    let _wall = WallTime::start("cloud_image");
    let tier = ImageTier::from_env();
    let accel = tier.accel();
    println!("cloud_image: {}", accel.describe());
    let dir = tempfile::tempdir().unwrap();
    let virt = Libvirt::open(&tier);
    // BIOS (GRUB from the MBR) and UEFI (OVMF, Debian's signed shim and GRUB) boot the same
    // image at once; the BIOS machine's type has a 20 GiB root and two data disks (issue 42),
    // the UEFI one's the image's own size and none, and Secure Boot with a virtual TPM.
    let shaped = DiskPlan {
        root_gib: Some(20),
        data: vec![("data1", 2), ("scratch", 3)],
        ..DiskPlan::default()
    };
    let bios = tier.provider(dir.path(), "img-bios", 1, &accel, &[], &shaped);
    let plain = DiskPlan {
        secure: true,
        ..DiskPlan::default()
    };
    let efi = tier.provider(
        dir.path(),
        "img-efi",
        1,
        &accel,
        &["--firmware=efi"],
        &plain,
    );
    let (bios_t, efi_t) = tokio::join!(
        walk(&bios, &virt, "image-cluster-bios", &shaped),
        walk(&efi, &virt, "image-cluster-efi", &plain)
    );
    bios_t.print(&format!("real image, BIOS, {}", accel.describe()));
    efi_t.print(&format!("real image, --firmware efi, {}", accel.describe()));
}
