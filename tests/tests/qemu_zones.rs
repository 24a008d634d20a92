//! The two-zone rig of the real-QEMU fault tests (`qemu_faults`): the tier's two real
//! libvirtd daemons as zones `rackA` and `rackB`, the provider started over both, a direct
//! libvirt connection per zone for checks the provider cannot vouch for, and the tier
//! script's `libvirtd ZONE kill|term|start` to break and mend a daemon.
//!
//! Everything comes from the `BIGFLEET_QEMU_*` exports of `scripts/qemu-tier/run.sh env`; the
//! tests are `#[ignore]`d outside `scripts/qemu-tier/run.sh ci`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use bigfleet_libvirt_proto::v1alpha1 as pb;
use pb::MachineState as S;
use virt::connect::Connect;
use virt::domain::Domain;
use virt::storage_pool::StoragePool;

use crate::harness::scrape::scrape;
use crate::harness::*;

/// How long a walk may take on the tier: no shorter than the provider's own deadlines
/// (Create and Delete 5 min, Configure 8 min), so a slow guest ends by the provider's
/// verdict (FAILED, saying why), not by the test's impatience. A TCG boot to the agent took
/// up to 185 s on the shared 2-core machine (docs/testing.md, tier timings); the former 240 s was
/// within 1.3x of that, and below the Create deadline `daemon_restart` waits out.
pub const BOOT: Duration = Duration::from_secs(600);

fn var(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| {
        panic!(
            "{name} is not set: these tests run inside the real-QEMU tier (scripts/qemu-tier/run.sh ci)"
        )
    })
}

/// One zone: a libvirtd of the tier.
#[derive(Clone, Debug)]
pub struct Zone {
    /// The provider's zone label.
    pub label: &'static str,
    /// The tier's zone name (`a` or `b`), for the tier script.
    pub tier: &'static str,
    pub uri: String,
    /// Where this daemon's file system is on this host.
    pub root: PathBuf,
}

/// The tier the script prepared.
#[derive(Clone, Debug)]
pub struct Tier {
    pub a: Zone,
    pub b: Zone,
    pub pool: String,
    pub image: String,
    pub kernel: String,
    pub initrd: String,
    /// The guest's kernel command line (`--guest-cmdline`); the benchmark adds
    /// `bigfleet.agent=off` for guests whose agent never answers.
    pub cmdline: String,
    /// `--domain-type` (`qemu` in the tests; the benchmark probes for `kvm`).
    pub domain_type: &'static str,
    script: PathBuf,
}

impl Tier {
    pub fn from_env() -> Self {
        Self {
            a: Zone {
                label: "rackA",
                tier: "a",
                uri: var("BIGFLEET_QEMU_URI"),
                root: PathBuf::from(var("BIGFLEET_QEMU_ROOT")),
            },
            b: Zone {
                label: "rackB",
                tier: "b",
                uri: var("BIGFLEET_QEMU_URI_B"),
                root: PathBuf::from(var("BIGFLEET_QEMU_ROOT_B")),
            },
            pool: var("BIGFLEET_QEMU_POOL"),
            image: var("BIGFLEET_QEMU_IMAGE"),
            kernel: var("BIGFLEET_QEMU_KERNEL"),
            initrd: var("BIGFLEET_QEMU_INITRD"),
            cmdline: var("BIGFLEET_QEMU_CMDLINE"),
            domain_type: "qemu",
            script: PathBuf::from(var("BIGFLEET_QEMU_TIER_SCRIPT")),
        }
    }

    /// Starts the provider over both zones with `per_zone` slots of a tiny type in each
    /// (`(rackA count, rackB count)`), plus `extra` flags.
    pub fn provider(
        &self,
        dir: &Path,
        label: &str,
        per_zone: (u32, u32),
        extra: &[&str],
    ) -> Server {
        let args = self.provider_args(dir, label, per_zone, extra);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        Server::start(&args)
    }

    /// The flags [`Tier::provider`] starts the provider with (its files written to `dir`).
    pub fn provider_args(
        &self,
        dir: &Path,
        label: &str,
        per_zone: (u32, u32),
        extra: &[&str],
    ) -> Vec<String> {
        self.provider_args_shaped(dir, label, per_zone, "", extra)
    }

    /// As [`Tier::provider_args`], with `shape` (JSON members, e.g. a `"data_disks"` list)
    /// added to the `e2e.tiny` type.
    pub fn provider_args_shaped(
        &self,
        dir: &Path,
        label: &str,
        per_zone: (u32, u32),
        shape: &str,
        extra: &[&str],
    ) -> Vec<String> {
        let types = dir.join(format!("{label}-types.json"));
        let more = if shape.is_empty() {
            String::new()
        } else {
            format!(", {shape}")
        };
        std::fs::write(
            &types,
            format!(r#"{{ "e2e.tiny": {{ "vcpu": 1, "memory_mib": 384{more} }} }}"#),
        )
        .unwrap();
        let offerings = dir.join(format!("{label}-offerings.json"));
        let mut entries = Vec::new();
        for (zone, count) in [(&self.a, per_zone.0), (&self.b, per_zone.1)] {
            if count > 0 {
                entries.push(format!(
                    r#"{{ "instance_type": "e2e.tiny", "zone": "{}", "count": {count} }}"#,
                    zone.label
                ));
            }
        }
        std::fs::write(&offerings, format!("[{}]", entries.join(","))).unwrap();
        let mut args = vec![
            format!(
                "--connect={}={},{}={}",
                self.a.label, self.a.uri, self.b.label, self.b.uri
            ),
            format!("--provider={label}"),
            format!("--image={}", self.image),
            format!("--storage-pool={}", self.pool),
            "--network=".to_owned(),
            format!("--domain-type={}", self.domain_type),
            format!("--guest-kernel={}", self.kernel),
            format!("--guest-initrd={}", self.initrd),
            format!("--guest-cmdline={}", self.cmdline),
            format!("--instance-types={}", types.display()),
            format!("--offerings={}", offerings.display()),
            "--host-reserve-cpu=0".to_owned(),
            "--host-reserve-memory-mib=0".to_owned(),
        ];
        args.extend(extra.iter().map(|a| (*a).to_owned()));
        args
    }

    /// `scripts/qemu-tier/run.sh libvirtd <zone> <action>` (kill, term or start).
    pub fn libvirtd(&self, zone: &Zone, action: &str) {
        let status = Command::new(&self.script)
            .args(["libvirtd", zone.tier, action])
            .status()
            .expect("run the tier script");
        assert!(
            status.success(),
            "libvirtd {} {action}: {status}",
            zone.tier
        );
    }

    /// Real `virsh` against a zone's daemon, through the tier script.
    pub fn virsh(&self, zone: &Zone, args: &[&str]) {
        let status = Command::new(&self.script)
            .env("QEMU_TIER_ZONE", zone.tier)
            .arg("virsh")
            .args(args)
            .stdout(std::process::Stdio::null())
            .status()
            .expect("run the tier script");
        assert!(
            status.success(),
            "virsh {args:?} on zone {}: {status}",
            zone.tier
        );
    }
}

impl Tier {
    /// The clients connected to a zone's libvirtd now (`virt-admin client-list libvirtd`
    /// through the tier script): one per open connection, whoever opened it.
    pub fn daemon_clients(&self, zone: &Zone) -> usize {
        self.daemon_client_ids(zone).len()
    }

    /// The ids of the clients connected to a zone's libvirtd now (`virt-admin client-list`).
    pub fn daemon_client_ids(&self, zone: &Zone) -> Vec<u64> {
        let output = Command::new(&self.script)
            .env("QEMU_TIER_ZONE", zone.tier)
            .args(["virt-admin", "client-list", "libvirtd"])
            .output()
            .expect("run the tier script");
        let text = String::from_utf8_lossy(&output.stdout);
        assert!(
            output.status.success(),
            "virt-admin client-list on zone {}: {}{}",
            zone.tier,
            text,
            String::from_utf8_lossy(&output.stderr)
        );
        // A header, a rule, then one line per client that starts with its numeric id.
        text.lines()
            .filter_map(|l| l.split_whitespace().next()?.parse::<u64>().ok())
            .collect()
    }

    /// Disconnects one client of a zone's libvirtd (`virt-admin client-disconnect`): the
    /// daemon closes that connection and no other.
    pub fn disconnect_client(&self, zone: &Zone, id: u64) {
        let status = Command::new(&self.script)
            .env("QEMU_TIER_ZONE", zone.tier)
            .args([
                "virt-admin",
                "client-disconnect",
                "libvirtd",
                &id.to_string(),
            ])
            .stdout(std::process::Stdio::null())
            .status()
            .expect("run the tier script");
        assert!(
            status.success(),
            "virt-admin client-disconnect {id} on zone {}: {status}",
            zone.tier
        );
    }
}

/// A direct connection to one zone's libvirtd.
pub struct Libvirt {
    conn: Connect,
    pool: String,
    image: String,
    root: PathBuf,
}

impl Libvirt {
    pub fn open(tier: &Tier, zone: &Zone) -> Self {
        // Errors are expected (a domain that must be gone); keep libvirt off stderr.
        virt::error::clear_error_callback();
        let conn = Connect::open(Some(&zone.uri)).expect("connect to the tier's libvirtd");
        Self {
            conn,
            pool: tier.pool.clone(),
            image: tier.image.clone(),
            root: zone.root.clone(),
        }
    }

    pub fn domain(&self, name: &str) -> Option<Domain> {
        self.conn.lookup_domain_by_name(name).ok()
    }

    /// Every domain name on the host.
    pub fn domains(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .conn
            .list_all_domains(0)
            .expect("list domains")
            .iter()
            .filter_map(|d| d.name().ok())
            .collect();
        names.sort();
        names
    }

    pub fn pool(&self) -> StoragePool {
        self.conn
            .lookup_storage_pool_by_name(&self.pool)
            .expect("the tier's pool")
    }

    pub fn volumes(&self) -> Vec<String> {
        let pool = self.pool();
        pool.refresh(0).expect("refresh the pool");
        let mut names = pool.list_volumes().expect("list volumes");
        names.sort();
        names
    }

    /// The golden image's bytes, read from the daemon's file system.
    pub fn image_bytes(&self) -> Vec<u8> {
        let volume = self
            .pool()
            .lookup_storage_vol_by_name(&self.image)
            .expect("the golden image volume");
        let path = volume.path().expect("its path");
        self.read(&path)
    }

    /// A file of the daemon's file system, by its path there.
    pub fn host_path(&self, path: &str) -> PathBuf {
        self.root.join(path.trim_start_matches('/'))
    }

    fn read(&self, path: &str) -> Vec<u8> {
        let on_host = self.host_path(path);
        std::fs::read(&on_host).unwrap_or_else(|e| panic!("read {}: {e}", on_host.display()))
    }

    /// Removes a domain and every volume named after it, as an operator would.
    pub fn remove(&self, name: &str) {
        if let Some(domain) = self.domain(name) {
            let _ = domain.destroy();
            domain
                .undefine_flags(virt::sys::VIR_DOMAIN_UNDEFINE_NVRAM)
                .or_else(|_| domain.undefine())
                .expect("undefine");
        }
        let pool = self.pool();
        for volume in self.volumes() {
            if volume.starts_with(name) {
                let vol = pool.lookup_storage_vol_by_name(&volume).unwrap();
                vol.delete(0).expect("delete a volume");
            }
        }
    }
}

/// The domain name in a machine's host reference (`<zone>/<domain>`).
pub fn domain_name(machine: &pb::Machine) -> String {
    let host = machine.host.as_ref().expect("a machine on a host");
    let (_, name) = host.r#ref.split_once('/').expect("zone/domain");
    name.to_owned()
}

/// Every machine id of a zone, in id order.
pub async fn ids_in(c: &mut Client, zone: &str) -> Vec<String> {
    let mut ids: Vec<String> = list_all(c)
        .await
        .machines
        .into_iter()
        .filter(|m| m.zone == zone)
        .map(|m| m.id)
        .collect();
    ids.sort();
    ids
}

/// Sends Create and waits for `want`; returns the machine and the wall time.
pub async fn create_until(c: &mut Client, id: &str, want: S) -> (pb::Machine, Duration) {
    let start = Instant::now();
    create(c, id, None)
        .await
        .unwrap_or_else(|e| panic!("Create {id} was refused: {e}"));
    let machine = reach(c, id, want, BOOT).await;
    (machine, start.elapsed())
}

/// A gauge (or absent = 0) from `/metrics`.
pub async fn gauge(server: &Server, name: &str, labels: &[(&str, &str)]) -> f64 {
    scrape(server.metrics_addr.expect("the metrics side server"))
        .await
        .count(name, labels)
}

/// Polls `/metrics` every 50 ms until the gauge reads `want`; returns how long it took.
pub async fn gauge_until(
    server: &Server,
    name: &str,
    labels: &[(&str, &str)],
    want: f64,
    within: Duration,
) -> Duration {
    let start = Instant::now();
    loop {
        let value = gauge(server, name, labels).await;
        #[allow(clippy::float_cmp)]
        if value == want {
            return start.elapsed();
        }
        assert!(
            start.elapsed() < within,
            "{name}{labels:?} is {value}, not {want}, after {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Polls until `ok` holds (checked every 100 ms); returns how long it took.
/// [`until`] for a condition that says what is still wrong (`Err`), which the failure names.
pub async fn until_explained(
    what: &str,
    within: Duration,
    check: impl Fn() -> Result<(), String>,
) -> Duration {
    let start = Instant::now();
    while let Err(wrong) = check() {
        assert!(
            start.elapsed() < within,
            "{what} did not happen within {within:?}: {wrong}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    start.elapsed()
}

pub async fn until(what: &str, within: Duration, ok: impl Fn() -> bool) -> Duration {
    let start = Instant::now();
    while !ok() {
        assert!(
            start.elapsed() < within,
            "{what} did not happen within {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    start.elapsed()
}

/// Whether `server` holds an established TCP connection to 127.0.0.1:`port` (its socket
/// descriptors matched against `/proc/net/tcp`): proof that a zone is reached over the
/// remote transport on that port, not over a local socket.
pub fn connected_to(server: &Server, port: u16) -> bool {
    let pid = server.pid().expect("the provider runs");
    let inodes: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .expect("the provider's descriptors")
        .filter_map(|entry| std::fs::read_link(entry.ok()?.path()).ok())
        .filter_map(|link| {
            let link = link.to_str()?.strip_prefix("socket:[")?.strip_suffix(']')?;
            Some(link.to_owned())
        })
        .collect();
    // 127.0.0.1:port as the kernel prints it (little-endian address), state 01 = established.
    let peer = format!("0100007F:{port:04X}");
    std::fs::read_to_string("/proc/net/tcp")
        .expect("/proc/net/tcp")
        .lines()
        .skip(1)
        .map(|line| line.split_whitespace().collect::<Vec<_>>())
        .any(|f| f.len() > 9 && f[2] == peer && f[3] == "01" && inodes.iter().any(|i| i == f[9]))
}
