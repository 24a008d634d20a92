//! A guest with a virtual TPM (an instance type's `tpm`): libvirt runs swtpm for it (the
//! tier's chroot has Debian's `swtpm` and `swtpm-tools`), QEMU gets a `tpm-crb` device backed
//! by it, the TPM's state lives under the zone's `/var/lib/libvirt/swtpm/<uuid>/`, and Delete
//! leaves neither the state nor a volume behind. Checked from the host's side (the domain's
//! definition, QEMU's command line and the state directory) and from the guest's: through its
//! agent, the guest's kernel (Debian's cloud kernel has the TPM and CRB drivers built in) has
//! `/dev/tpm0` and `/dev/tpmrm0`, and the chip is a TPM 2.0.

use std::path::Path;
use std::time::Instant;

use bigfleet_libvirt_proto::v1alpha1::MachineState as S;

use super::{BOOT, Libvirt, Tier, domain_name};
use crate::harness::*;
use crate::qemu_image::guest;
use crate::qemu_zones::until_explained;

/// QEMU's command line for domain `name` (its arguments joined by spaces), from the pid file
/// libvirt keeps under the zone's root.
fn qemu_command_line(root: &Path, name: &str) -> String {
    let file = root.join(format!("run/libvirt/qemu/{name}.pid"));
    let pid = std::fs::read_to_string(&file).expect("QEMU's pid file");
    let raw = std::fs::read(format!("/proc/{}/cmdline", pid.trim())).expect("QEMU's cmdline");
    String::from_utf8_lossy(&raw).replace('\0', " ")
}

// The guest reads (`guest::`) block their worker: on a runtime of its own threads the gRPC
// connection keeps answering the provider's keepalive pings meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the real-QEMU tier: run scripts/qemu-tier/run.sh ci"]
async fn a_guest_with_a_virtual_tpm_and_no_tpm_state_after_delete() {
    let tier = Tier::from_env();
    let dir = tempfile::tempdir().unwrap();
    let args = tier.flags(dir.path(), "e2etpm", "qemu");
    std::fs::write(
        dir.path().join("instance-types.json"),
        r#"{ "e2e.tiny": { "vcpu": 1, "memory_mib": 384, "tpm": true } }"#,
    )
    .unwrap();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let server = Server::start(&args);
    let mut c = server.client().await;
    let id = pick(&server, &mut c).await;
    let virt = Libvirt::open(Tier::from_env());
    let volumes_before = virt.volumes();

    let start = Instant::now();
    let accepted = create(&mut c, &id, None).await;
    let (idle, took) = settle(&mut c, &id, accepted, S::Idle, BOOT, start).await;
    println!("tpm: Create → Idle {took:.2?}");
    let name = domain_name(&idle);
    let domain = virt.domain(&name).expect("Create defined the domain");
    let xml = domain.xml_desc(0).expect("the domain's definition");
    assert!(xml.contains("<tpm model='tpm-crb'>"), "{xml}");
    let command = qemu_command_line(&tier.root, &name);
    assert!(
        command.contains("tpm-crb"),
        "QEMU has the TPM device: {command}"
    );
    until_explained(&format!("{name}'s guest agent answering"), BOOT, || {
        guest::agent(&domain, &serde_json::json!({"execute": "guest-ping"})).map(|_| ())
    })
    .await;
    let seen = guest::run(
        &domain,
        "test -c /dev/tpm0 && test -c /dev/tpmrm0 && cat /sys/class/tpm/tpm0/tpm_version_major",
    );
    println!(
        "tpm: the guest has /dev/tpm0 and /dev/tpmrm0, TPM version {}",
        seen.trim()
    );
    assert_eq!(seen.trim(), "2", "the guest sees a TPM 2.0");
    let uuid = domain.uuid_string().expect("the domain's UUID");
    let state = tier.root.join(format!("var/lib/libvirt/swtpm/{uuid}"));
    assert!(
        state.is_dir(),
        "swtpm keeps the TPM's state at {}",
        state.display()
    );

    let accepted = delete(&mut c, &id, None).await;
    settle(&mut c, &id, accepted, S::Speculative, BOOT, Instant::now()).await;
    assert!(virt.domain(&name).is_none(), "{name} is undefined");
    assert!(!state.exists(), "the TPM's state went with the domain");
    assert_eq!(virt.volumes(), volumes_before, "no volume is left");
}
