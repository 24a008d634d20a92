//! `cloud_init_identity_and_guest_network`: the NoCloud seed the provider builds, as the real
//! image's cloud-init reads it, and the real image's NIC on the zone's NAT network, on one
//! provider (`--base-user-data`, the default NIC) and two incarnations of its one slot. The
//! three sets of claims need the same guests (a booted real image; two incarnations of one
//! slot), so they share them, and each set checks its own things in them:
//!
//! - `base_user_data` (first incarnation): the `--base-user-data` file is the seed's
//!   user-data: its `write_files` wrote the marker, its `runcmd` ran under the instance-id.
//! - `cloud_init_identity`: each incarnation of a slot gets its own instance-id, and so runs
//!   its user-data again, under the new one.
//! - `guest_network` (network.rs): each incarnation's lease, the guest's own view and the
//!   provider's `configured` log line agree, and the re-created slot keeps its derived MAC.

use super::*;

/// User-data whose runcmd appends the instance-id it ran under to a file, and whose
/// write_files writes `marker` to another.
fn user_data(dir: &Path, marker: &str) -> PathBuf {
    let path = dir.join("user-data.yaml");
    let text = format!(
        "#cloud-config\n\
         write_files:\n\
         \x20 - path: /var/lib/bigfleet/base-user-data\n\
         \x20   permissions: '0644'\n\
         \x20   content: |\n\
         \x20     {marker}\n\
         runcmd:\n\
         \x20 - [ sh, -c, 'cat /var/lib/cloud/data/instance-id >> /var/lib/bigfleet/user-data-runs' ]\n"
    );
    std::fs::write(&path, text).unwrap();
    path
}

/// What one incarnation showed: cloud-init's instance-id, the runs file, the write_files
/// file, and the NIC's MAC.
struct Incarnation {
    instance: String,
    runs: String,
    written: String,
    mac: String,
}

/// Boots one incarnation of `id`: checks its lease against the guest's view (network.rs),
/// waits for cloud-init and reads what the user-data did, then Configures (the provider's
/// `configured` line must report the lease), drains and deletes it.
async fn incarnation(tier: &ImageTier, server: &Server, virt: &Libvirt, id: &str) -> Incarnation {
    let mut c = server.client().await;
    let (idle, domain, _, boot) = create_and_boot(&mut c, virt, id).await;
    let name = domain_name(&idle);
    let lease = network::lease_seen_by_guest(tier, &domain, &name, boot).await;
    guest::cloud_init_done(&domain, &name).await;
    let instance = guest::instance_id(&domain);
    let runs = guest::run(&domain, "cat /var/lib/bigfleet/user-data-runs");
    let written = guest::run(&domain, "cat /var/lib/bigfleet/base-user-data");
    println!("  {name}: booted in {boot:.2?}, instance-id {instance}");
    // A fresh connection: the provider closes client connections left idle while the guest
    // was read.
    let mut c = server.client().await;
    network::configured_line_reports(server, &mut c, id, &name, &lease).await;
    let accepted = drain(&mut c, id, 30, None).await;
    settle(&mut c, id, accepted, S::Idle, BOOT, Instant::now()).await;
    let accepted = delete(&mut c, id, None).await;
    settle(&mut c, id, accepted, S::Speculative, BOOT, Instant::now()).await;
    Incarnation {
        instance,
        runs,
        written,
        mac: lease.mac,
    }
}

// The guest reads (`guest::`) call the agent synchronously and block their worker; on a
// runtime of its own threads the gRPC connections' tasks keep answering the provider's HTTP/2
// keepalive pings meanwhile (a ping unanswered for 10 s drops the connection, and with it a
// call in flight: seen under load when two walks shared one thread).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the real-QEMU tier: run scripts/qemu-tier/run.sh ci"]
async fn cloud_init_identity_and_guest_network() {
    let _wall = WallTime::start("cloud_init_identity_and_guest_network");
    let tier = ImageTier::from_env();
    let accel = tier.accel();
    println!(
        "cloud_init_identity_and_guest_network: {} on the NAT network default",
        accel.describe()
    );
    let dir = tempfile::tempdir().unwrap();
    let marker = format!("written by --base-user-data in {}", unique_shard("img"));
    let data = user_data(dir.path(), &marker);
    let flag = format!("--base-user-data={}", data.display());
    let virt = Libvirt::open(&tier);
    let server = tier.provider(
        dir.path(),
        "img-id",
        1,
        &accel,
        &[&flag],
        &DiskPlan::default(),
    );
    let mut c = server.client().await;
    let id = pick(&server, &mut c).await;
    let first = incarnation(&tier, &server, &virt, &id).await;

    // base_user_data
    assert_eq!(
        first.written.trim_end(),
        marker,
        "base_user_data: write_files wrote the file"
    );
    assert_eq!(
        first.runs.trim(),
        first.instance,
        "base_user_data: runcmd ran, once, under the first instance-id"
    );

    let second = incarnation(&tier, &server, &virt, &id).await;

    // cloud_init_identity
    assert_ne!(
        first.instance, second.instance,
        "cloud_init_identity: a re-created slot gets a new instance-id"
    );
    assert_eq!(
        second.runs.trim(),
        second.instance,
        "cloud_init_identity: user-data ran again, under the new instance-id"
    );

    // guest_network
    assert_eq!(
        first.mac, second.mac,
        "guest_network: a re-created slot keeps its derived MAC"
    );
    let octet = u8::from_str_radix(&first.mac[..2], 16).unwrap();
    assert_eq!(
        octet & 0b11,
        0b10,
        "guest_network: a locally administered unicast MAC: {}",
        first.mac
    );
}
