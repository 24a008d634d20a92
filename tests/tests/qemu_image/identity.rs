//! `cloud_init_identity` and `base_user_data`: the NoCloud seed the provider builds, as the
//! real image's cloud-init reads it. Each incarnation of a slot gets its own instance-id (and
//! so runs its user-data again), and a `--base-user-data` file is the seed's user-data.

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

/// Boots one incarnation of `id`, waits for cloud-init, and returns (instance-id, the runs
/// file, the write_files file); deletes it again.
async fn incarnation(server: &Server, virt: &Libvirt, id: &str) -> (String, String, String) {
    let mut c = server.client().await;
    let (idle, domain, _, boot) = create_and_boot(&mut c, virt, id).await;
    let name = domain_name(&idle);
    guest::cloud_init_done(&domain, &name).await;
    let instance = guest::instance_id(&domain);
    let runs = guest::run(&domain, "cat /var/lib/bigfleet/user-data-runs");
    let written = guest::run(&domain, "cat /var/lib/bigfleet/base-user-data");
    println!("  {name}: booted in {boot:.2?}, instance-id {instance}");
    // A fresh connection: the provider closes client connections left idle while the guest
    // was read.
    let mut c = server.client().await;
    let accepted = delete(&mut c, id, None).await;
    settle(&mut c, id, accepted, S::Speculative, BOOT, Instant::now()).await;
    (instance, runs, written)
}

#[tokio::test]
#[ignore = "needs the real-QEMU tier: run scripts/qemu-tier/run.sh ci"]
async fn cloud_init_identity() {
    let tier = ImageTier::from_env();
    let accel = tier.accel();
    println!("cloud_init_identity: {}", accel.describe());
    let dir = tempfile::tempdir().unwrap();
    let data = user_data(dir.path(), "identity");
    let flag = format!("--base-user-data={}", data.display());
    let virt = Libvirt::open(&tier);
    let server = tier.provider(dir.path(), "img-id", 1, &accel, &[&flag]);
    let mut c = server.client().await;
    let id = pick(&server, &mut c).await;
    let (first, first_runs, _) = incarnation(&server, &virt, &id).await;
    let (second, second_runs, _) = incarnation(&server, &virt, &id).await;
    assert_ne!(first, second, "a re-created slot gets a new instance-id");
    assert_eq!(
        first_runs.trim(),
        first,
        "user-data ran once, under the first instance-id"
    );
    assert_eq!(
        second_runs.trim(),
        second,
        "user-data ran again, under the new instance-id"
    );
}

#[tokio::test]
#[ignore = "needs the real-QEMU tier: run scripts/qemu-tier/run.sh ci"]
async fn base_user_data() {
    let tier = ImageTier::from_env();
    let accel = tier.accel();
    println!("base_user_data: {}", accel.describe());
    let dir = tempfile::tempdir().unwrap();
    let marker = format!("written by --base-user-data in {}", unique_shard("img"));
    let data = user_data(dir.path(), &marker);
    let flag = format!("--base-user-data={}", data.display());
    let virt = Libvirt::open(&tier);
    let server = tier.provider(dir.path(), "img-ud", 1, &accel, &[&flag]);
    let mut c = server.client().await;
    let id = pick(&server, &mut c).await;
    let (instance, runs, written) = incarnation(&server, &virt, &id).await;
    assert_eq!(written.trim_end(), marker, "write_files wrote the file");
    assert_eq!(runs.trim(), instance, "runcmd ran");
}
