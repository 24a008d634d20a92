//! Dry runs with `--ignition-template`: a type that boots by Ignition needs the template, a
//! template no offered type uses is refused, a bad template or delivery is refused naming
//! the flag and the fix, and a good one is accepted.

use super::{dry_run, refused};

const TEMPLATE: &str = r#"{"ignition": {"version": "3.3.0"}}"#;

/// A libvirt dry run on the test driver with `kvm.ign` (booting by `boot`) ×2 in `rack1`,
/// the template `template` (when given) and `extra` flags.
fn run_with(boot: &str, template: Option<&str>, extra: &[&str], check: impl FnOnce(&[&str])) {
    let dir = tempfile::tempdir().unwrap();
    let types = dir.path().join("types.json");
    let shape = format!(r#"{{"kvm.ign": {{"vcpu": 2, "memory_mib": 2048, "boot": "{boot}"}}}}"#);
    std::fs::write(&types, shape).unwrap();
    let offerings = dir.path().join("offerings.json");
    let offered = r#"[{"instance_type": "kvm.ign", "zone": "rack1", "count": 2}]"#;
    std::fs::write(&offerings, offered).unwrap();
    let config = dir.path().join("node.ign");
    let mut args = vec![
        "--connect",
        "rack1=test:///default",
        "--image",
        "base.qcow2",
        "--instance-types",
        types.to_str().unwrap(),
        "--offerings",
        offerings.to_str().unwrap(),
    ];
    if let Some(text) = template {
        std::fs::write(&config, text).unwrap();
        args.extend(["--ignition-template", config.to_str().unwrap()]);
    }
    args.extend(extra);
    check(&args);
}

#[test]
fn a_template_for_the_ignition_types_is_accepted_with_either_delivery() {
    for extra in [&[][..], &["--ignition-delivery", "config-drive"]] {
        run_with("ignition", Some(TEMPLATE), extra, |args| {
            let inventory = dry_run(args);
            assert_eq!(inventory.matches("\"id\"").count(), 2, "{inventory}");
        });
    }
}

#[test]
fn a_missing_unused_or_bad_template_is_refused_naming_the_fix() {
    let cases: [(&str, Option<&str>, &[&str], &str); 5] = [
        (
            "ignition",
            None,
            &[],
            "instance type \"kvm.ign\" boots by Ignition (\"boot\": \"ignition\") and no \
             --ignition-template is given",
        ),
        (
            "agent",
            Some(TEMPLATE),
            &[],
            "is given and no offered instance type boots by Ignition",
        ),
        (
            "ignition",
            Some(r#"{"ignition": {"version": "2.2.0"}}"#),
            &[],
            "ignition.version is \"2.2.0\"; the provider writes Ignition spec 3 configs",
        ),
        (
            "ignition",
            Some(TEMPLATE),
            &["--ignition-delivery", "iso"],
            "--ignition-delivery \"iso\" is not a delivery; use fw-cfg",
        ),
        (
            "agent",
            None,
            &["--ignition-delivery", "fw-cfg"],
            "--ignition-delivery is set without --ignition-template",
        ),
    ];
    for (boot, template, extra, says) in cases {
        run_with(boot, template, extra, |args| {
            let error = refused(args);
            assert!(
                error.contains(says),
                "{boot} {template:?} {extra:?}: {error}"
            );
        });
    }
}
