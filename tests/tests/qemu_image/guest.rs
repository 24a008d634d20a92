//! Reading the real image's guest through its agent: commands (`guest-exec`), files, and the
//! checks on cloud-init, the bootstrap join unit and the drain hook.

use std::time::Duration;

use serde_json::{Value, json};
use virt::domain::Domain;

use super::{BOOT, STANDARD};
use crate::qemu_zones::until_explained;
use base64::Engine as _;

/// Sends one guest-agent command and returns its `return` value.
pub fn agent(domain: &Domain, command: &Value) -> Result<Value, String> {
    let reply = domain
        .qemu_agent_command(&command.to_string(), 30, 0)
        .map_err(|e| e.to_string())?;
    let mut value: Value = serde_json::from_str(&reply).map_err(|e| e.to_string())?;
    Ok(value["return"].take())
}

/// What a command run through `guest-exec` did.
#[derive(Debug)]
pub struct Exec {
    pub code: i64,
    pub stdout: String,
    pub stderr: String,
}

fn decoded(status: &Value, field: &str) -> String {
    let data = status[field].as_str().unwrap_or_default();
    String::from_utf8_lossy(&STANDARD.decode(data).unwrap_or_default()).into_owned()
}

/// How long one command in the guest may take: `cloud-init status` (Python) under TCG on a
/// busy 2-core host takes tens of seconds.
const EXEC: Duration = Duration::from_secs(180);

/// Runs `/bin/sh -c script` in the guest and waits (up to [`EXEC`]) for it to exit.
pub fn sh(domain: &Domain, script: &str) -> Result<Exec, String> {
    let started = agent(
        domain,
        &json!({"execute": "guest-exec", "arguments": {
            "path": "/bin/sh", "arg": ["-c", script], "capture-output": true}}),
    )?;
    let pid = started["pid"]
        .as_i64()
        .ok_or("guest-exec returned no pid")?;
    let deadline = std::time::Instant::now() + EXEC;
    loop {
        let status = agent(
            domain,
            &json!({"execute": "guest-exec-status", "arguments": {"pid": pid}}),
        )?;
        if status["exited"].as_bool() == Some(true) {
            return Ok(Exec {
                code: status["exitcode"].as_i64().unwrap_or(-1),
                stdout: decoded(&status, "out-data"),
                stderr: decoded(&status, "err-data"),
            });
        }
        if std::time::Instant::now() > deadline {
            return Err(format!("{script:?} did not exit within {EXEC:?}"));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `sh` that must succeed; returns its stdout.
pub fn run(domain: &Domain, script: &str) -> String {
    let exec = sh(domain, script).unwrap_or_else(|e| panic!("guest-exec {script:?}: {e}"));
    assert_eq!(
        exec.code, 0,
        "{script:?} in the guest failed: {}",
        exec.stderr
    );
    exec.stdout
}

/// A JSON file in the guest, read through the agent.
pub fn json_file(domain: &Domain, path: &str) -> Value {
    let text = run(domain, &format!("cat {path}"));
    serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("{path} in the guest is not JSON ({e}): {text}"))
}

/// Waits until `cloud-init status --format json` says `done` for the NoCloud datasource
/// (failing at once on `error`).
pub async fn cloud_init_done(domain: &Domain, name: &str) {
    let last = std::cell::RefCell::new(Value::Null);
    until_explained(&format!("cloud-init done in {name}"), BOOT, || {
        let exec = sh(domain, "cloud-init status --format json")?;
        let status: Value = serde_json::from_str(&exec.stdout)
            .map_err(|e| format!("status is not JSON ({e}): {exec:?}"))?;
        let state = status["status"].as_str().map(str::to_owned);
        *last.borrow_mut() = status;
        match state.as_deref() {
            Some("done") => Ok(()),
            Some("error") => panic!("cloud-init failed in {name}: {:#}", last.borrow()),
            other => Err(format!("status {other:?}")),
        }
    })
    .await;
    let status = last.into_inner();
    let datasource = status["datasource"].as_str().unwrap_or_default();
    assert_eq!(
        datasource, "nocloud",
        "cloud-init read the provider's NoCloud seed: {status:#}"
    );
    assert_eq!(
        status["errors"],
        json!([]),
        "no cloud-init errors: {status:#}"
    );
    let instance = run(domain, "cat /var/lib/cloud/data/instance-id");
    assert!(
        instance.trim().starts_with(name),
        "the instance-id is the domain name and the Create's operation id: {instance:?}"
    );
}

/// The instance-id cloud-init ran with.
pub fn instance_id(domain: &Domain) -> String {
    run(domain, "cat /var/lib/cloud/data/instance-id")
        .trim()
        .to_owned()
}

/// The bootstrap hook handed the join to systemd: bigfleet-join.service ran (and stays
/// active) and recorded the Configure's cluster id and the blob's digest.
pub fn assert_joined(domain: &Domain, cluster: &str, blob_sha256: &str) {
    let joined = json_file(domain, "/var/lib/bigfleet/bootstrap.json");
    assert_eq!(joined["cluster_id"], cluster, "{joined}");
    assert_eq!(joined["blob_sha256"], blob_sha256, "{joined}");
    assert_eq!(joined["unit"], "bigfleet-join.service", "{joined}");
    let unit = run(
        domain,
        "systemctl show -p ActiveState -p InvocationID bigfleet-join.service; cat /proc/1/comm",
    );
    let invocation = joined["invocation_id"].as_str().unwrap_or_default();
    assert!(
        !invocation.is_empty(),
        "systemd ran the join (it has an invocation id): {joined}"
    );
    assert!(unit.contains("ActiveState=active"), "{unit}");
    assert!(
        unit.contains(&format!("InvocationID={invocation}")),
        "{unit} vs {joined}"
    );
    assert!(
        unit.trim_end().ends_with("systemd"),
        "PID 1 is systemd: {unit}"
    );
    let blob = sh(domain, "test -e /opt/bigfleet/bootstrap.blob").unwrap();
    assert_ne!(
        blob.code, 0,
        "the provider removed the blob once the hook ended"
    );
}

/// The drain hook ran with the grace period and stopped the join unit.
pub fn assert_drained(domain: &Domain, grace: u64) {
    let drained = json_file(domain, "/var/lib/bigfleet/drain.json");
    assert_eq!(drained["grace_seconds"], grace, "{drained}");
    assert_eq!(drained["join_unit"], "inactive", "{drained}");
}

/// Secure Boot and the virtual TPM, as the guest sees them: the firmware's `SecureBoot`
/// variable (through efivarfs: four bytes of attributes, then the value) is 1, the kernel
/// runs in lockdown as Secure Boot makes it, and the TPM is at `/dev/tpm0` and
/// `/dev/tpmrm0`. Returns the host's files that must go with the domain: its NVRAM and its
/// TPM state (both there now, as the zone at `root` holds them).
pub fn assert_secure(
    domain: &Domain,
    root: &std::path::Path,
    name: &str,
) -> Vec<std::path::PathBuf> {
    const VARIABLE: &str =
        "/sys/firmware/efi/efivars/SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c";
    let value = run(domain, &format!("od -An -tu1 {VARIABLE}"));
    let bytes: Vec<&str> = value.split_whitespace().collect();
    println!("cloud_image: {name}: SecureBoot variable {bytes:?}");
    assert_eq!(
        bytes.last(),
        Some(&"1"),
        "Secure Boot is on in {name}: {value}"
    );
    let lockdown = run(
        domain,
        "cat /sys/kernel/security/lockdown 2>/dev/null || true",
    );
    println!("cloud_image: {name}: kernel lockdown {}", lockdown.trim());
    let tpm = run(
        domain,
        "test -c /dev/tpmrm0 && cat /sys/class/tpm/tpm0/tpm_version_major",
    );
    assert_eq!(tpm.trim(), "2", "{name} sees its TPM 2.0");
    let xml = domain.xml_desc(0).expect("the domain's XML");
    let nvram = xml
        .split("<nvram")
        .nth(1)
        .and_then(|rest| rest.split('>').nth(1))
        .and_then(|rest| rest.split('<').next())
        .unwrap_or_else(|| panic!("{name} has an NVRAM file: {xml}"));
    let uuid = domain.uuid_string().expect("the domain's UUID");
    let files = vec![
        root.join(nvram.trim_start_matches('/')),
        root.join(format!("var/lib/libvirt/swtpm/{uuid}")),
    ];
    for file in &files {
        assert!(file.exists(), "{name} has {}", file.display());
    }
    files
}
