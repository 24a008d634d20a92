//! `--image-source FILE` on libvirt's test driver: the binary creates the content-addressed
//! golden volume on a host that lacks it, uses a matching one as it is, and keeps a host's
//! slots out (log and `bigfleet_libvirt_golden_image`) when a same-named volume does not
//! match or the volume cannot be made. The test driver keeps no volume contents and has no
//! upload, so the bytes themselves are checked on the real-QEMU tier; here the create /
//! skip / refuse decisions are, and the `doctor` line that reports them.

use std::path::{Path, PathBuf};
use std::process::Command;

use bigfleet_libvirt_libvirt::fixture::Fixture;
use bigfleet_libvirt_libvirt::golden::{self, GoldenImage};
use bigfleet_libvirt_proto::v1alpha1 as pb;
use pb::MachineState as S;

use crate::harness::scrape::scrape_until;
use crate::harness::*;

/// A 1 MiB raw image with a recognisable pattern.
fn image_file(dir: &Path) -> (PathBuf, GoldenImage) {
    let path = dir.join("golden.img");
    let bytes: Vec<u8> = (0..(1u32 << 20)).map(|i| (i % 251) as u8).collect();
    std::fs::write(&path, bytes).unwrap();
    let image = golden::read(&path).unwrap();
    (path, image)
}

fn host(dir: &Path, fixture: Fixture) -> String {
    let fixture = Fixture {
        cpus: 32,
        memory_mib: 256 * 1024,
        ..fixture
    };
    fixture.write(dir, "node.xml").expect("write the fixture")
}

fn start(connect: &str, source: &Path) -> Server {
    let connect = format!("--connect={connect}");
    let source = format!("--image-source={}", source.display());
    Server::start(&[
        connect.as_str(),
        source.as_str(),
        "--provider=img",
        "--seed-count=4",
    ])
}

/// Waits until `bigfleet_libvirt_golden_image{zone="local",state}` is 1.
pub(crate) async fn golden_state(server: &Server, state: &str) {
    let addr = server.metrics_addr.expect("metrics address");
    scrape_until(addr, "the golden image state", |s| {
        s.value(
            "bigfleet_libvirt_golden_image",
            &[("zone", "local"), ("state", state)],
        ) == Some(1.0)
    })
    .await;
}

#[tokio::test]
async fn a_host_without_the_golden_volume_gets_it_and_offers_its_slots() {
    let dir = tempfile::tempdir().unwrap();
    let (source, image) = image_file(dir.path());
    assert!(image.volume.starts_with("golden-") && image.volume.ends_with(".img"));
    let server = start(&host(dir.path(), Fixture::default()), &source);
    golden_state(&server, "ready").await;
    let log = server.log_text();
    assert!(
        log.contains("golden image missing on the host; uploading"),
        "{log}"
    );
    assert!(
        log.contains(&image.volume),
        "the log names the volume: {log}"
    );
    let mut c = server.client().await;
    assert_eq!(
        list(&mut c, &[S::Speculative], 0, b"").await.machines.len(),
        4
    );
    // A Create finds the new volume as its overlay's base (it fails without it).
    let id = pick(&server, &mut c).await;
    create(&mut c, &id, None).await.expect("Create");
    let idle = reach(&mut c, &id, S::Idle, SETTLE).await;
    assert_eq!(idle.last_error, "");
}

#[tokio::test]
async fn a_matching_volume_is_used_as_it_is() {
    let dir = tempfile::tempdir().unwrap();
    let (source, image) = image_file(dir.path());
    let fixture = Fixture {
        base_volume: image.volume.clone(),
        base_capacity: image.capacity,
        base_format: "raw".to_owned(),
        ..Fixture::default()
    };
    let server = start(&host(dir.path(), fixture), &source);
    golden_state(&server, "ready").await;
    let log = server.log_text();
    assert!(!log.contains("uploading"), "nothing is uploaded: {log}");
    let mut c = server.client().await;
    assert_eq!(
        list(&mut c, &[S::Speculative], 0, b"").await.machines.len(),
        4
    );
}

#[tokio::test]
async fn a_same_named_volume_that_does_not_match_keeps_the_slots_out() {
    let dir = tempfile::tempdir().unwrap();
    let (source, image) = image_file(dir.path());
    let fixture = Fixture {
        base_volume: image.volume.clone(),
        base_capacity: image.capacity + 4096,
        base_format: "raw".to_owned(),
        ..Fixture::default()
    };
    let server = start(&host(dir.path(), fixture), &source);
    golden_state(&server, "mismatch").await;
    let log = server.log_text();
    assert!(log.contains("does not match --image-source"), "{log}");
    assert!(
        log.contains("virsh vol-delete"),
        "the log names the fix: {log}"
    );
    let mut c = server.client().await;
    assert_eq!(
        list_all(&mut c).await.machines.len(),
        0,
        "the host's slots are withheld"
    );
}

#[tokio::test]
async fn a_host_that_cannot_take_the_volume_keeps_its_slots_out() {
    let dir = tempfile::tempdir().unwrap();
    let (source, _) = image_file(dir.path());
    // The host has no pool of the --storage-pool name, so the volume cannot be made.
    let fixture = Fixture {
        pool: "elsewhere".to_owned(),
        ..Fixture::default()
    };
    let server = start(&host(dir.path(), fixture), &source);
    golden_state(&server, "failed").await;
    let log = server.log_text();
    assert!(log.contains("slots withheld: golden image"), "{log}");
    assert!(
        log.contains("look up storage pool \\\"default\\\""),
        "{log}"
    );
    let mut c = server.client().await;
    assert_eq!(
        list_all(&mut c).await.machines.len(),
        0,
        "the host's slots are withheld"
    );
}

#[test]
fn an_image_that_contradicts_the_source_is_refused_at_start_up() {
    let dir = tempfile::tempdir().unwrap();
    let (source, image) = image_file(dir.path());
    let connect = format!("--connect={}", host(dir.path(), Fixture::default()));
    let source_flag = format!("--image-source={}", source.display());
    let output = Command::new(binary())
        .args(["offerings", &connect, &source_flag, "--image=base.qcow2"])
        .output()
        .expect("run bigfleet-libvirt");
    assert!(!output.status.success());
    let error = String::from_utf8_lossy(&output.stderr);
    assert!(error.contains("contradicts --image-source"), "{error}");
    assert!(
        error.contains(&image.volume),
        "names the volume to use: {error}"
    );
    let same = format!("--image={}", image.volume);
    let output = Command::new(binary())
        .args(["offerings", &connect, &source_flag, &same])
        .output()
        .expect("run bigfleet-libvirt");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let missing = Command::new(binary())
        .args([
            "offerings",
            &connect,
            "--image-source=/nonexistent/golden.qcow2",
        ])
        .output()
        .expect("run bigfleet-libvirt");
    assert!(!missing.status.success());
    let error = String::from_utf8_lossy(&missing.stderr);
    assert!(
        error.contains("--image-source /nonexistent/golden.qcow2"),
        "{error}"
    );
}

/// `doctor --output json` with `--image-source`: its exit code and `image-source` check.
fn doctor_check(connect: &str, source: &Path) -> (i32, serde_json::Value) {
    // Types of a 1 GiB root, so the test driver's 100 GiB pool holds every disk written full.
    let types = source.with_file_name("doctor-types.json");
    let small = r#"{"t.small": {"vcpu": 1, "memory_mib": 512, "disk_gib": 1}}"#;
    std::fs::write(&types, small).unwrap();
    let output = Command::new(binary())
        .arg(format!("--instance-types={}", types.display()))
        .arg("doctor")
        .arg("--output=json")
        .arg(format!("--connect={connect}"))
        .arg(format!("--image-source={}", source.display()))
        .arg("--seed-count=4")
        .env_remove("RUST_LOG")
        .output()
        .expect("run bigfleet-libvirt doctor");
    let text = String::from_utf8_lossy(&output.stdout);
    let report: serde_json::Value = serde_json::from_str(&text).unwrap_or_else(|e| {
        panic!("doctor printed no JSON ({e}): {text}");
    });
    let check = report["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["zone"] == "local" && c["check"] == "image-source")
        .unwrap_or_else(|| panic!("no image-source check: {report}"))
        .clone();
    (output.status.code().expect("an exit code"), check)
}

#[test]
fn doctor_reports_the_golden_volume_to_upload_and_blocks_on_a_mismatch() {
    let dir = tempfile::tempdir().unwrap();
    let (source, image) = image_file(dir.path());
    let (code, check) = doctor_check(&host(dir.path(), Fixture::default()), &source);
    assert_eq!(
        code, 0,
        "a missing volume is uploaded on connect, nothing blocks: {check}"
    );
    assert_eq!(check["status"], "ok", "{check}");
    let detail = check["detail"].as_str().unwrap();
    assert!(
        detail.contains(&image.volume) && detail.contains("uploads"),
        "{check}"
    );
    let mismatched = Fixture {
        base_volume: image.volume.clone(),
        base_capacity: image.capacity * 2,
        base_format: "raw".to_owned(),
        ..Fixture::default()
    };
    let (code, check) = doctor_check(&host(dir.path(), mismatched), &source);
    assert_eq!(code, 1, "{check}");
    assert_eq!(check["status"], "block", "{check}");
    assert!(
        check["detail"].as_str().unwrap().contains("does not match"),
        "{check}"
    );
    assert!(
        check["fix"].as_str().unwrap().contains("virsh vol-delete"),
        "{check}"
    );
    let matching = Fixture {
        base_volume: image.volume.clone(),
        base_capacity: image.capacity,
        base_format: "raw".to_owned(),
        ..Fixture::default()
    };
    let (code, check) = doctor_check(&host(dir.path(), matching), &source);
    assert_eq!(code, 0, "{check}");
    assert!(
        check["detail"].as_str().unwrap().contains("matches"),
        "{check}"
    );
}

#[test]
fn a_served_type_whose_root_cannot_hold_the_image_is_refused_at_start_up() {
    let dir = tempfile::tempdir().unwrap();
    // A qcow2 header whose virtual size is 50 GiB (the size field is bytes 24..32).
    let mut header = vec![0u8; 512];
    header[..4].copy_from_slice(b"QFI\xfb");
    header[24..32].copy_from_slice(&(50u64 << 30).to_be_bytes());
    let source = dir.path().join("big.qcow2");
    std::fs::write(&source, header).unwrap();
    let types = dir.path().join("types.json");
    let shape =
        |gib: u32| format!(r#"{{"t.node": {{"vcpu": 1, "memory_mib": 512, "disk_gib": {gib}}}}}"#);
    let connect = format!("--connect={}", host(dir.path(), Fixture::default()));
    let run = |gib: u32| {
        std::fs::write(&types, shape(gib)).unwrap();
        Command::new(binary())
            .args(["offerings", &connect, "--seed-count=1"])
            .arg(format!("--image-source={}", source.display()))
            .arg(format!("--instance-types={}", types.display()))
            .output()
            .expect("run bigfleet-libvirt")
    };
    let refused = run(20);
    assert!(!refused.status.success());
    let error = String::from_utf8_lossy(&refused.stderr);
    for part in [
        "instance type \"t.node\" has a 20 GiB root disk (disk_gib)",
        "53687091200 bytes (50 GiB rounded up)",
        "set its disk_gib to at least 50",
    ] {
        assert!(error.contains(part), "{part}: {error}");
    }
    let fits = run(50);
    assert!(
        fits.status.success(),
        "{}",
        String::from_utf8_lossy(&fits.stderr)
    );
}
