//! Issue 25 — remote hosts the way operators reach them: zone `rackA` over `qemu+libssh://`
//! through the tier's real sshd as the non-root user `bigfleet` (libvirt group, polkit rule
//! from deploy/examples/), zone `rackB` over `qemu+tls://` to the tier's libvirtd listening
//! for TLS (scripts/qemu-tier/remote.sh). Each test is named after its scenario:
//! `remote_libssh`, `remote_tls`, `remote_failures`, `credential_rotation`, `image_remote_doctor`.
//!
//! `#[ignore]`d outside `scripts/qemu-tier/run.sh ci`. Every change a test makes to a host
//! (authorized_keys, the polkit rule, libvirtd.conf) is undone by a guard when it ends.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use bigfleet_libvirt_proto::v1alpha1 as pb;
use pb::MachineState as S;
use serde_json::Value;
use virt::connect::Connect;

use crate::harness::logs::{lines_of, logged};
use crate::harness::*;
use crate::qemu_zones::*;

mod failures;
mod image;
mod rotation;

fn var(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| {
        panic!("{name} is not set: run inside the real-QEMU tier (scripts/qemu-tier/run.sh ci)")
    })
}

/// A port the tier exports.
pub fn port(name: &str) -> u16 {
    var(name).parse().unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// The provider's credentials for both remote zones, copied into one directory the test may
/// break or rotate, laid out as the chart mounts the Secrets (`ssh/`, `tls/`).
pub struct Creds {
    pub dir: PathBuf,
}

impl Creds {
    pub fn copy(into: &Path) -> Creds {
        let dir = into.join("creds");
        let from = PathBuf::from(var("BIGFLEET_QEMU_CREDS"));
        for sub in ["ssh", "tls"] {
            std::fs::create_dir_all(dir.join(sub)).unwrap();
            for entry in std::fs::read_dir(from.join(sub)).unwrap() {
                let entry = entry.unwrap();
                std::fs::copy(entry.path(), dir.join(sub).join(entry.file_name())).unwrap();
            }
        }
        Creds { dir }
    }

    pub fn ssh(&self, file: &str) -> PathBuf {
        self.dir.join("ssh").join(file)
    }

    pub fn tls(&self, file: &str) -> PathBuf {
        self.dir.join("tls").join(file)
    }

    /// Zone A's URI with this key file and known_hosts.
    pub fn ssh_uri_with(keyfile: &Path, known_hosts: &Path) -> String {
        format!(
            "qemu+libssh://bigfleet@127.0.0.1:{}/system?keyfile={}&known_hosts={}&known_hosts_verify=normal",
            var("BIGFLEET_QEMU_SSH_PORT"),
            keyfile.display(),
            known_hosts.display()
        )
    }

    pub fn ssh_uri(&self) -> String {
        Self::ssh_uri_with(&self.ssh("id_ed25519"), &self.ssh("known_hosts"))
    }

    /// Zone B's URI to `host` with `pkipath`.
    pub fn tls_uri_with(host: &str, pkipath: &Path) -> String {
        format!(
            "qemu+tls://{host}:{}/system?pkipath={}",
            var("BIGFLEET_QEMU_TLS_PORT"),
            pkipath.display()
        )
    }

    pub fn tls_uri(&self) -> String {
        Self::tls_uri_with("localhost", &self.dir.join("tls"))
    }
}

/// The tier with zone A over libssh and zone B over TLS (`local` keeps the unix sockets,
/// for checks on the hosts that must not depend on the transport under test).
pub fn remote(ssh: String, tls: String) -> (Tier, Tier) {
    let local = Tier::from_env();
    let mut tier = local.clone();
    tier.a.uri = ssh;
    tier.b.uri = tls;
    (tier, local)
}

/// [`remote`] with the tier's own credentials (`$QEMU_TIER_DIR/creds`), for the scenarios
/// of `qemu_e2e` and `qemu_faults` that run over the remote transports.
pub fn over_remote() -> (Tier, Tier) {
    remote(var("BIGFLEET_QEMU_SSH_URI"), var("BIGFLEET_QEMU_TLS_URI"))
}

/// Mean time of `n` fresh connections to `uri` (open + one call + close), printed.
pub fn connect_time(what: &str, uri: &str, n: u32) -> Duration {
    virt::error::clear_error_callback();
    let start = Instant::now();
    for _ in 0..n {
        let conn = Connect::open(Some(uri)).unwrap_or_else(|e| panic!("{what}: connect: {e}"));
        conn.hostname().expect("a call over the connection");
        drop(conn);
    }
    let mean = start.elapsed() / n;
    println!("connect time over {what}: {mean:?} (mean of {n})");
    mean
}

/// Create → Idle → Configure → Drain → Delete on `zone`, each step timed and printed.
async fn lifecycle(c: &mut Client, zone: &Zone, transport: &str) -> pb::Machine {
    let id = ids_in(c, zone.label).await.remove(0);
    let (idle, to_idle) = create_until(c, &id, S::Idle).await;
    println!("{transport}: Create -> Idle {to_idle:?}");
    let start = Instant::now();
    configure(c, &id, "remote-cluster", &[("team", "e2e")], None)
        .await
        .expect("Configure accepted");
    reach(c, &id, S::Configured, BOOT).await;
    let configured = start.elapsed();
    let start = Instant::now();
    drain(c, &id, 5, None).await.expect("Drain accepted");
    reach(c, &id, S::Idle, BOOT).await;
    let drained = start.elapsed();
    let start = Instant::now();
    delete(c, &id, None).await.expect("Delete accepted");
    reach(c, &id, S::Speculative, BOOT).await;
    println!(
        "{transport}: Configure {configured:?}, Drain {drained:?}, Delete {:?}",
        start.elapsed()
    );
    idle
}

/// The zone a machine ran on saw the domain, and it is gone after Delete (checked over
/// the local socket, not the transport under test).
fn domain_came_and_went(local: &Tier, zone: &Zone, machine: &pb::Machine) {
    let name = domain_name(machine);
    let host = Libvirt::open(local, zone);
    assert!(
        host.domain(&name).is_none(),
        "{name} left behind on zone {}",
        zone.tier
    );
    assert!(
        host.volumes().iter().all(|v| !v.starts_with(&name)),
        "{name}'s volumes left behind: {:?}",
        host.volumes()
    );
}

#[tokio::test]
#[ignore = "needs the real-QEMU tier: run scripts/qemu-tier/run.sh ci"]
async fn remote_libssh() {
    let dir = tempfile::tempdir().unwrap();
    let creds = Creds::copy(dir.path());
    let (tier, local) = remote(creds.ssh_uri(), creds.tls_uri());
    connect_time("the local socket", &local.a.uri, 5);
    connect_time("qemu+libssh", &tier.a.uri, 5);
    let sshd_log = local.a.root.join("var/log/sshd.log");
    let before = std::fs::read_to_string(&sshd_log).unwrap_or_default().len();
    let server = tier.provider(dir.path(), "e2e-libssh", (1, 0), &[]);
    let mut c = server.client().await;
    let machine = lifecycle(&mut c, &tier.a, "qemu+libssh").await;
    assert!(
        connected_to(&server, port("BIGFLEET_QEMU_SSH_PORT")),
        "the provider holds no connection to sshd"
    );
    assert!(
        machine.host.as_ref().unwrap().r#ref.starts_with("rackA/"),
        "{machine:?}"
    );
    domain_came_and_went(&local, &tier.a, &machine);
    // The same walk over the local socket, for comparison.
    let direct = local.provider(dir.path(), "e2e-socket", (1, 0), &[]);
    let mut c = direct.client().await;
    lifecycle(&mut c, &local.a, "the local socket").await;
    // The provider's own connection went through sshd, as bigfleet with the key.
    let log = std::fs::read_to_string(&sshd_log).unwrap();
    assert!(
        log[before..].contains("Accepted publickey for bigfleet from 127.0.0.1"),
        "sshd never let bigfleet in: {}",
        &log[before..]
    );
}

#[tokio::test]
#[ignore = "needs the real-QEMU tier: run scripts/qemu-tier/run.sh ci"]
async fn remote_tls() {
    let dir = tempfile::tempdir().unwrap();
    let creds = Creds::copy(dir.path());
    let (tier, local) = remote(creds.ssh_uri(), creds.tls_uri());
    connect_time("the local socket", &local.b.uri, 5);
    connect_time("qemu+tls", &tier.b.uri, 5);
    let server = tier.provider(dir.path(), "e2e-tls", (0, 1), &[]);
    let mut c = server.client().await;
    let machine = lifecycle(&mut c, &tier.b, "qemu+tls").await;
    assert!(
        connected_to(&server, port("BIGFLEET_QEMU_TLS_PORT")),
        "the provider holds no TLS connection to zone b's libvirtd"
    );
    assert!(
        machine.host.as_ref().unwrap().r#ref.starts_with("rackB/"),
        "{machine:?}"
    );
    domain_came_and_went(&local, &tier.b, &machine);
}

/// `doctor --output json` with the tier provider's flags over `connect` (zone=uri list);
/// returns the exit code and the report.
pub fn doctor(dir: &Path, connect: &str) -> (i32, Value) {
    doctor_as(dir, connect, &[])
}

/// As [`doctor`], run through `wrapper` (e.g. setpriv to another uid).
pub fn doctor_as(dir: &Path, connect: &str, wrapper: &[&str]) -> (i32, Value) {
    let (types, offerings) = (
        dir.join("doctor-types.json"),
        dir.join("doctor-offerings.json"),
    );
    write_doctor_files(&types, &offerings);
    let binary = binary();
    let mut command = match wrapper.split_first() {
        Some((program, rest)) => {
            let mut c = Command::new(program);
            c.args(rest).arg(&binary);
            c
        }
        None => Command::new(&binary),
    };
    let args = doctor_args(
        connect,
        &types.display().to_string(),
        &offerings.display().to_string(),
    );
    run_doctor(command.args(args))
}

/// The instance types and offerings `doctor` is given (one tiny slot in each zone).
pub fn write_doctor_files(types: &Path, offerings: &Path) {
    std::fs::write(types, r#"{ "e2e.tiny": { "vcpu": 1, "memory_mib": 384 } }"#).unwrap();
    std::fs::write(
        offerings,
        r#"[{ "instance_type": "e2e.tiny", "zone": "rackA", "count": 1 },
            { "instance_type": "e2e.tiny", "zone": "rackB", "count": 1 }]"#,
    )
    .unwrap();
}

/// `doctor --output json` with the tier provider's flags, the files named as the binary
/// sees them.
pub fn doctor_args(connect: &str, types: &str, offerings: &str) -> Vec<String> {
    let tier = Tier::from_env();
    let mut args: Vec<String> = [
        "doctor",
        "--output=json",
        "--provider=e2e-doctor",
        "--network=",
        "--domain-type=qemu",
        "--host-reserve-cpu=0",
        "--host-reserve-memory-mib=0",
    ]
    .map(String::from)
    .into();
    args.push(format!("--connect={connect}"));
    args.push(format!("--image={}", tier.image));
    args.push(format!("--storage-pool={}", tier.pool));
    args.push(format!("--instance-types={types}"));
    args.push(format!("--offerings={offerings}"));
    args
}

/// Runs a `doctor --output json` command; returns the exit code and the report.
pub fn run_doctor(command: &mut Command) -> (i32, Value) {
    let output = command.output().expect("run doctor");
    let report: Value = serde_json::from_slice(&output.stdout).unwrap_or_else(|e| {
        panic!(
            "doctor printed no JSON ({e}): {}",
            String::from_utf8_lossy(&output.stderr)
        )
    });
    (output.status.code().expect("an exit code"), report)
}

/// The `connection` check of `zone` in a doctor report.
pub fn connection<'a>(report: &'a Value, zone: &str) -> &'a Value {
    report["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["zone"] == zone && c["check"] == "connection")
        .unwrap_or_else(|| panic!("no connection check for {zone}: {report:#}"))
}

/// Waits for the serving log's `libvirt host unreachable` line of `zone` and returns its
/// error text.
pub async fn unreachable_line(server: &Server, zone: &str, within: Duration) -> String {
    let line = logged(
        || lines_of(server),
        within,
        |message, v| message == "libvirt host unreachable" && v["fields"]["zone"] == zone,
    )
    .await;
    line["fields"]["error"].as_str().unwrap().to_owned()
}

/// How many `libvirt host unreachable` lines `zone` has logged so far.
pub fn unreachable_count(server: &Server, zone: &str) -> usize {
    lines_of(server)
        .iter()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| {
            v["fields"]["message"] == "libvirt host unreachable" && v["fields"]["zone"] == zone
        })
        .count()
}

/// Sends SIGHUP to the provider.
pub fn hangup(server: &Server) {
    let pid = server.pid().expect("the provider runs");
    let status = Command::new("kill")
        .args(["-HUP", &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success());
}
