//! The provider's rbd storage pools, started again when a fresh connection finds them
//! inactive.
//!
//! libvirt cannot check whether an rbd pool is still usable when its daemon starts (the rbd
//! backend has no such check), so every restart of libvirtd leaves each rbd pool inactive,
//! and autostart runs once per host boot only, not once per daemon start. A host whose
//! libvirtd was restarted (an upgrade, a crash, `systemctl restart`) would then refuse every
//! Create on its rbd pool until someone ran `virsh pool-start`. The provider redials after
//! any daemon restart, so on every dial it starts the rbd pools it was told to use
//! (`--storage-pool`, `--seed-pool`) if they are defined and inactive. Starting a pool
//! connects libvirt to the cluster and changes no data. A `dir` or other local pool that is
//! inactive was stopped by someone (libvirt keeps those active over a restart) and is left
//! as it is; `doctor` reports it.

use tracing::{info, warn};
use virt::connect::Connect;

use crate::host::error::text;
use crate::render::rbd::{PoolKind, pool_kind};

/// What [`start_rbd_pools`] did with one pool.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Woken {
    /// Active already, not defined, or not an rbd pool: nothing done.
    Untouched,
    /// An inactive rbd pool, started.
    Started,
    /// An inactive rbd pool that would not start (the reason, from libvirt).
    Failed(String),
}

/// Starts each pool of `pools` (names, duplicates allowed) that is a defined, inactive rbd
/// pool on `conn`'s host; logs what it did and returns it per distinct name.
pub(crate) fn start_rbd_pools(
    conn: &Connect,
    zone: &str,
    pools: &[String],
) -> Vec<(String, Woken)> {
    let mut names: Vec<&String> = pools.iter().filter(|p| !p.is_empty()).collect();
    names.sort();
    names.dedup();
    names
        .into_iter()
        .map(|name| (name.clone(), wake(conn, zone, name)))
        .collect()
}

fn wake(conn: &Connect, zone: &str, name: &str) -> Woken {
    let Ok(pool) = conn.lookup_storage_pool_by_name(name) else {
        return Woken::Untouched;
    };
    if pool.is_active().unwrap_or(true) {
        return Woken::Untouched;
    }
    let rbd = (pool.xml_desc(0).ok())
        .and_then(|document| pool_kind(&document).ok())
        .is_some_and(|kind| matches!(kind, PoolKind::Rbd(_)));
    if !rbd {
        return Woken::Untouched;
    }
    match pool.create(0) {
        Ok(_) => {
            info!(
                zone,
                pool = name,
                "rbd storage pool was inactive (libvirt leaves rbd pools inactive after its \
                 daemon restarts); started it"
            );
            Woken::Started
        }
        Err(e) => {
            let reason = text(&e);
            warn!(zone, pool = name, error = %reason,
                "rbd storage pool is inactive and would not start; Creates on this host fail \
                 until it does (check the Ceph monitors and the cephx secret: bigfleet-libvirt \
                 doctor)");
            Woken::Failed(reason)
        }
    }
}
