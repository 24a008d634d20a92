//! The chart's optional `doctor` hook Job: off by default; when on, a pre-install and
//! pre-upgrade hook that runs `doctor` with exactly the Deployment's flags, brings its own
//! copies of the file ConfigMaps (hooks run before the release's objects exist), and, run
//! through the real binary against a libvirt test-driver host, passes on a good host and
//! fails on a blocking one.

use std::path::Path;
use std::process::{Command, Output};

use bigfleet_libvirt_libvirt::fixture::Fixture;
use serde_json::Value;

use crate::deploy::{Manifests, Tools, tools};
use crate::harness::binary;
use crate::harness::skip;

const JOB: &str = "bigfleet-libvirt-dc1-doctor";
const OFFERINGS: &str = r#"[{"instance_type": "kvm.small", "zone": "a", "count": 2}]"#;

fn strings(value: &Value) -> Vec<String> {
    value
        .as_array()
        .unwrap_or_else(|| panic!("not a list: {value}"))
        .iter()
        .map(|v| v.as_str().unwrap().to_owned())
        .collect()
}

#[test]
fn the_doctor_hook_is_off_by_default() {
    let Some(tools) = skip::needs(skip::DEPLOY_TOOLS, tools()) else {
        return;
    };
    let m = tools.render(&[]);
    assert!(m.find("Job", JOB).is_none(), "no hook Job unless asked for");
}

/// The chart rendered with the hook on, `connect=a=<uri>`, the test fixture's image and
/// the offerings file at `offerings`.
fn render(tools: &Tools, uri: &str, offerings: &str, extra: &[&str]) -> Manifests {
    let connect = format!("connect=a={uri}");
    let file = format!("offerings.content={offerings}");
    let mut args = vec![
        "--set",
        "doctor.hook.enabled=true",
        "--set",
        connect.as_str(),
        "--set",
        "libvirt.image=base.qcow2",
        "--set-file",
        file.as_str(),
    ];
    args.extend_from_slice(extra);
    tools.render(&args)
}

fn job(m: &Manifests) -> &Value {
    m.find("Job", JOB).expect("the hook Job")
}

fn job_args(m: &Manifests) -> Vec<String> {
    strings(&job(m)["spec"]["template"]["spec"]["containers"][0]["args"])
}

/// Runs the Job's command through the real binary, with the in-pod offerings file mapped.
fn run(args: &[String], offerings: &str) -> Output {
    let mapped: Vec<String> = args
        .iter()
        .map(|a| a.replace("/etc/bigfleet/offerings/offerings.json", offerings))
        .collect();
    let mut command = Command::new(binary());
    command.args(&mapped);
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("BIGFLEET_LIBVIRT_") {
            command.env_remove(name);
        }
    }
    command.output().expect("run the hook's command")
}

fn offerings_file(dir: &Path) -> String {
    let offerings = dir.join("offerings.json");
    std::fs::write(&offerings, OFFERINGS).unwrap();
    offerings.to_str().unwrap().to_owned()
}

#[test]
fn the_doctor_hook_checks_the_deployments_flags_before_install_and_upgrade() {
    let Some(tools) = skip::needs(skip::DEPLOY_TOOLS, tools()) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let good = Fixture::default().write(dir.path(), "good.xml").unwrap();
    let m = render(tools, &good, &offerings_file(dir.path()), &[]);
    let hook = |object: &Value| object["metadata"]["annotations"]["helm.sh/hook"].clone();
    assert_eq!(hook(job(&m)), "pre-install,pre-upgrade");
    assert_eq!(
        job(&m)["spec"]["backoffLimit"],
        0,
        "a failed check is not retried"
    );
    let pod = &job(&m)["spec"]["template"]["spec"];
    assert_eq!(pod["restartPolicy"], "Never");
    assert_eq!(pod["automountServiceAccountToken"], false);
    assert!(
        pod["serviceAccountName"].is_null(),
        "the release's ServiceAccount does not exist yet at pre-install"
    );
    let copy = m
        .find("ConfigMap", "bigfleet-libvirt-dc1-doctor-offerings")
        .expect("the hook's own offerings ConfigMap");
    assert_eq!(hook(copy), "pre-install,pre-upgrade");
    let weight = |object: &Value| {
        object["metadata"]["annotations"]["helm.sh/hook-weight"]
            .as_str()
            .unwrap()
            .parse::<i32>()
            .unwrap()
    };
    assert!(
        weight(copy) < weight(job(&m)),
        "the ConfigMap exists before the Job"
    );
    let mut expected = vec!["doctor".to_owned(), "--allow-warnings".to_owned()];
    expected.extend(m.args());
    assert_eq!(
        job_args(&m),
        expected,
        "doctor checks exactly the flags the Deployment serves with"
    );
    let mounts = pod["containers"][0]["volumeMounts"].as_array().unwrap();
    assert!(
        mounts
            .iter()
            .any(|v| v["mountPath"] == "/etc/bigfleet/offerings" && v["readOnly"] == true),
        "{mounts:?}"
    );
}

#[test]
fn the_doctor_hooks_command_passes_a_good_host_and_fails_a_blocked_one() {
    let Some(tools) = skip::needs(skip::DEPLOY_TOOLS, tools()) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let offerings = offerings_file(dir.path());
    let good = Fixture::default().write(dir.path(), "good.xml").unwrap();
    let output = run(
        &job_args(&render(tools, &good, &offerings, &[])),
        &offerings,
    );
    assert_eq!(
        output.status.code(),
        Some(0),
        "the hook passes on a good host:\n{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    let broken = Fixture {
        base_volume: "other.qcow2".to_owned(),
        ..Fixture::default()
    }
    .write(dir.path(), "broken.xml")
    .unwrap();
    let strict = ["--set", "doctor.hook.failOnWarnings=true"];
    let args = job_args(&render(tools, &broken, &offerings, &strict));
    assert!(!args.contains(&"--allow-warnings".to_owned()), "{args:?}");
    let output = run(&args, &offerings);
    assert_eq!(output.status.code(), Some(1), "a blocker fails the hook");
    let table = String::from_utf8_lossy(&output.stdout);
    assert!(
        table.contains("virsh vol-upload"),
        "the Job's log names the fix: {table}"
    );
}
