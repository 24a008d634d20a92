//! `credential_rotation`: zone A's key and zone B's client certificate are replaced on disk,
//! the old key is taken out of authorized_keys and the old DN out of tls_allowed_dn_list;
//! after SIGHUP both zones are connected with the new credentials and a Create reaches Idle
//! on each, without restarting the provider.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use super::failures::{Authority, new_ssh_key};
use super::*;

const HEALTH: &str = "bigfleet_libvirt_host_health";
const NEW_DN: &str = "O=BigFleet,CN=bigfleet-libvirt-client-2";

/// Puts zone A's authorized_keys and zone B's libvirtd.conf back (and restarts B's
/// libvirtd) when dropped.
struct Restore {
    tier: Tier,
    keys: (PathBuf, String),
    conf: (PathBuf, String),
}

impl Restore {
    fn new(local: &Tier) -> Self {
        let keys = local.a.root.join("home/bigfleet/.ssh/authorized_keys");
        let conf = local.b.root.join("etc/libvirt/libvirtd.conf");
        Restore {
            tier: local.clone(),
            keys: (keys.clone(), std::fs::read_to_string(&keys).unwrap()),
            conf: (conf.clone(), std::fs::read_to_string(&conf).unwrap()),
        }
    }
}

impl Drop for Restore {
    fn drop(&mut self) {
        std::fs::write(&self.keys.0, &self.keys.1).unwrap();
        std::fs::write(&self.conf.0, &self.conf.1).unwrap();
        self.tier.libvirtd(&self.tier.b, "term");
        self.tier.libvirtd(&self.tier.b, "start");
    }
}

/// Rotates both credentials on disk and on the hosts; returns the old ones' URIs.
fn rotate(dir: &std::path::Path, local: &Tier, creds: &Creds) -> (String, String) {
    // The old key and certificate, kept aside to show the hosts refuse them afterwards.
    let old = Creds::copy(&dir.join("old"));
    // Zone A: a new key in the key file, and its public half beside it (libvirt offers
    // <keyfile>.pub when it exists, so a stale one would still offer the old key);
    // authorized_keys holds only the new key.
    let fresh = dir.join("fresh_ed25519");
    new_ssh_key(local, &fresh);
    std::fs::copy(&fresh, creds.ssh("id_ed25519")).unwrap();
    std::fs::copy(fresh.with_extension("pub"), creds.ssh("id_ed25519.pub")).unwrap();
    let public = std::fs::read_to_string(fresh.with_extension("pub")).unwrap();
    std::fs::write(
        local.a.root.join("home/bigfleet/.ssh/authorized_keys"),
        public,
    )
    .unwrap();
    // Zone B: a new client certificate with a new DN; the allowed list holds only that DN.
    let issued =
        Authority::tier().pkipath(&dir.join("fresh-tls"), "bigfleet-libvirt-client-2", false);
    for file in ["clientcert.pem", "clientkey.pem"] {
        std::fs::copy(issued.join(file), creds.tls(file)).unwrap();
    }
    let conf = local.b.root.join("etc/libvirt/libvirtd.conf");
    let text = std::fs::read_to_string(&conf).unwrap();
    let rotated: Vec<String> = text
        .lines()
        .map(|l| {
            if l.starts_with("tls_allowed_dn_list") {
                format!("tls_allowed_dn_list = [\"{NEW_DN}\"]")
            } else {
                l.to_owned()
            }
        })
        .collect();
    std::fs::write(&conf, rotated.join("\n") + "\n").unwrap();
    local.libvirtd(&local.b, "term");
    local.libvirtd(&local.b, "start");
    (old.ssh_uri(), old.tls_uri())
}

/// Waits until both remote zones report healthy.
async fn both_healthy(server: &Server) {
    for zone in ["rackA", "rackB"] {
        gauge_until(
            server,
            HEALTH,
            &[("zone", zone), ("state", "healthy")],
            1.0,
            Duration::from_secs(30),
        )
        .await;
    }
}

#[tokio::test]
#[ignore = "needs the real-QEMU tier: run scripts/qemu-tier/run.sh ci"]
async fn credential_rotation() {
    let dir = tempfile::tempdir().unwrap();
    let creds = Creds::copy(dir.path());
    let (tier, local) = remote(creds.ssh_uri(), creds.tls_uri());
    let server = tier.provider(dir.path(), "e2e-rotation", (1, 1), &[]);
    both_healthy(&server).await;
    let _restore = Restore::new(&local);
    let (old_ssh, old_tls) = rotate(dir.path(), &local, &creds);

    // The hosts no longer take the old credentials.
    let (_, report) = doctor(dir.path(), &format!("rackA={old_ssh},rackB={old_tls}"));
    let (a, b) = (connection(&report, "rackA"), connection(&report, "rackB"));
    println!("old key: {a}\nold certificate: {b}");
    assert!(
        a["detail"]
            .as_str()
            .unwrap()
            .contains("(key not authorised)"),
        "{a}"
    );
    assert!(
        b["detail"]
            .as_str()
            .unwrap()
            .contains("is not in the host's tls_allowed_dn_list"),
        "{b}"
    );

    let start = Instant::now();
    hangup(&server);
    logged(
        || lines_of(&server),
        Duration::from_secs(30),
        |message, v| message == "libvirt host redialled" && v["fields"]["zone"] == "rackA",
    )
    .await;
    println!(
        "SIGHUP -> rackA redialled with the new key: {:?}",
        start.elapsed()
    );
    both_healthy(&server).await;
    println!("SIGHUP -> both zones healthy: {:?}", start.elapsed());

    let mut c = server.client().await;
    let (a, b) = (
        ids_in(&mut c, "rackA").await.remove(0),
        ids_in(&mut c, "rackB").await.remove(0),
    );
    for id in [&a, &b] {
        create(&mut c, id, None).await.expect("Create accepted");
    }
    for id in [&a, &b] {
        reach(&mut c, id, S::Idle, BOOT).await;
        delete(&mut c, id, None).await.expect("Delete accepted");
    }
    for id in [&a, &b] {
        reach(&mut c, id, S::Speculative, BOOT).await;
    }
}
