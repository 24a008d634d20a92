//! First boot by Ignition (`"boot": "ignition"`, docs/libvirt.md §5.14), delivered as QEMU's
//! firmware configuration entry, walked with Ignition's own engine: the tier's image runs
//! Debian's `ignition` (its qemu platform's fetch-offline and files stages) from a unit
//! before the guest agent starts (scripts/qemu-tier/image/bigfleet-ignition.service). Not a
//! Flatcar or Fedora CoreOS image: the engine is theirs, the OS around it Debian's.

use base64::Engine as _;

use crate::harness::logs::lines_of;

use super::*;

/// The operator's template: a spec 3.3.0 config that writes a file of its own.
const TEMPLATE: &str = r#"{"ignition": {"version": "3.3.0"},
  "storage": {"files": [{"path": "/etc/bigfleet/template-marker", "mode": 420,
    "contents": {"source": "data:,written%20by%20the%20template%0A"}}]}}"#;

/// One guest, one slot of a type that boots by Ignition:
///
/// - Create defines the domain, off, with the config's volume named in a `fwcfg` entry
///   (`opt/com.coreos/config`); the volume holds the template and no blob.
/// - Configure writes the blob in and starts the domain; the guest's Ignition merged the
///   template (its file is there) and wrote the blob to `/etc/bigfleet/join` byte for byte
///   (binary bytes included), root-only. Right after the start the volume on the host is the
///   template again: the blob reached the guest once, through QEMU, and is gone from the
///   host; nor is it on any line the provider logged.
/// - Drain stops the domain, gives it a fresh root from the golden image (the booted root's
///   writes are gone: its overlay is back to a few hundred KiB) so that its next start is a
///   first boot again, and leaves the template; Delete removes the volume.
// The guest reads call the agent synchronously: a runtime of its own threads keeps the gRPC
// connection's keepalive answered meanwhile (as network.rs).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the real-QEMU tier: run scripts/qemu-tier/run.sh ci"]
async fn ignition_first_boot_through_the_firmware_configuration() {
    let _wall = WallTime::start("ignition_first_boot_through_the_firmware_configuration");
    let tier = ImageTier::from_env();
    let accel = tier.accel();
    println!("ignition_first_boot: {}", accel.describe());
    let dir = tempfile::tempdir().unwrap();
    let template = dir.path().join("node.ign");
    std::fs::write(&template, TEMPLATE).unwrap();
    let template_flag = format!("--ignition-template={}", template.display());
    let virt = Libvirt::open(&tier);
    let plan = DiskPlan {
        boot: Some("ignition"),
        ..DiskPlan::default()
    };
    let server = tier.provider(dir.path(), "img-ign", 1, &accel, &[&template_flag], &plan);
    let mut c = server.client().await;
    let id = pick(&server, &mut c).await;
    let start = Instant::now();
    let accepted = create(&mut c, &id, None).await;
    let (idle, _) = settle(&mut c, &id, accepted, S::Idle, BOOT, start).await;
    let name = domain_name(&idle);
    let volume = format!("{name}-ignition");
    let domain = virt.domain(&name).expect("Create defined the domain");
    assert!(
        !domain.is_active().unwrap(),
        "{name} rests off until Configure"
    );
    let xml = domain.xml_desc(0).expect("the domain's XML");
    assert!(
        xml.contains("<entry name='opt/com.coreos/config' file='")
            && xml.contains(&format!("/{volume}'/>")),
        "{name} names its config as QEMU's Ignition entry: {xml}"
    );
    assert_eq!(
        virt.volume_bytes(&volume).as_deref(),
        Some(TEMPLATE.as_bytes()),
        "before Configure the config is the template"
    );

    let blob = configure_ignition(&mut c, &id, &virt, &domain, &volume).await;
    let logged = lines_of(&server).join("\n");
    assert!(
        !logged.contains(&STANDARD.encode(&blob)) && !logged.contains("join blob of"),
        "the blob is on no line the provider logged"
    );

    let root = format!("{name}-overlay.qcow2");
    let booted = virt.volume_allocation(&root).expect("the root");
    let mut c = server.client().await;
    let accepted = drain(&mut c, &id, 30, None).await;
    settle(&mut c, &id, accepted, S::Idle, BOOT, Instant::now()).await;
    assert!(!domain.is_active().unwrap(), "Drain stopped the machine");
    let renewed = virt.volume_allocation(&root).expect("Drain left a root");
    println!("  {name}: root overlay {booted} bytes after the boot, {renewed} after Drain");
    assert!(
        renewed < 2 << 20 && renewed < booted,
        "Drain renewed the root: {booted} -> {renewed} bytes"
    );
    assert_eq!(
        virt.volume_bytes(&volume).as_deref(),
        Some(TEMPLATE.as_bytes()),
        "after Drain the config is the template"
    );
    let accepted = delete(&mut c, &id, None).await;
    settle(&mut c, &id, accepted, S::Speculative, BOOT, Instant::now()).await;
    assert_eq!(
        virt.volume_bytes(&volume),
        None,
        "Delete removed the config"
    );
}

/// Configures `id` with a blob of text and binary bytes, and checks what the guest's
/// Ignition did with it and that the host no longer holds it. Returns the blob.
async fn configure_ignition(
    c: &mut Client,
    id: &str,
    virt: &Libvirt,
    domain: &Domain,
    volume: &str,
) -> Vec<u8> {
    let mut blob = format!("join blob of {volume}\n").into_bytes();
    blob.extend([0, 1, 0xfe, 0xff, b'\n']);
    let start = Instant::now();
    let md = std::collections::HashMap::new();
    let accepted = configure_map(c, id, "ignition", md, blob.clone(), None).await;
    settle(c, id, accepted, S::Configured, BOOT, start).await;
    println!(
        "  {volume}: Configured {:.1?} after the Configure",
        start.elapsed()
    );
    let held = virt.volume_bytes(volume).expect("the config's volume");
    assert_eq!(
        held,
        TEMPLATE.as_bytes(),
        "once the domain started, the host's config is the template again"
    );
    // The unit ran before the agent answered: no waiting for the files.
    let joined = guest::run(domain, "base64 -w0 /etc/bigfleet/join");
    assert_eq!(
        STANDARD.decode(joined.trim()).unwrap(),
        blob,
        "Ignition wrote the blob byte for byte"
    );
    let mode = guest::run(domain, "stat -c '%a %U' /etc/bigfleet/join");
    assert_eq!(mode.trim(), "600 root", "the blob is root-only");
    let marker = guest::run(domain, "cat /etc/bigfleet/template-marker");
    assert_eq!(
        marker, "written by the template\n",
        "the template was merged"
    );
    let journal = guest::run(
        domain,
        "journalctl -b -u bigfleet-ignition.service -o cat | grep -v 'systemd journal entry'",
    );
    let result = guest::run(domain, "systemctl show -P Result bigfleet-ignition.service");
    assert_eq!(
        result.trim(),
        "success",
        "the guest's Ignition ran without error:\n{journal}"
    );
    let last: Vec<&str> = journal.lines().rev().take(3).collect();
    println!("  {volume}: the guest's Ignition: {}", last.join(" | "));
    blob
}
