//! The storage volumes a domain owns: its root (a qcow2 overlay, or on an rbd pool a clone
//! of the golden image) and data disks in `--storage-pool`, and its cloud-init seed in
//! `--seed-pool` (by default the same pool), all named after the domain, so they can be found (and collected) from
//! the domain name alone. The base image is read, never written or deleted.
//!
//! Creation is create-or-adopt: an existing volume of the right name is adopted and
//! reported as *not created*, so a rollback deletes only what this attempt made (a
//! concurrent or earlier attempt's disks are never pulled away).

use std::collections::BTreeMap;

use tracing::warn;
use virt::storage_pool::StoragePool;
use virt::storage_vol::StorageVol;
use virt::stream::Stream;

use crate::host::error::{is_missing_volume, is_volume_exists, text};
use crate::host::session::{BaseImage, Session};
use crate::render::rbd::{self, PoolKind};
use crate::render::xml;

pub use crate::render::spec::{
    console_name, ignition_name, overlay_name, owner_of, rbd_root_name, seed_name,
};

/// Upload chunk size for the seed ISO.
const UPLOAD_CHUNK: usize = 256 * 1024;

/// Looks up the storage pool.
pub(crate) fn pool(session: &Session, name: &str) -> Result<StoragePool, String> {
    session
        .conn
        .lookup_storage_pool_by_name(name)
        .map_err(|e| format!("look up storage pool {name:?}: {}", text(&e)))
}

/// What kind of pool `pool` is (its definition read over the connection).
pub(crate) fn pool_kind(pool: &StoragePool, name: &str) -> Result<PoolKind, String> {
    let document = (pool.xml_desc(0))
        .map_err(|e| format!("read storage pool {name:?}'s definition: {}", text(&e)))?;
    rbd::pool_kind(&document).map_err(|e| format!("storage pool {name:?}: {e}"))
}

/// The base image facts (and the pool's kind), cached per connection.
pub(crate) fn base_image(
    session: &Session,
    pool: &StoragePool,
    image: &str,
) -> Result<BaseImage, String> {
    let mut cache = session
        .base
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(base) = cache.as_ref() {
        return Ok(base.clone());
    }
    // A pool's volume list is the daemon's cache: an image put there behind libvirt's back
    // (`rbd import`, a copied file) is found only after a refresh.
    let volume = (pool.lookup_storage_vol_by_name(image))
        .or_else(|e| {
            if !is_missing_volume(&e) {
                return Err(e);
            }
            let _ = pool.refresh(0);
            pool.lookup_storage_vol_by_name(image)
        })
        .map_err(|e| {
            format!(
                "look up base image volume {image:?} (--image): {}",
                text(&e)
            )
        })?;
    let path = volume
        .path()
        .map_err(|e| format!("base image path: {}", text(&e)))?;
    let capacity = volume
        .info()
        .map_err(|e| format!("base image info: {}", text(&e)))?
        .capacity;
    let rbd = match pool_kind(pool, &pool.name().unwrap_or_default())? {
        PoolKind::Rbd(source) => Some(source),
        PoolKind::Local(_) => None,
    };
    // An RBD image is raw to libvirt whatever it holds (docs/libvirt.md says to import the
    // golden image converted to raw).
    let format = if rbd.is_some() {
        "raw".to_owned()
    } else {
        (volume.xml_desc(0).ok())
            .and_then(|desc| xml::volume_format(&desc))
            .unwrap_or_else(|| {
                warn!(image, "base image format unreadable; assuming qcow2");
                "qcow2".to_owned()
            })
    };
    let base = BaseImage {
        path,
        capacity,
        format,
        rbd,
    };
    *cache = Some(base.clone());
    Ok(base)
}

/// Creates the volume described by `volume_xml`, or adopts an existing one of that name.
/// Returns the volume and whether this call created it.
pub(crate) fn create_or_adopt(
    pool: &StoragePool,
    name: &str,
    volume_xml: &str,
) -> Result<(StorageVol, bool), String> {
    make_or_adopt(pool, name, "create volume", || {
        StorageVol::create_xml(pool, volume_xml, 0)
    })
}

/// Makes volume `volume_xml` as a clone of `origin` in `pool` (on an rbd pool: a
/// copy-on-write clone), or adopts an existing one of that name. Returns the volume and
/// whether this call made it.
pub(crate) fn clone_or_adopt(
    pool: &StoragePool,
    name: &str,
    volume_xml: &str,
    origin: &StorageVol,
) -> Result<(StorageVol, bool), String> {
    make_or_adopt(pool, name, "clone the golden image into", || {
        StorageVol::create_xml_from(pool, volume_xml, origin, 0)
    })
}

/// Adopts volume `name` when it exists, else makes it with `make` (`what` names the
/// making in its error); one made meanwhile by someone else is adopted too.
fn make_or_adopt(
    pool: &StoragePool,
    name: &str,
    what: &str,
    make: impl FnOnce() -> Result<StorageVol, virt::error::Error>,
) -> Result<(StorageVol, bool), String> {
    match pool.lookup_storage_vol_by_name(name) {
        Ok(volume) => return Ok((volume, false)),
        Err(e) if is_missing_volume(&e) => {}
        Err(e) => return Err(format!("look up volume {name}: {}", text(&e))),
    }
    match make() {
        Ok(volume) => Ok((volume, true)),
        Err(e) if is_volume_exists(&e) => pool
            .lookup_storage_vol_by_name(name)
            .map(|volume| (volume, false))
            .map_err(|e| format!("adopt volume {name}: {}", text(&e))),
        Err(e) => {
            let in_pool = (pool.name().ok()).map_or(String::new(), |p| format!(" in pool {p:?}"));
            Err(format!("{what} {name}{in_pool}: {}", text(&e)))
        }
    }
}

/// Writes `bytes` into the volume from offset 0. The test driver keeps no volume contents
/// and cannot stream, so there the upload is skipped (nothing could read it back anyway).
/// Unlike the golden image's (see `readback`), this upload is not read back: the seed volume
/// is made fully allocated, so a full pool fails its creation rather than a write.
pub(crate) fn upload(session: &Session, volume: &StorageVol, bytes: &[u8]) -> Result<(), String> {
    if session.test_driver {
        return Ok(());
    }
    let stream =
        Stream::new(&session.conn, 0).map_err(|e| format!("open upload stream: {}", text(&e)))?;
    let length = u64::try_from(bytes.len()).unwrap_or(u64::MAX);
    if let Err(e) = volume.upload(&stream, 0, length, 0) {
        let _ = stream.abort();
        return Err(format!("start upload: {}", text(&e)));
    }
    for chunk in bytes.chunks(UPLOAD_CHUNK) {
        let mut sent = 0;
        while sent < chunk.len() {
            match stream.send(&chunk[sent..]) {
                Ok(n) if n > 0 => sent += n.unsigned_abs(),
                Ok(_) => {
                    let _ = stream.abort();
                    return Err("upload stream accepted no data".to_owned());
                }
                Err(e) => {
                    let _ = stream.abort();
                    return Err(format!("upload: {}", text(&e)));
                }
            }
        }
    }
    stream
        .finish()
        .map_err(|e| format!("finish upload: {}", text(&e)))
}

/// Deletes one volume by name. `Ok(false)` when it did not exist.
pub(crate) fn delete(pool: &StoragePool, name: &str) -> Result<bool, String> {
    match pool.lookup_storage_vol_by_name(name) {
        Ok(volume) => match volume.delete(0) {
            Ok(()) => Ok(true),
            Err(e) if is_missing_volume(&e) => Ok(false),
            Err(e) => Err(format!("delete volume {name}: {}", text(&e))),
        },
        Err(e) if is_missing_volume(&e) => Ok(false),
        Err(e) => Err(format!("look up volume {name}: {}", text(&e))),
    }
}

/// Deletes a domain's root (overlay or RBD clone) and the data volumes `data` from
/// `pools.storage`, and its seed, console log and Ignition config from `pools.seed` (whichever exist; older
/// console files virtlogd rotated out are left to orphan collection, which re-reads the
/// pool). Every volume is
/// attempted; the errors are joined.
pub(crate) fn delete_domain_volumes(
    session: &Session,
    pools: Pools<'_>,
    domain: &str,
    mut data: Vec<String>,
) -> Result<(), String> {
    let storage = pool(session, pools.storage)?;
    data.sort();
    data.dedup();
    let roots = [overlay_name(domain), rbd_root_name(domain)];
    let mut errors: Vec<String> = (roots.iter().chain(&data))
        .filter_map(|name| delete(&storage, name).err())
        .collect();
    let seed = if pools.seed == pools.storage {
        Ok(storage)
    } else {
        pool(session, pools.seed)
    };
    let beside_seed = [
        seed_name(domain),
        console_name(domain),
        ignition_name(domain),
    ];
    match seed {
        Ok(seed) => errors.extend(
            beside_seed
                .iter()
                .filter_map(|name| delete(&seed, name).err()),
        ),
        Err(e) => errors.push(e),
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors.join("; "))
    }
}

/// Deletes volume `name` from whichever of `pools` holds it (an orphan's).
pub(crate) fn delete_anywhere(
    session: &Session,
    pools: Pools<'_>,
    name: &str,
) -> Result<(), String> {
    for each in pools.each() {
        if delete(&pool(session, each)?, name)? {
            return Ok(());
        }
    }
    Ok(())
}

/// The pools a domain's volumes live in: `--storage-pool` (root and data disks) and
/// `--seed-pool` (the seed; the same pool unless the operator names another).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Pools<'a> {
    /// `--storage-pool`.
    pub(crate) storage: &'a str,
    /// `--seed-pool`, resolved.
    pub(crate) seed: &'a str,
}

impl<'a> Pools<'a> {
    /// The pools `options` names.
    pub(crate) fn of(options: &'a crate::options::DomainConfig) -> Self {
        Self {
            storage: &options.storage_pool,
            seed: options.seed_pool(),
        }
    }

    /// Each distinct pool once.
    pub(crate) fn each(self) -> Vec<&'a str> {
        if self.seed == self.storage {
            vec![self.storage]
        } else {
            vec![self.storage, self.seed]
        }
    }
}

/// Every volume name in the pool (refreshed first, so files changed behind libvirt's back
/// are seen).
pub(crate) fn list(session: &Session, pool_name: &str) -> Result<Vec<String>, String> {
    let pool = pool(session, pool_name)?;
    let _ = pool.refresh(0);
    pool.list_volumes()
        .map_err(|e| format!("list volumes in pool {pool_name:?}: {}", text(&e)))
}

/// A pool's capacity and allocation, and the virtual size of some of its volumes, in bytes.
pub(crate) struct Sizes {
    /// (capacity, allocation).
    pub(crate) pool: (u64, u64),
    /// By volume name.
    pub(crate) volumes: BTreeMap<String, u64>,
}

/// The pool's sizes and the virtual size of each of `names` (a volume gone since it was
/// listed is left out).
pub(crate) fn sizes(
    session: &Session,
    pool_name: &str,
    names: &[&String],
) -> Result<Sizes, String> {
    let pool = pool(session, pool_name)?;
    let info =
        (pool.info()).map_err(|e| format!("read storage pool {pool_name:?}: {}", text(&e)))?;
    let mut each = BTreeMap::new();
    for name in names {
        let size = pool.lookup_storage_vol_by_name(name).and_then(|v| v.info());
        if let Ok(size) = size {
            each.insert((*name).clone(), size.capacity);
        }
    }
    Ok(Sizes {
        pool: (info.capacity, info.allocation),
        volumes: each,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::render::spec::data_name;

    #[test]
    fn names_round_trip_to_their_domain() {
        assert_eq!(owner_of(&overlay_name("bigfleet-ab")), Some("bigfleet-ab"));
        assert_eq!(owner_of(&seed_name("bigfleet-ab")), Some("bigfleet-ab"));
        assert_eq!(
            owner_of(&data_name("bigfleet-ab", "logs2")),
            Some("bigfleet-ab")
        );
        assert_eq!(owner_of(&console_name("bigfleet-ab")), Some("bigfleet-ab"));
        // virtlogd's older files of the console log.
        assert_eq!(owner_of("bigfleet-ab-console.log.0"), Some("bigfleet-ab"));
        assert_eq!(owner_of("bigfleet-ab-console.log.12"), Some("bigfleet-ab"));
        assert_eq!(owner_of("base.qcow2"), None);
        for theirs in [
            "-console.log",
            "x-console.log.",
            "x-console.log.a",
            "x-console.txt",
            "x-data-.qcow2",
            "-data-a.qcow2",
            "x-data-My.qcow2",
            "x-data-a-b.qcow2",
        ] {
            assert_eq!(owner_of(theirs), None, "{theirs}");
        }
    }
}
