//! `--image-source` into an rbd pool: the golden image goes into the Ceph pool once per
//! cluster, and every host whose rbd pool names that cluster clones from it.
//!
//! libvirt's rbd backend creates, clones, resizes and deletes images but cannot upload into
//! one, so the bytes take another way, made of libvirt calls only:
//!
//! 1. the file is uploaded into this host's `--seed-pool` (a local pool) as the
//!    content-addressed volume, as on a local storage pool (`golden::ensure`);
//! 2. a raw RBD image `<volume>.upload` of the image's virtual size is created in the rbd pool;
//! 3. QEMU copies one into the other: a transient domain that never runs (started paused, no
//!    vCPU ever executes) holds the local volume read-only and the RBD image, and a
//!    `blockdev-backup` job with `sync: full` writes every block of the first into the
//!    second (converting qcow2 to raw on the way), polled until it concludes;
//! 4. the upload is cloned into `<volume>` (a copy-on-write clone, as the machines' roots
//!    are), and the local copy is deleted.
//!
//! The name `<volume>` appears only when step 4 succeeds, after a complete copy, so an
//! image of that name is whole by construction and is trusted by its name and virtual size,
//! as on a local pool; `<volume>.upload` is its parent and is never deleted while it exists.
//! A copy cut off by a crash leaves only `<volume>.upload`, which the next attempt removes
//! before starting again (the copier is started with `AUTODESTROY`: libvirt destroys it when
//! the connection that made it closes). Within one process the zones that
//! share a cluster (same monitors and Ceph pool) take turns, so the first uploads and the
//! others find the image; another process that finds an upload under way is refused until
//! its next dial.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use bigfleet_libvirt_system::Stopwatch;

use serde_json::{Value, json};
use tracing::{info, warn};
use virt::connect::Connect;
use virt::domain::Domain;
use virt::storage_pool::StoragePool;
use virt::storage_vol::StorageVol;

use crate::host::error::{is_missing_volume, text};
use crate::host::gate::{Ensured, Refusal};
use crate::render::ownership::escape;
use crate::render::rbd::{self, RbdSource};
use crate::storage::golden::{self, GoldenImage};

/// How long one copy may take before it is given up (a gigabyte a minute is slow).
const COPY_LIMIT: Duration = Duration::from_secs(3600);
/// How often the copy job is polled.
const POLL: Duration = Duration::from_millis(250);

/// One lock per cluster (its monitors and Ceph pool), shared by every host's gate.
#[derive(Debug, Default)]
pub(crate) struct ClusterLocks(Mutex<BTreeMap<String, Arc<Mutex<()>>>>);

impl ClusterLocks {
    fn of(&self, source: &RbdSource) -> Arc<Mutex<()>> {
        let mut hosts: Vec<String> = (source.hosts.iter())
            .map(|h| format!("{}:{}", h.name, h.port.unwrap_or(0)))
            .collect();
        hosts.sort();
        let key = format!("{}@{}", source.pool, hosts.join(","));
        let mut all = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        Arc::clone(all.entry(key).or_default())
    }
}

/// Where the image goes and through what.
pub(crate) struct Target<'a> {
    pub(crate) zone: &'a str,
    /// The rbd pool (`--storage-pool`) and its cluster.
    pub(crate) pool: &'a str,
    pub(crate) source: &'a RbdSource,
    /// The local pool the file is staged in (`--seed-pool`).
    pub(crate) staging: &'a str,
}

/// Makes sure the rbd pool holds the golden image (see the module comment).
pub(crate) fn ensure(
    conn: &Connect,
    test_driver: bool,
    target: &Target<'_>,
    locks: &ClusterLocks,
    golden: &GoldenImage,
) -> Result<Ensured, Refusal> {
    let lock = locks.of(target.source);
    let _turn = lock.lock().unwrap_or_else(PoisonError::into_inner);
    let name = golden.volume.as_str();
    let failed =
        |what: &str, e: String| Refusal::Failed(format!("golden image {name}: {what}: {e}"));
    let pool = (conn.lookup_storage_pool_by_name(target.pool))
        .map_err(|e| failed("look up the rbd pool (--storage-pool)", text(&e)))?;
    let _ = pool.refresh(0);
    match pool.lookup_storage_vol_by_name(name) {
        Ok(volume) => return check(&volume, target.pool, golden).map(|()| Ensured::Present),
        Err(e) if is_missing_volume(&e) => {}
        Err(e) => return Err(failed("look it up in the rbd pool", text(&e))),
    }
    info!(
        zone = target.zone,
        volume = name,
        pool = target.pool,
        "golden image missing in the Ceph pool; uploading --image-source"
    );
    let watch = Stopwatch::start();
    golden::ensure(conn, test_driver, target.zone, target.staging, golden)?;
    let upload = format!("{name}.upload");
    let result = copy_and_clone(conn, test_driver, &pool, target, golden, &upload);
    if result.is_err() {
        remove(&pool, &upload);
    }
    result.map_err(|e| failed("upload into the rbd pool", e))?;
    remove_staged(conn, target.staging, name);
    info!(
        zone = target.zone,
        volume = name,
        seconds = watch.seconds(),
        "golden image uploaded into the Ceph pool"
    );
    Ok(Ensured::Uploaded)
}

/// An existing image must have the file's virtual size (RBD images are raw).
fn check(volume: &StorageVol, pool: &str, golden: &GoldenImage) -> Result<(), Refusal> {
    let capacity = (volume.info())
        .map_err(|e| {
            Refusal::Failed(format!(
                "golden image {}: read it: {}",
                golden.volume,
                text(&e)
            ))
        })?
        .capacity;
    if capacity == golden.capacity {
        return Ok(());
    }
    Err(Refusal::Mismatch(format!(
        "golden image {} in rbd pool {pool:?} is {capacity} bytes, and --image-source {} is \
         {} bytes; the provider never overwrites an image: remove it (rbd rm, after its clones) \
         if no machine uses it, and the provider uploads the file on its next reconnect",
        golden.volume,
        golden.path.display(),
        golden.capacity
    )))
}

/// Steps 2–4: the upload image, QEMU's copy into it, the clone that names the result.
fn copy_and_clone(
    conn: &Connect,
    test_driver: bool,
    pool: &StoragePool,
    target: &Target<'_>,
    golden: &GoldenImage,
    upload: &str,
) -> Result<(), String> {
    remove(pool, upload);
    let image = StorageVol::create_xml(pool, &rbd::volume(upload, golden.capacity), 0)
        .map_err(|e| format!("create {upload}: {}", text(&e)))?;
    if !test_driver {
        let staged = (conn.lookup_storage_pool_by_name(target.staging))
            .and_then(|p| p.lookup_storage_vol_by_name(&golden.volume))
            .and_then(|v| v.path())
            .map_err(|e| format!("the staged copy in {:?}: {}", target.staging, text(&e)))?;
        let copier = format!("bigfleet-golden-copier-{}", &golden.sha256[..16]);
        copy(
            conn,
            &copier,
            target.source,
            (&staged, &golden.format),
            upload,
        )?;
    }
    StorageVol::create_xml_from(
        pool,
        &rbd::volume(&golden.volume, golden.capacity),
        &image,
        0,
    )
    .map(|_| ())
    .map_err(|e| format!("clone {upload} into {}: {}", golden.volume, text(&e)))
}

/// The transient copier domain's document: the local file read-only as `vda`, the RBD
/// image as `vdb` (shared, so the copy job may write it beside the device that holds it).
fn copier_xml(
    name: &str,
    source: &RbdSource,
    (path, format): (&str, &str),
    upload: &str,
) -> String {
    let target = rbd::shareable_disk(source, upload, "vdb", "upload");
    format!(
        "<domain type='qemu'>
  <name>{}</name>
  <memory unit='MiB'>64</memory>
  <vcpu>1</vcpu>
  <os><type arch='x86_64' machine='q35'>hvm</type></os>
  <devices>
    <disk type='file' device='disk'>
      <driver name='qemu' type='{}'/>
      <source file='{}'/>
      <target dev='vda' bus='virtio'/>
      <readonly/>
    </disk>{target}
  </devices>
</domain>
",
        escape(name),
        escape(format),
        escape(path)
    )
}

/// Step 3: a paused transient domain and its `blockdev-backup` job, destroyed afterwards
/// whatever happened.
fn copy(
    conn: &Connect,
    name: &str,
    source: &RbdSource,
    file: (&str, &str),
    upload: &str,
) -> Result<(), String> {
    if let Ok(stale) = conn.lookup_domain_by_name(name) {
        warn!(domain = %name, "a copier domain of an earlier, cut-off upload is still there; destroying it");
        let _ = stale.destroy();
    }
    let document = copier_xml(name, source, file, upload);
    // Auto-destroyed with the connection: a provider that dies mid-copy leaves no copier.
    let flags = virt::sys::VIR_DOMAIN_START_PAUSED | virt::sys::VIR_DOMAIN_START_AUTODESTROY;
    let domain = (conn.create_domain_xml(&document, flags))
        .map_err(|e| format!("start the paused copier domain {name}: {}", text(&e)))?;
    let result = backup(&domain);
    if let Err(e) = domain.destroy() {
        warn!(domain = %name, error = %text(&e), "destroy the copier domain");
    }
    result
}

/// Runs the copy job on `domain` and waits for it to conclude.
fn backup(domain: &Domain) -> Result<(), String> {
    let blocks = qmp(domain, &json!({"execute": "query-block"}))?;
    let node = |disk: &str| {
        (blocks.as_array().into_iter().flatten())
            .find(|b| b["qdev"].as_str().is_some_and(|q| q.contains(disk)))
            .and_then(|b| b["inserted"]["node-name"].as_str())
            .map(str::to_owned)
            .ok_or_else(|| format!("QEMU shows no block node for {disk}: {blocks}"))
    };
    let (from, to) = (node("virtio-disk0")?, node("virtio-disk1")?);
    qmp(
        domain,
        &json!({"execute": "blockdev-backup", "arguments": {"job-id": "golden",
            "device": from, "target": to, "sync": "full", "auto-dismiss": false}}),
    )?;
    let watch = Stopwatch::start();
    loop {
        let jobs = qmp(domain, &json!({"execute": "query-jobs"}))?;
        let job = (jobs.as_array().into_iter().flatten())
            .find(|j| j["id"] == "golden")
            .cloned()
            .ok_or("the copy job vanished")?;
        if job["status"] == "concluded" {
            let _ = qmp(
                domain,
                &json!({"execute": "job-dismiss", "arguments": {"id": "golden"}}),
            );
            return match job["error"].as_str() {
                None => Ok(()),
                Some(error) => Err(format!("the copy failed: {error}")),
            };
        }
        if watch.seconds() > COPY_LIMIT.as_secs_f64() {
            return Err(format!(
                "the copy did not finish within {COPY_LIMIT:?}: {job}"
            ));
        }
        std::thread::sleep(POLL);
    }
}

/// One QMP command; its `return`, or its `error` as text.
fn qmp(domain: &Domain, command: &Value) -> Result<Value, String> {
    let reply = (domain.qemu_monitor_command(&command.to_string(), 0))
        .map_err(|e| format!("{}: {}", command["execute"], text(&e)))?;
    let mut reply: Value =
        serde_json::from_str(&reply).map_err(|e| format!("QMP reply {reply:?}: {e}"))?;
    if let Some(error) = reply.get("error") {
        return Err(format!("{}: {}", command["execute"], error["desc"]));
    }
    Ok(reply["return"].take())
}

/// Deletes `name` and its snapshots if it is there (a cut-off upload's image).
fn remove(pool: &StoragePool, name: &str) {
    if let Ok(volume) = pool.lookup_storage_vol_by_name(name) {
        let flags = virt::sys::VIR_STORAGE_VOL_DELETE_WITH_SNAPSHOTS;
        if let Err(e) = volume.delete(flags).or_else(|_| volume.delete(0)) {
            warn!(volume = name, error = %text(&e), "remove a cut-off upload's image");
        }
    }
}

/// Deletes the staged local copy: the Ceph pool holds the image now.
fn remove_staged(conn: &Connect, staging: &str, name: &str) {
    let deleted = (conn.lookup_storage_pool_by_name(staging))
        .and_then(|p| p.lookup_storage_vol_by_name(name))
        .and_then(|v| v.delete(0));
    if let Err(e) = deleted {
        warn!(volume = name, pool = staging, error = %text(&e), "delete the staged copy of the golden image");
    }
}
