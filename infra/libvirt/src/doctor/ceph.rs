//! The doctor's Ceph RBD and seed-pool checks: when `--storage-pool` is an rbd pool, that
//! the cephx secret it names is defined in libvirt (QEMU opens every RBD disk with it) and
//! that the seeds (and an `--image-source` upload's staged copy) have a local pool
//! (`--seed-pool`); with a local storage pool and another `--seed-pool`, that the seed pool
//! is there and local too.

use virt::connect::Connect;
use virt::error::ErrorNumber;

use super::facts::{Expectations, HostFacts, Pool, Probe, RbdFacts};
use super::report::{Check, Status, check};
use crate::host::error::{is_unsupported, text};
use crate::render::rbd::{PoolKind, RbdSource, SecretRef};

/// libvirt's `VIR_SECRET_USAGE_TYPE_CEPH`.
const USAGE_CEPH: i32 = 2;

/// What the probe reads about an rbd pool's definition (`None`: a local pool).
pub(super) fn rbd_facts(conn: &Connect, pool_xml: &str) -> Option<RbdFacts> {
    let PoolKind::Rbd(source) = crate::render::rbd::pool_kind(pool_xml).ok()? else {
        return None;
    };
    let secret = match source.auth.as_ref().map(|a| &a.secret) {
        None => Probe::Found(()),
        Some(secret) => {
            let found = match secret {
                SecretRef::Uuid(uuid) => conn.lookup_secret_by_uuid_string(uuid),
                SecretRef::Usage(usage) => conn.lookup_secret_by_usage(USAGE_CEPH, usage),
            };
            match found {
                Ok(_) => Probe::Found(()),
                Err(e) if e.code().is(ErrorNumber::NoSecret) => Probe::Missing,
                Err(e) if is_unsupported(&e) => Probe::Unsupported(text(&e)),
                Err(e) => Probe::Failed(text(&e)),
            }
        }
    };
    Some(RbdFacts { source, secret })
}

/// The checks for an rbd storage pool and for the seed pool.
pub(super) fn checks(want: &Expectations, host: &HostFacts, storage: &Pool) -> Vec<Check> {
    let zone = host.zone.as_str();
    let mut out = Vec::new();
    if let Some(rbd) = &storage.rbd {
        out.push(secret(want, zone, rbd));
    }
    if storage.rbd.is_some() || want.seed_pool != want.storage_pool {
        out.push(seed_pool(want, zone, host.seed_pool.as_ref(), storage));
    }
    out
}

fn secret(want: &Expectations, zone: &str, rbd: &RbdFacts) -> Check {
    let pool = &want.storage_pool;
    let Some(auth) = &rbd.source.auth else {
        return check(
            zone,
            "ceph secret",
            Status::Warn,
            format!(
                "rbd pool {pool} has no <auth>: the cluster must allow unauthenticated clients"
            ),
            "enable cephx and give the pool an <auth> with a libvirt secret (docs/libvirt.md, Ceph RBD)",
        );
    };
    let who = format!("client.{}", auth.username);
    let named = auth.secret.describe();
    match &rbd.secret {
        Probe::Found(()) => check(
            zone,
            "ceph secret",
            Status::Ok,
            format!(
                "{pool}: {who} on {} with libvirt secret {named}",
                monitors(&rbd.source)
            ),
            "",
        ),
        Probe::Missing => check(
            zone,
            "ceph secret",
            Status::Block,
            format!("rbd pool {pool} names libvirt secret {named}, which this host does not have"),
            &format!(
                "define it once per host: virsh secret-define ceph-secret.xml (a <secret \
                 ephemeral='no' private='yes'> with usage type ceph and the pool's uuid), then \
                 virsh secret-set-value UUID --base64 \"$(ceph auth get-key {who})\""
            ),
        ),
        Probe::Unsupported(why) => check(
            zone,
            "ceph secret",
            Status::Skip,
            format!("not checked: {why}"),
            "",
        ),
        Probe::Failed(e) => check(
            zone,
            "ceph secret",
            Status::Block,
            format!("look up libvirt secret {named}: {e}"),
            "check that this process may read the host's secrets",
        ),
    }
}

fn monitors(source: &RbdSource) -> String {
    let hosts: Vec<String> = (source.hosts.iter())
        .map(|h| match h.port {
            Some(port) => format!("{}:{port}", h.name),
            None => h.name.clone(),
        })
        .collect();
    format!("Ceph pool {} via {}", source.pool, hosts.join(","))
}

fn seed_pool(want: &Expectations, zone: &str, seed: Option<&Probe<Pool>>, storage: &Pool) -> Check {
    let name = &want.seed_pool;
    let fix = "name a dir pool that every host has with --seed-pool (docs/libvirt.md, Ceph RBD)";
    let facts = match seed {
        None => Probe::Found(storage.clone()),
        Some(probe) => probe.clone(),
    };
    match facts {
        Probe::Found(p) if p.rbd.is_some() || p.kind == "rbd" => check(
            zone,
            "seed pool",
            Status::Block,
            format!(
                "{name} is an rbd pool; the cloud-init seed is a file QEMU reads and needs a local pool"
            ),
            fix,
        ),
        Probe::Found(p) if !p.active => check(
            zone,
            "seed pool",
            Status::Block,
            format!("{name} exists but is not active"),
            &format!("start it: virsh pool-start {name} && virsh pool-autostart {name}"),
        ),
        Probe::Found(p) => check(
            zone,
            "seed pool",
            Status::Ok,
            format!("{name}: type {}, active", p.kind),
            "",
        ),
        Probe::Missing => check(
            zone,
            "seed pool",
            Status::Block,
            format!("there is no storage pool {name} for the seeds"),
            fix,
        ),
        Probe::Unsupported(e) | Probe::Failed(e) => check(
            zone,
            "seed pool",
            Status::Block,
            format!("{name}: {e}"),
            "check that this process may read the pool",
        ),
    }
}
