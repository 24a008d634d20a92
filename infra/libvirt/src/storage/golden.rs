//! Golden-image distribution (`--image-source FILE`): the provider, not the operator, puts
//! the base image on every host.
//!
//! The volume name is content-addressed — `<file stem>-<first 16 hex of the sha256>.<ext>` —
//! so a new image file is a new volume and the overlays of running machines keep the base
//! they were made from. A volume is never overwritten: when one of that name exists it is
//! checked (format and virtual size; the name already carries the content hash, and
//! downloading gigabytes on every reconnect to re-hash them is not cheap) and, when it does
//! not match, the host is refused. When it is missing it is created in `--storage-pool` and
//! the file is streamed up (libvirt volume upload) and, since libvirt can report a failed
//! write as a finished upload, checked ([`readback`]); a failed upload deletes the volume it
//! made, so no half-written base is ever left to be taken for a good one.
//!
//! [`GoldenGate`] is the host's [`Gate`]: `host` runs it on every (re)connect before the
//! session is installed, so a host whose golden image is not in order never offers slots.

use std::fs::File;
use std::io::{self, Read};
use std::path::Path;

use sha2::{Digest, Sha256};
use tracing::info;
use virt::connect::Connect;
use virt::storage_vol::StorageVol;
use virt::stream::Stream;

use std::sync::Arc;

use crate::host::error::{is_missing_volume, text};
use crate::host::gate::{Ensured, Gate, Refusal};
use crate::render::ownership::escape;
use crate::render::rbd::PoolKind;
use crate::render::xml;
use crate::storage::golden_rbd;
use crate::storage::readback::{self, Content, hex};

pub use crate::options::GoldenImage;

/// Upload chunk size.
const CHUNK: usize = 1 << 20;

/// Progress is logged every this many bytes.
const PROGRESS_EVERY: u64 = 256 << 20;

/// Reads and hashes the file.
///
/// # Errors
/// When it cannot be read, or is neither qcow2 nor a non-empty raw image.
pub fn read(path: &Path) -> Result<GoldenImage, String> {
    let name = format!("--image-source {}", path.display());
    let mut file = File::open(path).map_err(|e| format!("{name}: {e}"))?;
    let mut hasher = Sha256::new();
    let mut head = Vec::with_capacity(32);
    let mut bytes = 0u64;
    let mut buffer = vec![0u8; CHUNK];
    loop {
        let n = file.read(&mut buffer).map_err(|e| format!("{name}: {e}"))?;
        if n == 0 {
            break;
        }
        if head.len() < 32 {
            let take = (32 - head.len()).min(n);
            head.extend_from_slice(&buffer[..take]);
        }
        hasher.update(&buffer[..n]);
        bytes += n as u64;
    }
    if bytes == 0 {
        return Err(format!(
            "{name} is empty; point it at a qcow2 or raw golden image"
        ));
    }
    let (format, capacity) = if head.starts_with(b"QFI\xfb") {
        let size = head.get(24..32).ok_or_else(|| {
            format!("{name}: truncated qcow2 header; the file is not a usable image")
        })?;
        let mut be = [0u8; 8];
        be.copy_from_slice(size);
        ("qcow2", u64::from_be_bytes(be))
    } else {
        ("raw", bytes)
    };
    let sha256 = hex(&hasher.finalize());
    Ok(GoldenImage {
        path: path.to_owned(),
        volume: volume_name(path, format, &sha256),
        format: format.to_owned(),
        bytes,
        capacity,
        sha256,
    })
}

/// `<stem>-<first 16 hex>.<ext>`; the extension is the file's, or the format when it has none.
fn volume_name(path: &Path, format: &str, sha256: &str) -> String {
    let stem = path
        .file_stem()
        .and_then(|s| s.to_str())
        .filter(|s| !s.is_empty())
        .unwrap_or("golden");
    let ext = path
        .extension()
        .and_then(|s| s.to_str())
        .filter(|s| !s.is_empty())
        .unwrap_or(format);
    format!("{stem}-{}.{ext}", &sha256[..16])
}

/// `--image-source` on every host: the image, and the pool it goes to (`--storage-pool`).
pub(crate) struct GoldenGate {
    /// The image file and its volume.
    pub(crate) image: Arc<GoldenImage>,
    /// The storage pool it goes to.
    pub(crate) pool: String,
    /// `--seed-pool`, resolved: where the file is staged for an rbd storage pool.
    pub(crate) seed_pool: String,
    /// One upload at a time per Ceph cluster, across the hosts that share it.
    pub(crate) clusters: golden_rbd::ClusterLocks,
}

impl Gate for GoldenGate {
    fn check(&self, conn: &Connect, test_driver: bool, zone: &str) -> Result<Ensured, Refusal> {
        let rbd = (conn.lookup_storage_pool_by_name(&self.pool).ok())
            .and_then(|pool| crate::storage::volumes::pool_kind(&pool, &self.pool).ok());
        let Some(PoolKind::Rbd(source)) = rbd else {
            return ensure(conn, test_driver, zone, &self.pool, &self.image);
        };
        if self.seed_pool == self.pool {
            return Err(Refusal::Failed(format!(
                "golden image {}: storage pool {:?} is an rbd pool; --image-source stages the \
                 file in a local pool first: name a dir pool with --seed-pool",
                self.image.volume, self.pool
            )));
        }
        let target = golden_rbd::Target {
            zone,
            pool: &self.pool,
            source: &source,
            staging: &self.seed_pool,
        };
        golden_rbd::ensure(conn, test_driver, &target, &self.clusters, &self.image)
    }
}

/// Makes sure `pool_name` holds the golden volume: checks an existing one, or creates it and
/// uploads the file. `test_driver` hosts keep no volume contents and cannot stream, so there
/// the volume is created and the upload skipped.
pub(crate) fn ensure(
    conn: &Connect,
    test_driver: bool,
    zone: &str,
    pool_name: &str,
    golden: &GoldenImage,
) -> Result<Ensured, Refusal> {
    let name = &golden.volume;
    let pool = conn.lookup_storage_pool_by_name(pool_name).map_err(|e| {
        Refusal::Failed(format!(
            "golden image {name}: look up storage pool {pool_name:?}: {}",
            text(&e)
        ))
    })?;
    let _ = pool.refresh(0);
    match pool.lookup_storage_vol_by_name(name) {
        Ok(volume) => {
            return check(conn, test_driver, &volume, pool_name, golden).map(|()| Ensured::Present);
        }
        Err(e) if is_missing_volume(&e) => {}
        Err(e) => {
            return Err(Refusal::Failed(format!(
                "golden image {name}: look up the volume in pool {pool_name:?}: {}",
                text(&e)
            )));
        }
    }
    info!(zone, volume = %name, pool = pool_name, bytes = golden.bytes, "golden image missing on the host; uploading --image-source");
    let volume = StorageVol::create_xml(&pool, &volume_xml(golden), 0).map_err(|e| {
        Refusal::Failed(format!(
            "golden image {name}: create the volume in pool {pool_name:?}: {}",
            text(&e)
        ))
    })?;
    if !test_driver {
        let uploaded = upload(conn, &volume, zone, golden).and_then(|()| {
            let _ = pool.refresh(0);
            written(conn, &volume, golden)
        });
        if let Err(e) = uploaded {
            let cleanup = match volume.delete(0) {
                Ok(()) => "the partial volume was deleted".to_owned(),
                Err(d) => format!("deleting the partial volume failed too: {}", text(&d)),
            };
            return Err(Refusal::Failed(format!(
                "golden image {name}: upload to pool {pool_name:?} failed: {e} ({cleanup}); \
                 check the pool's free space and that the host accepts volume uploads"
            )));
        }
    }
    info!(zone, volume = %name, bytes = golden.bytes, "golden image uploaded");
    Ok(Ensured::Uploaded)
}

/// The volume document: the file's format, its virtual size, thin.
fn volume_xml(golden: &GoldenImage) -> String {
    format!(
        "<volume><name>{}</name><capacity unit='bytes'>{}</capacity>\
         <allocation unit='bytes'>0</allocation><target><format type='{}'/></target></volume>",
        escape(&golden.volume),
        golden.capacity,
        escape(&golden.format)
    )
}

/// An existing volume must have the file's format and virtual size. One that holds fewer
/// bytes on disk than the file (what an upload cut off by a crash leaves) must also have the
/// file's content: it is downloaded and hashed, so a partial upload is never taken for the
/// image. A volume that holds at least the file's bytes is trusted by its content-addressed
/// name (hashing every golden image on every connect would download gigabytes).
fn check(
    conn: &Connect,
    test_driver: bool,
    volume: &StorageVol,
    pool_name: &str,
    golden: &GoldenImage,
) -> Result<(), Refusal> {
    let name = &golden.volume;
    let info = volume.info().map_err(|e| {
        Refusal::Failed(format!(
            "golden image {name}: read volume info: {}",
            text(&e)
        ))
    })?;
    let capacity = info.capacity;
    let format = volume
        .xml_desc(0)
        .ok()
        .and_then(|desc| xml::volume_format(&desc))
        .unwrap_or_default();
    if capacity == golden.capacity && format == golden.format {
        if test_driver {
            return Ok(());
        }
        let found = readback::content(conn, volume, golden.bytes, || golden.sha256.clone())
            .map_err(|e| {
                Refusal::Failed(format!(
                    "golden image {name}: it holds {} of the file's {} bytes, and reading it \
                     back to compare failed: {e}",
                    info.allocation, golden.bytes
                ))
            })?;
        if !matches!(found, Content::Differs { .. }) {
            return Ok(());
        }
        return Err(Refusal::Mismatch(format!(
            "golden image {name} in pool {pool_name:?} holds {} of the file's {} bytes and its \
             content is not --image-source {} (an upload cut off by a crash?); the provider \
             never overwrites a volume: delete it (virsh vol-delete --pool {pool_name} {name}) \
             if no overlay uses it, and the provider uploads the file on its next reconnect",
            info.allocation,
            golden.bytes,
            golden.path.display()
        )));
    }
    Err(Refusal::Mismatch(format!(
        "golden image {name} in pool {pool_name:?} does not match --image-source {}: the volume \
         is {format:?} of virtual size {capacity} bytes, the file {:?} of {} bytes; the provider \
         never overwrites a volume: delete it (virsh vol-delete --pool {pool_name} {name}) if \
         no overlay uses it, and the provider uploads the file on its next reconnect",
        golden.path.display(),
        golden.format,
        golden.capacity
    )))
}

/// After an upload libvirt reported finished: the volume must hold the file (see
/// [`readback`] for why a finished upload is not taken on trust).
fn written(conn: &Connect, volume: &StorageVol, golden: &GoldenImage) -> Result<(), String> {
    match readback::content(conn, volume, golden.bytes, || golden.sha256.clone()) {
        Ok(Content::Allocated | Content::ReadBack) => Ok(()),
        Ok(Content::Differs { allocation }) => Err(format!(
            "libvirt reported the upload finished, but the volume holds {allocation} of the \
             file's {} bytes and reads back differently (a write on the host failed)",
            golden.bytes
        )),
        Err(e) => Err(format!("check the uploaded volume: {e}")),
    }
}

/// Streams the file into the volume, logging progress.
fn upload(
    conn: &Connect,
    volume: &StorageVol,
    zone: &str,
    golden: &GoldenImage,
) -> Result<(), String> {
    let mut file =
        File::open(&golden.path).map_err(|e| format!("open {}: {e}", golden.path.display()))?;
    let stream = Stream::new(conn, 0).map_err(|e| format!("open upload stream: {}", text(&e)))?;
    if let Err(e) = volume.upload(&stream, 0, golden.bytes, 0) {
        let _ = stream.abort();
        return Err(format!("start upload: {}", text(&e)));
    }
    match send_all(&stream, &mut file, zone, golden) {
        Ok(()) => stream
            .finish()
            .map_err(|e| format!("finish upload: {}", text(&e))),
        Err(e) => {
            let _ = stream.abort();
            Err(e)
        }
    }
}

fn send_all(
    stream: &Stream,
    file: &mut File,
    zone: &str,
    golden: &GoldenImage,
) -> Result<(), String> {
    let mut buffer = vec![0u8; CHUNK];
    let (mut sent_total, mut next_report) = (0u64, PROGRESS_EVERY);
    loop {
        let n = match file.read(&mut buffer) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(format!("read {}: {e}", golden.path.display())),
        };
        let mut sent = 0;
        while sent < n {
            match stream.send(&buffer[sent..n]) {
                Ok(k) if k > 0 => sent += k.unsigned_abs(),
                Ok(_) => return Err("the upload stream accepted no data".to_owned()),
                Err(e) => return Err(format!("upload: {}", text(&e))),
            }
        }
        sent_total += n as u64;
        if sent_total >= next_report {
            info!(zone, volume = %golden.volume, sent = sent_total, total = golden.bytes, "golden image upload progress");
            next_report += PROGRESS_EVERY;
        }
    }
    if sent_total != golden.bytes {
        return Err(format!(
            "{} changed while uploading ({sent_total} bytes read, {} hashed at start-up)",
            golden.path.display(),
            golden.bytes
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_content_addressed_and_formats_read_from_the_header() {
        let dir = tempfile::tempdir().unwrap();
        let raw = dir.path().join("ubuntu.img");
        std::fs::write(&raw, b"hello").unwrap();
        let image = read(&raw).unwrap();
        // sha256("hello") = 2cf24dba5fb0a30e…
        assert_eq!(image.volume, "ubuntu-2cf24dba5fb0a30e.img");
        assert_eq!(
            (image.format.as_str(), image.capacity, image.bytes),
            ("raw", 5, 5)
        );
        let qcow = dir.path().join("noext");
        let mut header = b"QFI\xfb".to_vec();
        header.resize(24, 0);
        header.extend_from_slice(&(10u64 << 30).to_be_bytes());
        std::fs::write(&qcow, &header).unwrap();
        let image = read(&qcow).unwrap();
        assert_eq!(image.format, "qcow2");
        assert_eq!(image.capacity, 10 << 30);
        assert!(image.volume.starts_with("noext-") && image.volume.ends_with(".qcow2"));
        let empty = dir.path().join("empty.raw");
        std::fs::write(&empty, b"").unwrap();
        assert!(read(&empty).unwrap_err().contains("is empty"));
    }
}
