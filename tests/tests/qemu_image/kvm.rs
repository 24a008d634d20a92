//! `kvm_guest`: the real image's lifecycle on `--domain-type kvm` with a CPU mode that works on
//! the host, where the image zone's QEMU can run KVM guests (`BIGFLEET_QEMU_KVM`, probed by the
//! tier: KVM_CREATE_VM, then a guest that must reach its init). Where it cannot, the test says
//! why and runs nothing else (the other scenarios then ran on TCG).
//!
//! On some nested KVM hosts the production default `host-passthrough` aborts QEMU 7.2 at
//! start (MSR 0x10a); on others it starts. Before the walk, `doctor --trial-domain` tries it
//! and the test prints what the `cpu trial` line found: either it passed, or it blocked with
//! libvirt's reason and a `--cpu` fix. The walk then runs with the mode the tier chose.

use std::process::Command;

use serde_json::Value;

use super::*;

/// `doctor --trial-domain` with `--cpu=host-passthrough` on KVM: the `cpu trial` check either
/// passes or blocks naming why the trial domain died and a CPU mode to use instead.
fn doctor_tries_host_passthrough(tier: &ImageTier, dir: &Path) {
    let accel = Accel {
        domain_type: "kvm",
        cpu: Some("host-passthrough".to_owned()),
    };
    let mut args = tier.flags(dir, "img-doctor", 1, &accel, &[], &DiskPlan::default());
    args.push("--trial-domain".to_owned());
    let out = Command::new(binary())
        .args(["doctor", "--output=json"])
        .args(&args)
        .output()
        .expect("run doctor");
    let report: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "doctor printed no JSON ({e}): {}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    let trial = report["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["check"] == "cpu trial")
        .unwrap_or_else(|| panic!("no cpu trial check: {report:#}"));
    println!("doctor --cpu=host-passthrough --trial-domain: {trial}");
    match trial["status"].as_str() {
        Some("ok") => println!("kvm_guest: host-passthrough starts on this host"),
        Some("block") => {
            assert!(
                trial["fix"].as_str().unwrap_or_default().contains("--cpu"),
                "{trial}"
            );
            assert!(
                !trial["detail"].as_str().unwrap_or_default().is_empty(),
                "{trial}"
            );
            println!("kvm_guest: doctor refuses host-passthrough here");
        }
        other => panic!("cpu trial is neither ok nor block ({other:?}): {trial}"),
    }
}

// The guest reads (`guest::`) call the agent synchronously and block their worker; on a
// runtime of its own threads the gRPC connections' tasks keep answering the provider's HTTP/2
// keepalive pings meanwhile (a ping unanswered for 10 s drops the connection, and with it a
// call in flight: seen under load when two walks shared one thread).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the real-QEMU tier: run scripts/qemu-tier/run.sh ci"]
async fn kvm_guest() {
    let _wall = WallTime::start("kvm_guest");
    let tier = ImageTier::from_env();
    match &tier.kvm {
        Err(why) => println!(
            "kvm_guest: KVM is not usable in the image zone ({why}); the other real-image \
             scenarios ran on TCG and nothing else runs here"
        ),
        Ok(()) => {
            let accel = tier.kvm_accel();
            println!("kvm_guest: {}", accel.describe());
            let dir = tempfile::tempdir().unwrap();
            doctor_tries_host_passthrough(&tier, dir.path());
            let virt = Libvirt::open(&tier);
            let server = tier.provider(dir.path(), "img-kvm", 1, &accel, &[], &DiskPlan::default());
            walk(&server, &virt, "image-cluster-kvm", &DiskPlan::default())
                .await
                .print(&format!("real image, BIOS, {}", accel.describe()));
        }
    }
}
