//! Dry runs of a Secure Boot instance type: refused with a directly booted kernel, which the
//! firmware never checks, and accepted without one.

use super::{dry_run, refused};

#[test]
fn secure_boot_types_are_refused_with_a_directly_booted_kernel() {
    let dir = tempfile::tempdir().unwrap();
    let types = dir.path().join("types.json");
    std::fs::write(
        &types,
        r#"{"kvm.small": {"vcpu": 2, "memory_mib": 2048, "secure_boot": true}}"#,
    )
    .unwrap();
    let mut args = vec![
        "--connect",
        "rack1=test:///default",
        "--image",
        "base.qcow2",
        "--instance-types",
        types.to_str().unwrap(),
    ];
    dry_run(&args);
    args.extend(["--domain-type", "qemu", "--guest-kernel", "/guest/vmlinuz"]);
    let error = refused(&args);
    for says in [
        "instance type \"kvm.small\" asks for secure_boot",
        "--guest-kernel",
        "drop --guest-kernel",
    ] {
        assert!(error.contains(says), "{says:?} not in {error}");
    }
}
