//! `bigfleet-libvirt doctor` against the real-QEMU tier's libvirtd, with the same flags the
//! tier's provider serves with: nothing may block, and the printed table (shown with
//! `--nocapture`) is the record of a real run. With `--domain-type=kvm` on a host without
//! `/dev/kvm` it must say that KVM is unusable and offer `--domain-type=qemu`.

use std::path::Path;
use std::process::Command;

use serde_json::Value;

use super::Tier;
use crate::harness::binary;

/// The tier provider's flags, with `domain_type`.
fn flags(tier: &Tier, dir: &Path, domain_type: &str) -> Vec<String> {
    tier.flags(dir, "e2e-doctor", domain_type)
}

/// Runs doctor as a table (printed) and as JSON (returned with the exit code).
fn doctor(args: &[String]) -> (i32, Value) {
    let table = Command::new(binary())
        .arg("doctor")
        .args(args)
        .output()
        .expect("run doctor");
    println!(
        "bigfleet-libvirt doctor {}\n{}",
        args.join(" "),
        String::from_utf8_lossy(&table.stdout)
    );
    let json = Command::new(binary())
        .args(["doctor", "--output=json"])
        .args(args)
        .output()
        .expect("run doctor");
    let report: Value = serde_json::from_slice(&json.stdout).unwrap_or_else(|e| {
        panic!(
            "doctor printed no JSON ({e}); stderr: {}",
            String::from_utf8_lossy(&json.stderr)
        )
    });
    assert_eq!(table.status.code(), json.status.code());
    (json.status.code().expect("an exit code"), report)
}

fn check<'a>(report: &'a Value, name: &str) -> &'a Value {
    report["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["zone"] == "local" && c["check"] == name)
        .unwrap_or_else(|| panic!("no {name} check: {report:#}"))
}

#[test]
#[ignore = "needs the real-QEMU tier: run scripts/qemu-tier/run.sh ci"]
fn doctor_passes_against_the_real_libvirtd() {
    let tier = Tier::from_env();
    let dir = tempfile::tempdir().unwrap();
    let (code, report) = doctor(&flags(&tier, dir.path(), "qemu"));
    assert_ne!(code, 1, "nothing blocks on the tier: {report:#}");
    assert_eq!(report["blockers"], 0, "{report:#}");
    let connection = check(&report, "connection");
    assert_eq!(connection["status"], "ok", "{connection}");
    assert!(
        connection["detail"]
            .as_str()
            .unwrap()
            .contains("driver QEMU"),
        "{connection}"
    );
    for name in ["domain type", "storage pool", "image", "network"] {
        assert_eq!(check(&report, name)["status"], "ok", "{name}: {report:#}");
    }

    let (code, report) = doctor(&flags(&tier, dir.path(), "kvm"));
    let kvm = check(&report, "domain type");
    if tier.root.join("dev/kvm").exists() {
        println!("this host has /dev/kvm: kvm reported as {kvm}");
    } else {
        assert_eq!(code, 1, "{report:#}");
        assert_eq!(kvm["status"], "block", "{kvm}");
        assert!(
            kvm["detail"].as_str().unwrap().starts_with("kvm unusable"),
            "{kvm}"
        );
        assert!(
            kvm["fix"].as_str().unwrap().contains("--domain-type=qemu"),
            "{kvm}"
        );
    }
}
