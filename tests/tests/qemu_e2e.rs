//! Issue 6 — a real QEMU guest end to end: the `bigfleet-libvirt` binary against a real
//! libvirtd running QEMU under software emulation, with a guest whose qemu-ga runs the
//! `/opt/bigfleet/bootstrap` and `/opt/bigfleet/drain` hooks.
//!
//! These tests need that tier, so they are `#[ignore]`d in the ordinary suite.
//! `scripts/qemu-tier/run.sh ci` prepares it (a Debian chroot with libvirtd + QEMU, a guest
//! kernel and an initramfs holding qemu-ga and recording hooks), exports `BIGFLEET_QEMU_*`
//! and runs them with `--ignored`; see docs/testing.md, "The real-QEMU tier".
//!
//! The guest's hooks record what they received under `/var/lib/bigfleet-e2e/`; the test
//! reads those files back through the guest agent, independently of the provider.
//!
//! Transports (issue 25): the lifecycle walk drives zone a over `qemu+libssh://` (the tier's
//! sshd, user `bigfleet`), the failing hook drives zone b over `qemu+tls://`; `doctor` and
//! `image_source` keep zone a's local socket (the host's `/dev/kvm` and a pool the test
//! mounts a tmpfs on). The test's own checks always use the zone's local socket, never the
//! transport under test.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use bigfleet_libvirt_proto::v1alpha1 as pb;
use pb::MachineState as S;
use serde_json::{Value, json};
use virt::connect::Connect;
use virt::domain::Domain;
use virt::storage_pool::StoragePool;

use crate::harness::logs::{lines_of, logged};
use crate::harness::*;

/// How long a walk may take on the tier: no shorter than the provider's own deadlines
/// (Create and Delete 5 min, Configure 8 min), so a slow guest ends by the provider's
/// verdict (FAILED, saying why), not by the test's impatience (as `qemu_zones::BOOT`).
const BOOT: Duration = Duration::from_secs(600);

/// The tier the script prepared, from its `BIGFLEET_QEMU_*` exports.
struct Tier {
    /// The provider's `--connect` URI: the zone's local socket or a remote transport.
    uri: String,
    /// What `uri` goes over, for the printed timings.
    transport: &'static str,
    /// The TCP port `uri` dials (none for the local socket).
    port: Option<u16>,
    /// The same daemon's local socket, for the test's own checks.
    local_uri: String,
    pool: String,
    image: String,
    kernel: String,
    initrd: String,
    cmdline: String,
    /// Where the daemon's file system is on this host ("/" when it is not chrooted).
    root: PathBuf,
}

fn var(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| {
        panic!(
            "{name} is not set: these tests run inside the real-QEMU tier (scripts/qemu-tier/run.sh ci)"
        )
    })
}

impl Tier {
    /// Zone a over its local socket.
    fn from_env() -> Self {
        Self {
            uri: var("BIGFLEET_QEMU_URI"),
            transport: "the local socket (zone a)",
            port: None,
            local_uri: var("BIGFLEET_QEMU_URI"),
            pool: var("BIGFLEET_QEMU_POOL"),
            image: var("BIGFLEET_QEMU_IMAGE"),
            kernel: var("BIGFLEET_QEMU_KERNEL"),
            initrd: var("BIGFLEET_QEMU_INITRD"),
            cmdline: var("BIGFLEET_QEMU_CMDLINE"),
            root: PathBuf::from(var("BIGFLEET_QEMU_ROOT")),
        }
    }

    /// Zone a over `qemu+libssh://` through the tier's sshd.
    fn over_libssh() -> Self {
        Self {
            uri: var("BIGFLEET_QEMU_SSH_URI"),
            transport: "qemu+libssh (zone a)",
            port: Some(crate::qemu_remote::port("BIGFLEET_QEMU_SSH_PORT")),
            ..Self::from_env()
        }
    }

    /// Zone b over `qemu+tls://`.
    fn over_tls() -> Self {
        Self {
            uri: var("BIGFLEET_QEMU_TLS_URI"),
            transport: "qemu+tls (zone b)",
            port: Some(crate::qemu_remote::port("BIGFLEET_QEMU_TLS_PORT")),
            local_uri: var("BIGFLEET_QEMU_URI_B"),
            root: PathBuf::from(var("BIGFLEET_QEMU_ROOT_B")),
            ..Self::from_env()
        }
    }

    /// The tier provider's flags: one `e2e.tiny` slot in zone `local` (its instance-type and
    /// offerings files written into `dir`), direct kernel boot, no NIC, `domain_type`.
    fn flags(&self, dir: &Path, label: &str, domain_type: &str) -> Vec<String> {
        let types = dir.join("instance-types.json");
        std::fs::write(
            &types,
            r#"{ "e2e.tiny": { "vcpu": 1, "memory_mib": 384 } }"#,
        )
        .unwrap();
        let offerings = dir.join("offerings.json");
        std::fs::write(
            &offerings,
            r#"[{ "instance_type": "e2e.tiny", "zone": "local",
                 "capacity_type": "on_demand", "count": 1 }]"#,
        )
        .unwrap();
        vec![
            format!("--connect={}", self.uri),
            format!("--provider={label}"),
            format!("--image={}", self.image),
            format!("--storage-pool={}", self.pool),
            "--network=".to_owned(),
            format!("--domain-type={domain_type}"),
            format!("--guest-kernel={}", self.kernel),
            format!("--guest-initrd={}", self.initrd),
            format!("--guest-cmdline={}", self.cmdline),
            format!("--instance-types={}", types.display()),
            format!("--offerings={}", offerings.display()),
            "--host-reserve-cpu=0".to_owned(),
            "--host-reserve-memory-mib=0".to_owned(),
        ]
    }

    /// Starts the provider with one slot of a tiny instance type in zone `local`.
    fn provider(&self, dir: &Path, label: &str) -> Server {
        let args = self.flags(dir, label, "qemu");
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        Server::start(&args)
    }

    /// Checks that `server` reaches the zone over this tier's transport (a TCP connection to
    /// its port), not over the local socket.
    fn assert_transport(&self, server: &Server) {
        if let Some(port) = self.port {
            assert!(
                crate::qemu_zones::connected_to(server, port),
                "the provider holds no connection over {} (port {port})",
                self.transport
            );
        }
    }
}

/// A direct connection to the tier's libvirtd, for checks the provider cannot vouch for.
struct Libvirt {
    conn: Connect,
    tier: Tier,
}

impl Libvirt {
    fn open(tier: Tier) -> Self {
        // Errors are expected (a file the guest must not have); keep libvirt off stderr.
        virt::error::clear_error_callback();
        let conn = Connect::open(Some(&tier.local_uri)).expect("connect to the tier's libvirtd");
        Self { conn, tier }
    }

    fn domain(&self, name: &str) -> Option<Domain> {
        self.conn.lookup_domain_by_name(name).ok()
    }

    fn pool(&self) -> StoragePool {
        self.conn
            .lookup_storage_pool_by_name(&self.tier.pool)
            .expect("the tier's pool")
    }

    fn volumes(&self) -> Vec<String> {
        let pool = self.pool();
        pool.refresh(0).expect("refresh the pool");
        let mut names = pool.list_volumes().expect("list volumes");
        names.sort();
        names
    }

    /// The golden image's bytes, read from the daemon's file system.
    fn image_bytes(&self) -> Vec<u8> {
        let volume = self
            .pool()
            .lookup_storage_vol_by_name(&self.tier.image)
            .expect("the golden image volume");
        let path = volume.path().expect("its path");
        let on_host = self.tier.root.join(path.trim_start_matches('/'));
        std::fs::read(&on_host).unwrap_or_else(|e| panic!("read {}: {e}", on_host.display()))
    }

    /// Sends one guest-agent command and returns its `return` value.
    fn agent(&self, domain: &Domain, command: &Value) -> Result<Value, String> {
        let reply = domain
            .qemu_agent_command(&command.to_string(), 30, 0)
            .map_err(|e| e.to_string())?;
        let mut value: Value = serde_json::from_str(&reply).map_err(|e| e.to_string())?;
        Ok(value["return"].take())
    }

    /// Reads a whole file in the guest through the agent.
    fn read_guest_file(&self, domain: &Domain, path: &str) -> Result<Vec<u8>, String> {
        let open = json!({"execute": "guest-file-open", "arguments": {"path": path, "mode": "r"}});
        let handle = self.agent(domain, &open)?;
        let mut bytes = Vec::new();
        loop {
            let read = json!({"execute": "guest-file-read",
                              "arguments": {"handle": handle, "count": 1 << 20}});
            let chunk = self.agent(domain, &read)?;
            let data = chunk["buf-b64"].as_str().unwrap_or_default();
            bytes.extend(STANDARD.decode(data).map_err(|e| e.to_string())?);
            if chunk["eof"].as_bool() != Some(false) {
                break;
            }
        }
        let close = json!({"execute": "guest-file-close", "arguments": {"handle": handle}});
        self.agent(domain, &close)?;
        Ok(bytes)
    }
}

/// The domain name in a machine's host reference (`<zone>/<domain>`).
fn domain_name(machine: &pb::Machine) -> String {
    let host = machine.host.as_ref().expect("a machine on a host");
    let (_, name) = host.r#ref.split_once('/').expect("zone/domain");
    name.to_owned()
}

/// Multi-kilobyte binary blob: every byte value, several agent write chunks long.
fn blob() -> Vec<u8> {
    (0..150 * 1024u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect()
}

/// Sum and count of each `bigfleet_libvirt_phase_duration_seconds` phase.
async fn phases(server: &Server) -> HashMap<String, (f64, f64)> {
    let addr = server.metrics_addr.expect("the metrics side server");
    let (status, _, body) = http_get(addr, "/metrics").await.expect("GET /metrics");
    assert_eq!(status, 200);
    let mut out: HashMap<String, (f64, f64)> = HashMap::new();
    for line in body.lines() {
        let Some(rest) = line.strip_prefix("bigfleet_libvirt_phase_duration_seconds_") else {
            continue;
        };
        let (field, rest) = rest.split_once("{phase=\"").unwrap_or(("", ""));
        let Some((phase, value)) = rest.split_once("\"}") else {
            continue;
        };
        let value: f64 = value.trim().parse().unwrap_or(f64::NAN);
        let entry = out.entry(phase.to_owned()).or_default();
        match field {
            "sum" => entry.0 = value,
            "count" => entry.1 = value,
            _ => {}
        }
    }
    out
}

/// The Configure left no error, and its log line for domain `name` shows what the guest
/// agent reports as the guest's addresses (the tier's guest has no NIC: none but loopback,
/// which is left out) or, as a warning, why it could not tell.
async fn configured_cleanly(server: &Server, configured: &pb::Machine, name: &str) {
    assert_eq!(configured.last_error, "");
    let line = logged(
        || lines_of(server),
        Duration::from_secs(10),
        |message, v| message.starts_with("configured") && v["fields"]["domain"] == name,
    )
    .await;
    println!("configure log line: {line}");
    let shown = &line["fields"];
    assert!(
        shown["addresses"].is_string() || shown["error"].is_string(),
        "{line}"
    );
}

#[tokio::test]
#[ignore = "needs the real-QEMU tier: run scripts/qemu-tier/run.sh ci"]
async fn a_real_guest_goes_create_configure_drain_delete() {
    let tier = Tier::over_libssh();
    let dir = tempfile::tempdir().unwrap();
    let server = tier.provider(dir.path(), "e2e");
    let transport = tier.transport;
    let mut c = server.client().await;
    let id = pick(&server, &mut c).await;
    tier.assert_transport(&server);
    let virt = Libvirt::open(tier);
    let image_before = virt.image_bytes();
    let volumes_before = virt.volumes();

    // Create → Idle: a running domain.
    let start = Instant::now();
    let accepted = create(&mut c, &id, None).await;
    let (idle, create_wall) = settle(&mut c, &id, accepted, S::Idle, BOOT, start).await;
    let name = domain_name(&idle);
    let domain = virt.domain(&name).expect("Create defined the domain");
    assert!(domain.is_active().unwrap(), "{name} is running");
    let added: Vec<String> = virt
        .volumes()
        .into_iter()
        .filter(|v| !volumes_before.contains(v))
        .collect();
    assert_eq!(added.len(), 3, "overlay, seed, console log: {added:?}");
    assert!(added.iter().all(|v| v.contains(&name)), "{added:?}");

    // Configure with a 150 KiB binary blob and shard_metadata → Configured.
    let blob = blob();
    let metadata = md(&[("bigfleet.io/shard", "shard-7"), ("team", "e2e")]);
    let start = Instant::now();
    let accepted = configure_map(
        &mut c,
        &id,
        "e2e-cluster-1",
        metadata.clone(),
        blob.clone(),
        None,
    )
    .await;
    let (configured, conf_wall) = settle(&mut c, &id, accepted, S::Configured, BOOT, start).await;
    assert_eq!(configured.cluster, "e2e-cluster-1");
    assert_eq!(configured.shard_metadata, metadata);
    configured_cleanly(&server, &configured, &name).await;
    let seen = virt
        .read_guest_file(&domain, "/var/lib/bigfleet-e2e/blob")
        .expect("the hook recorded the blob");
    assert!(
        seen == blob,
        "the hook saw {} bytes, not the blob",
        seen.len()
    );
    let cluster = virt
        .read_guest_file(&domain, "/var/lib/bigfleet-e2e/cluster-id")
        .expect("the hook recorded the cluster id");
    assert_eq!(String::from_utf8_lossy(&cluster), "e2e-cluster-1");
    assert!(
        virt.read_guest_file(&domain, "/opt/bigfleet/bootstrap.blob")
            .is_err(),
        "the blob is removed from the guest once the hook ends"
    );

    // Drain → Idle with the binding cleared; the guest's drain hook ran.
    let start = Instant::now();
    let accepted = drain(&mut c, &id, 30, None).await;
    let (drained, drain_wall) = settle(&mut c, &id, accepted, S::Idle, BOOT, start).await;
    assert_eq!(drained.cluster, "");
    assert!(drained.shard_metadata.is_empty(), "{drained:?}");
    let grace = virt
        .read_guest_file(&domain, "/var/lib/bigfleet-e2e/drain-grace")
        .expect("the drain hook ran");
    let grace = String::from_utf8_lossy(&grace);
    assert!(
        grace.trim().parse::<u64>().is_ok(),
        "grace seconds: {grace:?}"
    );

    // Delete → Speculative: domain and volumes gone, base image intact.
    let start = Instant::now();
    let accepted = delete(&mut c, &id, None).await;
    let (gone, delete_wall) = settle(&mut c, &id, accepted, S::Speculative, BOOT, start).await;
    assert!(!host_set(&gone), "{gone:?}");
    assert!(virt.domain(&name).is_none(), "{name} is undefined");
    assert_eq!(
        virt.volumes(),
        volumes_before,
        "only the machine's volumes went"
    );
    assert!(
        virt.image_bytes() == image_before,
        "the golden image is byte-identical"
    );

    let phases = phases(&server).await;
    println!(
        "real-QEMU tier timings over {transport} (wall = RPC sent until the state was read back):"
    );
    println!("  create → Idle       {create_wall:>9.2?}");
    println!("  configure → Configured {conf_wall:>6.2?}");
    println!("  drain → Idle        {drain_wall:>9.2?}");
    println!("  delete → Speculative {delete_wall:>8.2?}");
    for phase in [
        "define",
        "start",
        "agent_ready",
        "bootstrap",
        "drain",
        "delete",
    ] {
        let (sum, count) = phases.get(phase).copied().unwrap_or_default();
        println!("  phase {phase:<12} {sum:>8.3} s over {count} call(s)");
        assert!(count >= 1.0, "phase {phase} was observed: {phases:?}");
    }
}

#[tokio::test]
#[ignore = "needs the real-QEMU tier: run scripts/qemu-tier/run.sh ci"]
async fn a_failing_hook_fails_configure_with_its_bounded_output() {
    let tier = Tier::over_tls();
    let dir = tempfile::tempdir().unwrap();
    let server = tier.provider(dir.path(), "e2efail");
    println!("failing hook over {}", tier.transport);
    let mut c = server.client().await;
    let id = pick(&server, &mut c).await;
    tier.assert_transport(&server);
    let virt = Libvirt::open(tier);
    let volumes_before = virt.volumes();
    let accepted = create(&mut c, &id, None).await;
    let (idle, _) = settle(&mut c, &id, accepted, S::Idle, BOOT, Instant::now()).await;
    let name = domain_name(&idle);

    let accepted = configure_map(
        &mut c,
        &id,
        "fail-e2e",
        md(&[("team", "e2e")]),
        b"never recorded".to_vec(),
        None,
    )
    .await;
    let (failed, _) = settle(&mut c, &id, accepted, S::Failed, BOOT, Instant::now()).await;
    let error = &failed.last_error;
    println!("last_error ({} bytes): {error}", error.len());
    // The hook printed 200 lines to each stream; last_error keeps the last 1 KiB of each.
    assert!(
        error.contains("exited 7"),
        "the exit status is reported: {error}"
    );
    assert!(error.contains("hook-failure stdout line 200"), "{error}");
    assert!(error.contains("hook-failure stderr line 200"), "{error}");
    assert!(
        !error.contains("stdout line 1\n") && !error.contains("stderr line 100\n"),
        "the hook's output is bounded, not copied whole: {error}"
    );
    assert!(error.len() < 4096, "bounded: {} bytes", error.len());
    assert!(
        !error.contains("never recorded"),
        "the blob never reaches last_error"
    );

    // Failed is terminal (docs/contract.md §2.6): Delete is refused and the domain is left as is,
    // for the operator to inspect.
    let refused = delete(&mut c, &id, None).await;
    assert_eq!(code(&refused), tonic::Code::Aborted, "{refused:?}");
    let domain = virt
        .domain(&name)
        .expect("a Failed machine keeps its domain");
    assert!(domain.is_active().unwrap());

    // Clean up by hand, as an operator would, so the tier is left as it was found.
    domain.destroy().expect("destroy");
    domain.undefine().expect("undefine");
    let pool = virt.pool();
    for volume in virt.volumes() {
        if !volumes_before.contains(&volume) {
            let vol = pool.lookup_storage_vol_by_name(&volume).unwrap();
            vol.delete(0)
                .expect("delete a volume of the failed machine");
        }
    }
    assert_eq!(virt.volumes(), volumes_before);
}

/// Where KVM works in the zone, a Create whose domain libvirt will not start (a named CPU
/// requiring a feature the host lacks) fails, and Get's `last_error` gives libvirt's reason
/// on one bounded line, the state libvirt records and where the QEMU log is; nothing of
/// the attempt is left. Without KVM it says that it did not run.
#[tokio::test]
#[ignore = "needs the real-QEMU tier: run scripts/qemu-tier/run.sh ci"]
async fn a_domain_that_will_not_start_says_why() {
    let tier = Tier::from_env();
    let dir = tempfile::tempdir().unwrap();
    let kvm = doctor::kvm_works(&tier, dir.path());
    println!("accelerator: {}", if kvm { "KVM" } else { "TCG" });
    if kvm {
        let mut args = tier.flags(dir.path(), "e2enostart", "kvm");
        args.push(format!("--cpu={}", doctor::refused_cpu()));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let server = Server::start(&args);
        let mut c = server.client().await;
        let id = pick(&server, &mut c).await;
        let virt = Libvirt::open(tier);
        let volumes_before = virt.volumes();
        let accepted = create(&mut c, &id, None).await;
        let (failed, _) = settle(&mut c, &id, accepted, S::Failed, BOOT, Instant::now()).await;
        let error = &failed.last_error;
        println!("last_error ({} bytes): {error}", error.len());
        assert!(error.contains("start domain"), "{error}");
        assert!(
            error.contains("does not provide required features"),
            "{error}"
        );
        assert!(error.contains("/var/log/libvirt/qemu/"), "{error}");
        assert!(!error.contains('\n'), "one line: {error}");
        assert!(error.len() < 2048, "bounded: {} bytes", error.len());
        assert_eq!(
            virt.volumes(),
            volumes_before,
            "the attempt was rolled back"
        );
    } else {
        println!("not run: needs KVM in the zone");
    }
}

mod doctor;
mod full_pool;
mod image_source;
mod passthrough;
mod placement;
mod silent;
mod stopped;
mod tpm;
