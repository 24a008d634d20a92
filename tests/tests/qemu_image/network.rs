//! The real image's NIC on the image zone's NAT network `default`. `guest_network`'s claims
//! (checked in `cloud_init_identity_and_guest_network`'s incarnations, identity.rs): a DHCP
//! lease from libvirt's dnsmasq for the MAC the provider derived from the machine id, the
//! same MAC after the slot is re-created, and the guest's own view (`ip -j addr`, through the
//! agent) agreeing with the lease, and the provider's `configured` log line reporting that
//! lease for that MAC, on its log line and on the machine's timeline.
//! `first_boot_with_a_static_address_on_a_bridge_without_dhcp` boots its own guest (its own
//! `--nic`, `--address-pools` and a first-boot type, on the zone's network without DHCP).

use base64::Engine as _;
use serde_json::Value;
use virt::domain::Domain;

use crate::harness::logs::{lines_of, logged};

use super::*;

/// The MAC of the domain's one NIC, from its live XML.
fn mac_of(domain: &Domain) -> String {
    let xml = domain.xml_desc(0).expect("the domain's XML");
    let at = xml
        .find("<mac address='")
        .expect("the domain has a NIC with a MAC");
    let rest = &xml[at + "<mac address='".len()..];
    rest[..rest.find('\'').unwrap()].to_ascii_lowercase()
}

/// The IPv4 address dnsmasq leased to `mac` most recently (the latest expiry), from the
/// network's status file. Earlier incarnations of the slot leave leases for the same MAC
/// under other DHCP client ids (each boot of a fresh overlay has a new DUID), so the first
/// entry for the MAC can be stale.
fn leased(tier: &ImageTier, mac: &str) -> Result<String, String> {
    let path = tier.host_path("/var/lib/libvirt/dnsmasq/virbr0.status");
    let text = std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    let leases: Value = serde_json::from_str(if text.trim().is_empty() { "[]" } else { &text })
        .map_err(|e| format!("{}: {e}", path.display()))?;
    leases
        .as_array()
        .into_iter()
        .flatten()
        .filter(|l| {
            l["mac-address"]
                .as_str()
                .map(str::to_ascii_lowercase)
                .as_deref()
                == Some(mac)
        })
        .max_by_key(|l| l["expiry-time"].as_u64().unwrap_or_default())
        .and_then(|l| l["ip-address"].as_str().map(str::to_owned))
        .ok_or_else(|| format!("no lease for {mac} yet: {text}"))
}

/// The guest's interface with `mac` and its IPv4 addresses, from `ip -j addr`; an error
/// while the guest has no such interface (the agent answers before the guest's udev has
/// brought up its NIC).
fn guest_addresses(domain: &Domain, mac: &str) -> Result<Vec<String>, String> {
    let links: Value = serde_json::from_str(&guest::run(domain, "ip -j addr show")).unwrap();
    let link = links
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["address"].as_str() == Some(mac))
        .ok_or_else(|| format!("the guest has no NIC with MAC {mac} yet: {links}"))?;
    Ok(link["addr_info"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|a| a["family"] == "inet")
        .filter_map(|a| a["local"].as_str().map(str::to_owned))
        .collect())
}

/// Waits until dnsmasq leased an address to `mac` and the guest's own view of that NIC is
/// that address: the agent answers before the guest's DHCP is done, and dnsmasq may still
/// hold an earlier incarnation's lease for the same MAC. Returns the address and the wait.
async fn lease_held(
    tier: &ImageTier,
    domain: &Domain,
    name: &str,
    mac: &str,
) -> (String, Duration) {
    let waited = until_explained(
        &format!("{name}'s NIC ({mac}) to hold its lease"),
        BOOT,
        || {
            let (lease, seen) = (leased(tier, mac)?, guest_addresses(domain, mac)?);
            if seen == std::slice::from_ref(&lease) {
                return Ok(());
            }
            Err(format!("lease {lease}, the guest sees {seen:?}"))
        },
    )
    .await;
    (leased(tier, mac).unwrap(), waited)
}

/// A guest's NIC and the address dnsmasq leased to it.
pub struct Lease {
    pub mac: String,
    pub address: String,
}

/// `guest_network`, in one booted incarnation: dnsmasq leased an address on the tier's
/// network to the domain's MAC, and the guest's own view of that NIC is that address.
pub async fn lease_seen_by_guest(
    tier: &ImageTier,
    domain: &Domain,
    name: &str,
    boot: Duration,
) -> Lease {
    let mac = mac_of(domain);
    let (address, settled) = lease_held(tier, domain, name, &mac).await;
    let seen = guest_addresses(domain, &mac).expect("the NIC that holds the lease");
    println!(
        "  {name}: MAC {mac}, lease {address} (held {settled:.2?} after the agent, \
         {boot:.2?} boot), guest sees {seen:?}"
    );
    assert!(
        address.starts_with("192.168.122."),
        "guest_network: a lease on the tier's network: {address}"
    );
    assert_eq!(
        seen,
        std::slice::from_ref(&address),
        "guest_network: the guest's address is its lease"
    );
    Lease { mac, address }
}

/// `guest_network`: Configures `id` and checks that the provider's `configured` log line for
/// this incarnation reports `lease` on its NIC.
pub async fn configured_line_reports(
    server: &Server,
    c: &mut Client,
    id: &str,
    name: &str,
    lease: &Lease,
) {
    // Only this incarnation's line counts: the slot's domain keeps its name across incarnations.
    let before = lines_of(server).len();
    let accepted = configure(c, id, "net-cluster", &[], None).await;
    settle(c, id, accepted, S::Configured, BOOT, Instant::now()).await;
    let reported = reported_address(server, before, name, &lease.mac).await;
    println!("  {name}: the provider's configured line reports {reported}");
    assert_eq!(
        reported,
        format!("{}/24", lease.address),
        "guest_network: the product reports the guest's lease on its NIC"
    );
    let shown = timeline_addresses(server, id).await;
    println!("  {name}: the machine's timeline shows {shown}");
    assert!(
        shown.contains(&format!("{} {}/24", lease.mac, lease.address)),
        "guest_network: the machine's timeline shows the lease on its NIC: {shown}"
    );
}

/// The `addresses` field of the newest `addresses` event on `id`'s timeline
/// (`GET /timeline?machine=ID` on the metrics port).
async fn timeline_addresses(server: &Server, id: &str) -> String {
    let metrics = server
        .metrics_addr
        .expect("the tier's providers serve --metrics-addr");
    let events = timeline_events(metrics, id).await;
    events
        .iter()
        .rev()
        .find(|e| e["event"] == "addresses")
        .and_then(|e| e["addresses"].as_str())
        .unwrap_or_else(|| panic!("no addresses event on the timeline: {events:?}"))
        .to_lowercase()
}

/// The IPv4 `address/prefix` the provider's `configured` log line for `name` (among the log's
/// lines after the first `skip`) gives the interface with `mac` (its `addresses` field:
/// `NAME MAC ADDR/PREFIX ...` per interface, joined by `; `). Fails when the line is missing
/// (also when the provider logged only that it could not read the addresses) or names no
/// IPv4 address for `mac`.
async fn reported_address(server: &Server, skip: usize, name: &str, mac: &str) -> String {
    let line = logged(
        || lines_of(server).split_off(skip),
        Duration::from_secs(30),
        |m, v| m == "configured" && v["fields"]["domain"] == name,
    )
    .await;
    let field = line["fields"]["addresses"].as_str().unwrap_or_default();
    field
        .split("; ")
        .map(|part| part.split(' ').collect::<Vec<_>>())
        .find(|words| words.get(1).map(|w| w.to_ascii_lowercase()).as_deref() == Some(mac))
        .and_then(|words| {
            words[2..]
                .iter()
                .find(|w| !w.contains(':') && w.contains('/'))
                .map(|w| (*w).to_owned())
        })
        .unwrap_or_else(|| panic!("the configured line names no IPv4 address for {mac}: {line}"))
}

/// A machine that configures at its first boot, with a static address on a network without
/// DHCP, on a NIC plugged into an existing host bridge: one real-image guest for two
/// independent claims.
///
/// - First boot (`"boot": "nocloud"`): Create leaves the domain defined and off; Configure
///   writes the join blob (here a cloud-config that writes a file) as the seed's user-data
///   and starts the domain; the guest's cloud-init ran it (the file, read through the agent,
///   is byte for byte what the blob said); the seed on the host holds the blob while the
///   machine is Configured. Then the guest's agent is made to forbid `guest-exec`, as
///   Talos's does: Drain cannot run the hook, asks the guest to shut down instead, and the
///   guest powers itself off (the domain is shut off with reason `shutdown`, not
///   `destroyed`); after Drain the seed no longer holds the blob.
/// - Static address: the image zone's isolated libvirt network `static`
///   (scripts/qemu-tier/network.sh: bridge `virbr1`, 192.168.123.1/24 in the zone's
///   namespace, no DHCP server) and `--address-pools` giving the type's slots 192.168.123.10
///   onwards. The domain's interface is of type `bridge` on `virbr1`; the guest's own view of
///   the NIC with its MAC (through the agent) is exactly the slot's address, which no DHCP
///   server could have given; and the guest answers a ping from the zone's namespace.
// The guest reads (`guest::`) call the agent synchronously and block their worker; on a
// runtime of its own threads the gRPC connections' tasks keep answering the provider's HTTP/2
// keepalive pings meanwhile (a ping unanswered for 10 s drops the connection, and with it a
// call in flight: seen under load when two walks shared one thread).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the real-QEMU tier: run scripts/qemu-tier/run.sh ci"]
async fn first_boot_with_a_static_address_on_a_bridge_without_dhcp() {
    let _wall = WallTime::start("first_boot_with_a_static_address_on_a_bridge_without_dhcp");
    let tier = ImageTier::from_env();
    let accel = tier.accel();
    println!(
        "first_boot_with_a_static_address: {} on virbr1",
        accel.describe()
    );
    let dir = tempfile::tempdir().unwrap();
    let pools = dir.path().join("pools.json");
    let pool = json!([{ "instance_type": "img.small", "zone": "local",
        "cidr": "192.168.123.0/24", "first": "192.168.123.10",
        "gateway": "192.168.123.1", "dns": ["192.168.123.1"] }]);
    std::fs::write(&pools, pool.to_string()).unwrap();
    let pools_flag = format!("--address-pools={}", pools.display());
    let virt = Libvirt::open(&tier);
    let plan = DiskPlan {
        boot: Some("nocloud"),
        ..DiskPlan::default()
    };
    let flags = ["--nic=bridge=virbr1", pools_flag.as_str()];
    let server = tier.provider(dir.path(), "img-static", 2, &accel, &flags, &plan);
    let mut c = server.client().await;
    let id = pick(&server, &mut c).await;
    let slot: u8 = id.rsplit('/').next().unwrap().parse().unwrap();
    let start = Instant::now();
    let accepted = create(&mut c, &id, None).await;
    let (idle, _) = settle(&mut c, &id, accepted, S::Idle, BOOT, start).await;
    let name = domain_name(&idle);
    let domain = virt.domain(&name).expect("Create defined the domain");
    assert!(
        !domain.is_active().unwrap(),
        "first boot: {name} rests off until Configure"
    );
    let xml = domain.xml_desc(0).expect("the domain's XML");
    assert!(
        xml.contains("<interface type='bridge'>") && xml.contains("<source bridge='virbr1'/>"),
        "{name} has its NIC on the bridge: {xml}"
    );

    let blob = configure_first_boot(&mut c, &id, &virt, &domain, &name).await;
    static_address_held(&tier, &domain, &name, slot).await;
    forbid_guest_exec(&domain, &name).await;

    let mut c = server.client().await;
    drained_by_a_shutdown(&mut c, &id, &domain, &name).await;
    let seed = virt.seed_bytes(&name);
    assert!(
        !contains(&seed, &blob),
        "after Drain the seed no longer holds the blob"
    );
    assert!(
        !contains(&seed, "bigfleet-first-boot"),
        "nor any part of it"
    );
    let accepted = delete(&mut c, &id, None).await;
    settle(&mut c, &id, accepted, S::Speculative, BOOT, Instant::now()).await;
}

/// First boot: Configures `id` (domain `name`) with a blob that is a cloud-config writing a
/// file, and checks that the seed on the host holds it while Configured and that the guest's
/// cloud-init wrote the file byte for byte at its first boot. Returns the blob.
async fn configure_first_boot(
    c: &mut Client,
    id: &str,
    virt: &Libvirt,
    domain: &Domain,
    name: &str,
) -> String {
    let content = format!("first boot of {name}, from the join blob\n");
    let blob = format!(
        "#cloud-config\nwrite_files:\n- path: /run/bigfleet-first-boot\n  encoding: b64\n  \
         content: {}\n",
        STANDARD.encode(&content)
    );
    let start = Instant::now();
    let md = std::collections::HashMap::new();
    let accepted = configure_map(c, id, "first-boot", md, blob.clone().into_bytes(), None).await;
    settle(c, id, accepted, S::Configured, BOOT, start).await;
    let seed = virt.seed_bytes(name);
    assert!(
        contains(&seed, &blob),
        "the seed holds the blob while Configured"
    );
    let written = until_explained(&format!("{name}'s user-data to run"), BOOT, || {
        let exec = guest::sh(domain, "cat /run/bigfleet-first-boot")?;
        if exec.code == 0 && exec.stdout == content {
            Ok(())
        } else {
            Err(format!("not yet: {exec:?}"))
        }
    })
    .await;
    println!("  {name}: the blob's user-data ran at first boot ({written:.2?} after Configured)");
    blob
}

/// Drains `id` (domain `name`), whose agent forbids `guest-exec`: the Drain asks the guest
/// to shut down, and the guest powers itself off (shut off with reason `shutdown`).
async fn drained_by_a_shutdown(c: &mut Client, id: &str, domain: &Domain, name: &str) {
    let start = Instant::now();
    let accepted = drain(c, id, 60, None).await;
    settle(c, id, accepted, S::Idle, BOOT, start).await;
    let (state, reason) = domain.state().unwrap();
    let (state, reason) = (format!("{state:?}"), format!("{reason:?}"));
    println!(
        "  {name}: drained in {:.1?}: {state} {reason}",
        start.elapsed()
    );
    assert!(
        state.contains("Shutoff"),
        "Drain stopped the machine: {state}"
    );
    assert!(
        reason.contains("Shutdown") && !reason.contains("Destroyed"),
        "with no guest-exec, Drain asked the guest to shut down and it powered off: {reason}"
    );
}

/// Turns `guest-exec` off in the guest's agent, as Talos ships its agent: writes the agent's
/// configuration file and has systemd restart the agent two seconds later (after this
/// command's own status was read), then waits until the agent lists `guest-exec` disabled.
async fn forbid_guest_exec(domain: &Domain, name: &str) {
    guest::run(
        domain,
        "mkdir -p /etc/qemu && printf '[general]\\nblock-rpcs=guest-exec\\n' \
         >/etc/qemu/qemu-ga.conf && systemd-run --on-active=2 \
         systemctl restart qemu-guest-agent.service >/dev/null 2>&1",
    );
    let off = until_explained(
        &format!("{name}'s agent to forbid guest-exec"),
        Duration::from_secs(120),
        || {
            let info = guest::agent(domain, &json!({"execute": "guest-info"}))?;
            let commands = info["supported_commands"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            let exec = commands.iter().find(|c| c["name"] == "guest-exec");
            match exec.map(|c| &c["enabled"]) {
                Some(Value::Bool(false)) => Ok(()),
                other => Err(format!("guest-exec enabled: {other:?}")),
            }
        },
    )
    .await;
    println!("  {name}: its agent forbids guest-exec ({off:.2?})");
}

/// Static address: the guest's NIC with the derived MAC holds exactly slot `slot`'s address
/// and the guest answers a ping from the zone's namespace.
async fn static_address_held(tier: &ImageTier, domain: &Domain, name: &str, slot: u8) {
    let address = format!("192.168.123.{}", 10 + slot);
    let mac = mac_of(domain);
    let settled = until_explained(
        &format!("{name}'s NIC ({mac}) to hold {address}"),
        BOOT,
        || match guest_addresses(domain, &mac)? {
            seen if seen == std::slice::from_ref(&address) => Ok(()),
            seen => Err(format!("the guest sees {seen:?}")),
        },
    )
    .await;
    println!("  {name}: slot {slot}, MAC {mac}, static {address} (held {settled:.2?} later)");
    let answered = until_explained(
        &format!("{address} to answer a ping from the zone's namespace"),
        Duration::from_secs(60),
        || ping_from_zone(tier, &address),
    )
    .await;
    println!("  {name}: {address} answers a ping from the zone's namespace ({answered:.2?})");
}

fn contains(haystack: &[u8], needle: &str) -> bool {
    (haystack.windows(needle.len())).any(|w| w == needle.as_bytes())
}

/// One ping of `address` from the image zone's network namespace (with the zone's own
/// busybox: the host need not have a ping).
fn ping_from_zone(tier: &ImageTier, address: &str) -> Result<(), String> {
    let netns = format!("--net=/run/netns/{}", var("BIGFLEET_QEMU_NETNS"));
    let output = std::process::Command::new("nsenter")
        .arg(&netns)
        .arg("chroot")
        .arg(&tier.root)
        .args(["busybox", "ping", "-c", "1", "-W", "2", address])
        .output()
        .map_err(|e| format!("run nsenter: {e}"))?;
    if output.status.success() {
        return Ok(());
    }
    Err(format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    ))
}
