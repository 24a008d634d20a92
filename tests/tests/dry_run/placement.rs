//! Dry runs of instance types that hold part of a host alone: dedicated CPUs need their
//! flag and a CPU list, huge pages whole pages, and device classes must be declared, with
//! no offering advertising a device its machines would not hold.

use super::{dry_run, refused};

#[test]
fn dedicated_cpus_need_the_flag_and_the_flag_a_cpu_list() {
    let dir = tempfile::tempdir().unwrap();
    let types = dir.path().join("types.json");
    std::fs::write(
        &types,
        r#"{"kvm.small": {"vcpu": 2, "memory_mib": 2048, "dedicated_cpus": true,
            "hugepages": "2Mi"}}"#,
    )
    .unwrap();
    let types = types.to_str().unwrap();
    let libvirt = [
        "--connect",
        "rack1=test:///default",
        "--image",
        "base.qcow2",
    ];
    let with = |extra: &[&'static str]| {
        let mut args = libvirt.to_vec();
        args.extend(["--instance-types", types]);
        args.extend_from_slice(extra);
        args
    };
    let error = refused(&with(&[]));
    assert!(
        error.contains(
            "\"kvm.small\" asks for dedicated_cpus, and --dedicated-cpus names no host CPU"
        ),
        "{error}"
    );
    let error = refused(&with(&["--dedicated-cpus", "8-4"]));
    assert!(
        error.contains("--dedicated-cpus \"8-4\": \"8-4\" runs backwards"),
        "{error}"
    );
    dry_run(&with(&["--dedicated-cpus", "4-15"]));
    let bad_page = dir.path().join("bad.json");
    std::fs::write(
        &bad_page,
        r#"{"k": {"vcpu": 1, "memory_mib": 1000, "hugepages": "1Gi"}}"#,
    )
    .unwrap();
    let error = refused(&["--instance-types", bad_page.to_str().unwrap()]);
    assert!(
        error.contains("\"k\" hugepages is \"1Gi\", and memory_mib 1000"),
        "{error}"
    );
}

/// The flags of a libvirt dry run of a type asking for one `a100`, with `extra`.
fn device_args(types: &str, extra: &[&str]) -> Vec<String> {
    let mut args = vec![
        "--connect",
        "rack1=test:///default",
        "--image",
        "base.qcow2",
        "--instance-types",
        types,
    ];
    args.extend_from_slice(extra);
    args.iter().map(|a| (*a).to_owned()).collect()
}

/// A dry run of [`device_args`] that must be refused: its one line.
fn refused_devices(types: &str, extra: &[&str]) -> String {
    let args = device_args(types, extra);
    refused(&args.iter().map(String::as_str).collect::<Vec<_>>())
}

#[test]
fn device_classes_are_checked_and_offerings_cannot_advertise_phantom_devices() {
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, text: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        path.to_str().unwrap().to_owned()
    };
    let types = write(
        "types.json",
        r#"{"gpu.1": {"vcpu": 2, "memory_mib": 2048, "devices": {"a100": 1}}}"#,
    );
    let classes = write(
        "classes.json",
        r#"{"a100": {"resource": "nvidia.com/gpu", "pci": {"vendor": "10de", "product": "20b0"}}}"#,
    );
    let offer = |resources: &str| {
        let text = format!(
            r#"[{{"instance_type": "gpu.1", "zone": "rack1", "count": 1, "resources": {resources}}}]"#
        );
        write("offerings.json", &text)
    };
    // The type's class must be declared.
    let error = refused_devices(&types, &[]);
    assert!(
        error.contains("\"gpu.1\" asks for devices of class \"a100\", which --device-classes does not declare (declared: none)"),
        "{error}"
    );
    // An offering may not advertise a GPU its machines would not hold.
    let phantom = offer(r#"{"amd.com/gpu": "1"}"#);
    let error = refused_devices(
        &types,
        &["--device-classes", &classes, "--offerings", &phantom],
    );
    assert!(
        error.contains("offering gpu.1/rack1: resources name \"amd.com/gpu\" = \"1\", but no class in --device-classes advertises it"),
        "{error}"
    );
    let more = offer(r#"{"nvidia.com/gpu": "2"}"#);
    let error = refused_devices(
        &types,
        &["--device-classes", &classes, "--offerings", &more],
    );
    assert!(error.contains("asks for 1 of class \"a100\""), "{error}");
    let bad = write(
        "bad.json",
        r#"{"a100": {"resource": "nvidia.com/gpu", "pcie": {}}}"#,
    );
    let error = refused_devices(&types, &["--device-classes", &bad]);
    assert!(
        error.contains("parse --device-classes") && error.contains("unknown field `pcie`"),
        "{error}"
    );
    let fine = offer(r#"{"nvidia.com/gpu": "1"}"#);
    let args = device_args(
        &types,
        &["--device-classes", &classes, "--offerings", &fine],
    );
    dry_run(&args.iter().map(String::as_str).collect::<Vec<_>>());
}
