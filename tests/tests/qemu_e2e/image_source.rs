//! `--image-source` on the real-QEMU tier's libvirtd: a host without the golden volume gets
//! it uploaded (byte-identical, checked by downloading it over a libvirt stream apart from
//! the provider), a Create boots a guest whose overlay is backed by it, a second start finds
//! it and uploads nothing, and a same-named volume that does not match keeps the host's
//! slot out with the reason in the log and in `bigfleet_libvirt_golden_image`, as does one
//! that an interrupted upload left with the right name and size but not the file's bytes.
//!
//! The source file is a copy of the tier's own golden image, so its content-addressed name
//! is new to the host while its bytes are a disk the tier's guests boot with.

use std::path::Path;

use bigfleet_libvirt_libvirt::golden::{self, GoldenImage};
use bigfleet_libvirt_proto::v1alpha1 as pb;
use pb::MachineState as S;
use virt::storage_vol::StorageVol;
use virt::stream::Stream;

use super::full_pool::TinyPool;
use super::{BOOT, Libvirt, Tier, domain_name};
use crate::harness::*;
use crate::image_source::golden_state;

/// The tier provider's flags with `--image-source` instead of `--image`.
fn flags(tier: &Tier, dir: &Path, source: &Path) -> Vec<String> {
    let mut args: Vec<String> = tier
        .flags(dir, "e2e-img", "qemu")
        .into_iter()
        .filter(|a| !a.starts_with("--image="))
        .collect();
    args.push(format!("--image-source={}", source.display()));
    args
}

fn start(args: &[String]) -> Server {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    Server::start(&args)
}

/// Starts the provider on `source` and checks the host's slot is withheld as a mismatch,
/// with `reason` in the log.
async fn withheld_as_mismatch(tier: &Tier, dir: &Path, source: &Path, reason: &str) {
    let server = start(&flags(tier, dir, source));
    golden_state(&server, "mismatch").await;
    let log = server.log_text();
    assert!(log.contains(reason), "{log}");
    let mut c = server.client().await;
    assert_eq!(
        list_all(&mut c).await.machines.len(),
        0,
        "the slot is withheld"
    );
}

/// Deletes a volume left by an earlier run, if any.
fn forget(lv: &Libvirt, name: &str) {
    if let Ok(volume) = lv.pool().lookup_storage_vol_by_name(name) {
        volume.delete(0).expect("delete a leftover volume");
    }
}

/// The volume's bytes, downloaded over a libvirt stream.
fn download(lv: &Libvirt, name: &str) -> Vec<u8> {
    let volume = lv
        .pool()
        .lookup_storage_vol_by_name(name)
        .expect("the uploaded volume");
    let stream = Stream::new(&lv.conn, 0).expect("a stream");
    volume
        .download(&stream, 0, 0, 0)
        .expect("start the download");
    let (mut bytes, mut buffer) = (Vec::new(), vec![0u8; 1 << 20]);
    loop {
        let n = stream.recv(&mut buffer).expect("receive");
        if n <= 0 {
            break;
        }
        bytes.extend_from_slice(&buffer[..n.unsigned_abs()]);
    }
    stream.finish().expect("finish the download");
    bytes
}

/// A Create boots a guest whose overlay's backing store is the uploaded volume.
async fn boots_from(lv: &Libvirt, server: &Server, c: &mut Client, image: &GoldenImage) {
    let id = pick(server, c).await;
    create(c, &id, None).await.expect("Create accepted");
    let idle = reach(c, &id, S::Idle, BOOT).await;
    let domain = domain_name(&idle);
    let overlay = lv
        .pool()
        .lookup_storage_vol_by_name(&format!("{domain}-overlay.qcow2"))
        .expect("the overlay");
    let overlay_xml = overlay.xml_desc(0).unwrap();
    let golden_path = lv
        .pool()
        .lookup_storage_vol_by_name(&image.volume)
        .unwrap()
        .path()
        .unwrap();
    assert!(overlay_xml.contains(&golden_path), "{overlay_xml}");
    delete(c, &id, None).await.expect("Delete accepted");
    reach(c, &id, S::Speculative, BOOT).await;
}

/// A same-named volume that does not match keeps the slot out.
async fn a_mismatch_keeps_the_slot_out(tier: &Tier, lv: &Libvirt, dir: &Path) {
    let other = dir.join("other.img");
    std::fs::write(&other, vec![7u8; 1 << 20]).unwrap();
    let other_image = golden::read(&other).unwrap();
    forget(lv, &other_image.volume);
    let wrong = format!(
        "<volume><name>{}</name><capacity unit='bytes'>4096</capacity>\
         <target><format type='raw'/></target></volume>",
        other_image.volume
    );
    StorageVol::create_xml(&lv.pool(), &wrong, 0).expect("create the mismatching volume");
    withheld_as_mismatch(tier, dir, &other, "does not match --image-source").await;
    forget(lv, &other_image.volume);
}

/// A volume with the right name, format and size but only half the file's bytes (what an
/// upload cut off by a crash leaves) is read back, found wrong, and keeps the slot out.
async fn an_interrupted_upload_is_not_taken_for_the_image(tier: &Tier, lv: &Libvirt, dir: &Path) {
    let source = dir.join("interrupted.img");
    let bytes: Vec<u8> = (0..(1u32 << 20)).map(|i| (i % 251) as u8).collect();
    std::fs::write(&source, &bytes).unwrap();
    let image = golden::read(&source).unwrap();
    forget(lv, &image.volume);
    let xml = format!(
        "<volume><name>{}</name><capacity unit='bytes'>{}</capacity>\
         <allocation unit='bytes'>0</allocation><target><format type='raw'/></target></volume>",
        image.volume, image.bytes
    );
    let volume = StorageVol::create_xml(&lv.pool(), &xml, 0).expect("create the volume");
    let half = bytes.len() / 2;
    let stream = Stream::new(&lv.conn, 0).unwrap();
    volume
        .upload(&stream, 0, half as u64, 0)
        .expect("start the upload");
    let mut sent = 0;
    while sent < half {
        sent += stream.send(&bytes[sent..half]).unwrap().unsigned_abs();
    }
    stream.finish().expect("finish the half upload");
    withheld_as_mismatch(tier, dir, &source, "an upload cut off by a crash").await;
    forget(lv, &image.volume);
}

#[tokio::test]
#[ignore = "needs the real-QEMU tier: run scripts/qemu-tier/run.sh ci"]
async fn image_source_uploads_once_boots_from_it_and_refuses_a_mismatch() {
    let tier = Tier::from_env();
    let lv = Libvirt::open(Tier::from_env());
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("tier-golden.qcow2");
    let original = lv.image_bytes();
    std::fs::write(&source, &original).unwrap();
    let image: GoldenImage = golden::read(&source).unwrap();
    forget(&lv, &image.volume);
    println!(
        "source {} bytes, virtual size {}, volume {}",
        image.bytes, image.capacity, image.volume
    );

    // First start: the volume is missing, so it is created and uploaded.
    let started = std::time::Instant::now();
    let server = start(&flags(&tier, dir.path(), &source));
    golden_state(&server, "ready").await;
    println!("uploaded and ready after {:?}", started.elapsed());
    let log = server.log_text();
    assert!(log.contains("golden image uploaded"), "{log}");
    assert!(lv.volumes().contains(&image.volume), "{:?}", lv.volumes());
    let downloaded = download(&lv, &image.volume);
    assert_eq!(downloaded.len(), original.len());
    assert!(
        downloaded == original,
        "the uploaded volume is byte-identical to the file"
    );

    let mut c = server.client().await;
    boots_from(&lv, &server, &mut c, &image).await;
    drop(c);
    drop(server);

    // Second start: the volume is there and matches, nothing is uploaded.
    let server = start(&flags(&tier, dir.path(), &source));
    golden_state(&server, "ready").await;
    let log = server.log_text();
    assert!(!log.contains("uploading"), "no second upload: {log}");
    let mut c = server.client().await;
    assert_eq!(
        list(&mut c, &[S::Speculative], 0, b"").await.machines.len(),
        1
    );
    drop(c);
    drop(server);

    a_mismatch_keeps_the_slot_out(&tier, &lv, dir.path()).await;
    an_interrupted_upload_is_not_taken_for_the_image(&tier, &lv, dir.path()).await;
    forget(&lv, &image.volume);
}

/// The two ways a failed write shows: libvirt reports it (at a send or at finish), or libvirt
/// 9.0 loses it (when the daemon learns of it only at finish) and the volume, read back,
/// gives it away.
const REASONS: [&str; 2] = [
    "No space left on device",
    "libvirt reported the upload finished, but the volume holds",
];

/// An upload of `bytes` into the tiny pool fails, and the slot stays out with the reason
/// logged and no partial volume left.
async fn an_upload_that_does_not_fit(tier: &Tier, lv: &Libvirt, bytes: usize) {
    let dir = tempfile::tempdir().unwrap();
    let tiny = TinyPool::make(lv, "64k");
    let source = dir.path().join("big.img");
    std::fs::write(&source, vec![0x5au8; bytes]).unwrap();
    let image = golden::read(&source).unwrap();
    let mut args = flags(tier, dir.path(), &source);
    args.retain(|a| !a.starts_with("--storage-pool="));
    args.push(format!("--storage-pool={}", TinyPool::NAME));
    let server = start(&args);
    golden_state(&server, "failed").await;
    let log = server.log_text();
    assert!(log.contains("slots withheld: golden image"), "{log}");
    let line = log
        .lines()
        .find(|l| l.contains("upload to pool"))
        .unwrap_or_default();
    println!("{bytes} bytes: the reason logged: {line}");
    assert!(REASONS.iter().any(|r| line.contains(r)), "{log}");
    assert!(line.contains("the partial volume was deleted"), "{line}");
    let mut c = server.client().await;
    assert_eq!(
        list_all(&mut c).await.machines.len(),
        0,
        "the slot is withheld"
    );
    let left = tiny.volumes();
    assert!(
        !left.contains(&image.volume),
        "the partial volume is deleted: {left:?}"
    );
    drop(c);
    drop(server);
    drop(tiny);
}

#[tokio::test]
#[ignore = "needs the real-QEMU tier: run scripts/qemu-tier/run.sh ci"]
async fn image_source_upload_failure_keeps_the_slot_out() {
    let tier = Tier::from_env();
    let lv = Libvirt::open(Tier::from_env());
    // Many stream packets: mostly a later send, or finish, reports the failed write.
    an_upload_that_does_not_fit(&tier, &lv, 2 << 20).await;
    // One packet (256 KiB): on libvirt 9.0 mostly reported finished though its write failed.
    an_upload_that_does_not_fit(&tier, &lv, 200 << 10).await;
}
