//! `remote_failures`: every refused credential, one by one, gives its line (zone, redacted
//! URI, what was refused, the fix) in the serving log and as doctor's blocker, while the
//! other zone stays healthy and the refused one is retried with backoff.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use rcgen::{BasicConstraints, Issuer, KeyPair, KeyUsagePurpose};
use rcgen::{CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa};

use super::*;

const HEALTH: &str = "bigfleet_libvirt_host_health";

/// A key pair made by ssh-keygen inside zone A's root, moved to `dest` (and `dest.pub`).
pub fn new_ssh_key(local: &Tier, dest: &Path) {
    let root = &local.a.root;
    let name = format!("tmp/test-key-{}", std::process::id());
    let _ = std::fs::remove_file(root.join(&name));
    let _ = std::fs::remove_file(root.join(format!("{name}.pub")));
    let status = Command::new("chroot")
        .arg(root)
        .args([
            "ssh-keygen",
            "-q",
            "-t",
            "ed25519",
            "-N",
            "",
            "-f",
            &format!("/{name}"),
        ])
        .status()
        .unwrap();
    assert!(status.success(), "ssh-keygen in zone a");
    // Copied, not renamed: the zone's root is another file system.
    std::fs::copy(root.join(&name), dest).unwrap();
    std::fs::copy(root.join(format!("{name}.pub")), dest.with_extension("pub")).unwrap();
}

/// A certificate authority: the tier's own (from its files) or a fresh one.
pub struct Authority {
    pub pem: String,
    issuer: Issuer<'static, KeyPair>,
}

impl Authority {
    pub fn tier() -> Authority {
        let dir = PathBuf::from(var("BIGFLEET_QEMU_CA"));
        let pem = std::fs::read_to_string(dir.join("cacert.pem")).unwrap();
        let key =
            KeyPair::from_pem(&std::fs::read_to_string(dir.join("cakey.pem")).unwrap()).unwrap();
        // The tier's CA, as scripts/qemu-tier/remote.sh made it: same DN, same key (no
        // authority key identifier, so the issuer is matched by DN).
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.distinguished_name = DistinguishedName::new();
        params
            .distinguished_name
            .push(DnType::OrganizationName, "BigFleet");
        params
            .distinguished_name
            .push(DnType::CommonName, "bigfleet-qemu-tier CA");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        Authority {
            pem,
            issuer: Issuer::new(params, key),
        }
    }

    pub fn other() -> Authority {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params
            .distinguished_name
            .push(DnType::CommonName, "another CA");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let key = KeyPair::generate().unwrap();
        let pem = params.self_signed(&key).unwrap().pem();
        Authority {
            pem,
            issuer: Issuer::new(params, key),
        }
    }

    /// A pkipath directory `dir` with this CA and a client certificate for `cn`
    /// (`O=BigFleet,CN=<cn>`), expired when `expired`.
    pub fn pkipath(&self, dir: &Path, cn: &str, expired: bool) -> PathBuf {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        let mut dn = DistinguishedName::new();
        dn.push(DnType::OrganizationName, "BigFleet");
        dn.push(DnType::CommonName, cn);
        params.distinguished_name = dn;
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        if expired {
            params.not_before = rcgen::date_time_ymd(2020, 1, 1);
            params.not_after = rcgen::date_time_ymd(2020, 2, 1);
        }
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        std::fs::create_dir_all(dir).unwrap();
        std::fs::write(dir.join("cacert.pem"), &self.pem).unwrap();
        std::fs::write(dir.join("clientcert.pem"), cert.pem()).unwrap();
        std::fs::write(dir.join("clientkey.pem"), key.serialize_pem()).unwrap();
        dir.to_owned()
    }
}

/// Moves zone A's polkit rule away until dropped. polkitd rereads its rules when the
/// directory changes, so each way waits until a dial over `uri` shows the change.
struct NoPolkitRule {
    rule: PathBuf,
    uri: String,
}

impl NoPolkitRule {
    fn new(local: &Tier, uri: String) -> Self {
        let rule = local
            .a
            .root
            .join("etc/polkit-1/rules.d/49-bigfleet-libvirt.rules");
        std::fs::rename(&rule, rule.with_extension("off")).unwrap();
        let refused = dial_until(&uri, |r| r.as_ref().is_err_and(|e| e.contains("polkit")));
        assert!(refused, "polkitd still lets bigfleet in without the rule");
        NoPolkitRule { rule, uri }
    }
}

impl Drop for NoPolkitRule {
    fn drop(&mut self) {
        let _ = std::fs::rename(self.rule.with_extension("off"), &self.rule);
        if !dial_until(&self.uri, Result::is_ok) {
            eprintln!("polkitd still refuses bigfleet with the rule back");
        }
    }
}

/// Dials `uri` until `done` holds for the result (the error's text), for up to 30 s;
/// whether it did.
fn dial_until(uri: &str, done: impl Fn(&Result<(), String>) -> bool) -> bool {
    virt::error::clear_error_callback();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let result = Connect::open(Some(uri))
            .map(drop)
            .map_err(|e| e.to_string());
        if done(&result) {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// One refusal: the broken zone's URI, the words its line must hold, and the good zone's.
struct Case {
    name: &'static str,
    zone: &'static str,
    broken: String,
    words: &'static str,
}

/// The refusal's line in doctor (a blocker, with its fix) and in a serving provider (whose
/// other zone stays healthy, and which retries the broken one).
async fn check_case(dir: &Path, creds: &Creds, case: &Case) {
    let (ssh, tls) = match case.zone {
        "rackA" => (case.broken.clone(), creds.tls_uri()),
        _ => (creds.ssh_uri(), case.broken.clone()),
    };
    let other = if case.zone == "rackA" {
        "rackB"
    } else {
        "rackA"
    };
    let (code, report) = doctor(dir, &format!("rackA={ssh},rackB={tls}"));
    let blocker = connection(&report, case.zone);
    println!("{}: doctor: {blocker}", case.name);
    assert_eq!(code, 1, "{report:#}");
    assert_eq!(blocker["status"], "block", "{blocker}");
    let detail = blocker["detail"].as_str().unwrap();
    assert!(detail.contains(case.words), "{}: {detail}", case.name);
    assert!(detail.starts_with("connect to qemu+"), "{detail}");
    assert!(!blocker["fix"].as_str().unwrap().is_empty(), "{blocker}");
    assert_eq!(connection(&report, other)["status"], "ok", "{report:#}");

    let (tier, _) = remote(ssh, tls);
    let server = tier.provider(dir, &format!("e2e-{}", case.name), (1, 1), &[]);
    let line = unreachable_line(&server, case.zone, Duration::from_secs(30)).await;
    println!(
        "{}: serving log: zone={} error={line}",
        case.name, case.zone
    );
    assert!(line.contains(case.words), "{}: {line}", case.name);
    assert!(
        line.starts_with(detail),
        "the same words in both: {line} / {detail}"
    );
    assert!(line.contains("; fix: "), "{line}");
    gauge_until(
        &server,
        HEALTH,
        &[("zone", other), ("state", "healthy")],
        1.0,
        Duration::from_secs(30),
    )
    .await;
    // Retried with backoff (1 s, doubling): a second refusal follows within seconds.
    until("a retry", Duration::from_secs(20), || {
        unreachable_count(&server, case.zone) >= 2
    })
    .await;
    assert_eq!(
        gauge(&server, HEALTH, &[("zone", other), ("state", "healthy")]).await,
        1.0
    );
}

fn ssh_cases(dir: &Path, local: &Tier, creds: &Creds) -> Vec<Case> {
    let empty = dir.join("empty_known_hosts");
    std::fs::write(&empty, "").unwrap();
    // Another key where the host's should be: what a reinstalled host (or a MITM) shows.
    let changed = dir.join("changed_known_hosts");
    let client_pub = std::fs::read_to_string(creds.ssh("id_ed25519.pub")).unwrap();
    let fields: Vec<&str> = client_pub.split_whitespace().take(2).collect();
    let port = var("BIGFLEET_QEMU_SSH_PORT");
    std::fs::write(
        &changed,
        format!("[127.0.0.1]:{port} {}\n", fields.join(" ")),
    )
    .unwrap();
    let stranger = dir.join("stranger_ed25519");
    new_ssh_key(local, &stranger);
    let (key, hosts) = (creds.ssh("id_ed25519"), creds.ssh("known_hosts"));
    vec![
        Case {
            name: "unknown-host-key",
            zone: "rackA",
            broken: Creds::ssh_uri_with(&key, &empty),
            words: "(unknown host key)",
        },
        Case {
            name: "missing-known-hosts",
            zone: "rackA",
            broken: Creds::ssh_uri_with(&key, &dir.join("no-such-known-hosts")),
            words: "no-such-known-hosts does not exist",
        },
        Case {
            name: "changed-host-key",
            zone: "rackA",
            broken: Creds::ssh_uri_with(&key, &changed),
            words: "(changed host key",
        },
        Case {
            name: "missing-key-file",
            zone: "rackA",
            broken: Creds::ssh_uri_with(&dir.join("no-such-key"), &hosts),
            words: "no-such-key does not exist",
        },
        Case {
            name: "key-not-authorised",
            zone: "rackA",
            broken: Creds::ssh_uri_with(&stranger, &hosts),
            words: "(key not authorised)",
        },
    ]
}

fn tls_cases(dir: &Path, creds: &Creds) -> Vec<Case> {
    let tier_ca = Authority::tier();
    let other = Authority::other().pkipath(&dir.join("other-ca"), "bigfleet-libvirt-client", false);
    let expired = tier_ca.pkipath(&dir.join("expired"), "bigfleet-libvirt-client", true);
    let stranger = tier_ca.pkipath(&dir.join("stranger"), "someone-else", false);
    vec![
        Case {
            name: "server-cert-other-ca",
            zone: "rackB",
            broken: Creds::tls_uri_with("localhost", &other),
            words: "(another CA)",
        },
        Case {
            name: "client-cert-expired",
            zone: "rackB",
            broken: Creds::tls_uri_with("localhost", &expired),
            words: "clientcert.pem has expired",
        },
        Case {
            name: "client-dn-not-allowed",
            zone: "rackB",
            broken: Creds::tls_uri_with("localhost", &stranger),
            words: "DN O=BigFleet,CN=someone-else is not in the host's tls_allowed_dn_list",
        },
        Case {
            name: "hostname-mismatch",
            zone: "rackB",
            broken: Creds::tls_uri_with("127.0.0.1", &creds.dir.join("tls")),
            words: "is not issued for the name \"127.0.0.1\" (hostname mismatch)",
        },
    ]
}

/// doctor as uid 65532 (the image's user) with copies of zone A's key and known_hosts in
/// `dir/sub`, root-owned with these modes.
fn doctor_as_nonroot(dir: &Path, sub: &str, creds: &Creds, modes: (u32, u32)) -> (i32, Value) {
    let open = dir.join(sub);
    std::fs::create_dir_all(&open).unwrap();
    let (key, hosts) = (open.join("id_ed25519"), open.join("known_hosts"));
    std::fs::copy(creds.ssh("id_ed25519"), &key).unwrap();
    std::fs::copy(creds.ssh("known_hosts"), &hosts).unwrap();
    for (path, mode) in [
        (dir, 0o755),
        (open.as_path(), 0o755),
        (key.as_path(), modes.0),
        (hosts.as_path(), modes.1),
    ] {
        Command::new("chmod")
            .arg(format!("{mode:o}"))
            .arg(path)
            .status()
            .unwrap();
    }
    let connect = format!(
        "rackA={},rackB={}",
        Creds::ssh_uri_with(&key, &hosts),
        creds.tls_uri()
    );
    let wrapper = [
        "setpriv",
        "--reuid=65532",
        "--regid=65532",
        "--clear-groups",
    ];
    doctor_as(dir, &connect, &wrapper)
}

/// A known_hosts root owns with mode 0600 (the key readable): libssh's "cannot verify the
/// host key" is the unreadable file, not an unknown host.
fn unreadable_known_hosts(dir: &Path, creds: &Creds) {
    let (code, report) = doctor_as_nonroot(dir, "hosts-closed", creds, (0o644, 0o600));
    let blocker = connection(&report, "rackA");
    println!("unreadable-known-hosts (uid 65532): doctor: {blocker}");
    assert_eq!(code, 1, "{report:#}");
    let detail = blocker["detail"].as_str().unwrap();
    assert!(
        detail.contains("known_hosts cannot be read by this process"),
        "{detail}"
    );
}

/// A key file root owns with mode 0600, read by doctor as uid 65532 (the image's user).
fn unreadable_key(dir: &Path, creds: &Creds) {
    let (code, report) = doctor_as_nonroot(dir, "open", creds, (0o600, 0o644));
    let blocker = connection(&report, "rackA");
    println!("unreadable-key-file (uid 65532): doctor: {blocker}");
    assert_eq!(code, 1, "{report:#}");
    let detail = blocker["detail"].as_str().unwrap();
    assert!(
        detail.contains("id_ed25519 cannot be read by this process"),
        "{detail}"
    );
    // The TLS files of the copy are root's 0700 directory: refused as unreadable too.
    let tls = connection(&report, "rackB")["detail"]
        .as_str()
        .unwrap()
        .to_owned();
    println!("unreadable-tls-files (uid 65532): doctor: {tls}");
    assert!(tls.contains("is missing or unreadable"), "{tls}");
}

#[tokio::test]
#[ignore = "needs the real-QEMU tier: run scripts/qemu-tier/run.sh ci"]
async fn remote_failures() {
    let dir = tempfile::tempdir().unwrap();
    let creds = Creds::copy(dir.path());
    let local = Tier::from_env();
    let mut cases = ssh_cases(dir.path(), &local, &creds);
    cases.extend(tls_cases(dir.path(), &creds));
    // Every refusal's doctor line first (the record of a run), then each checked in full.
    for case in &cases {
        let connect = match case.zone {
            "rackA" => format!("rackA={},rackB={}", case.broken, creds.tls_uri()),
            _ => format!("rackA={},rackB={}", creds.ssh_uri(), case.broken),
        };
        let (_, report) = doctor(dir.path(), &connect);
        println!("{}: {}", case.name, connection(&report, case.zone));
    }
    for case in &cases {
        check_case(dir.path(), &creds, case).await;
    }
    unreadable_key(dir.path(), &creds);
    unreadable_known_hosts(dir.path(), &creds);
    let polkit = Case {
        name: "polkit-refusal",
        zone: "rackA",
        broken: creds.ssh_uri(),
        words: "polkit does not allow it to manage libvirt",
    };
    let guard = NoPolkitRule::new(&local, creds.ssh_uri());
    check_case(dir.path(), &creds, &polkit).await;
    drop(guard);
}
