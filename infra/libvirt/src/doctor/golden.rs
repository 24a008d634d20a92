//! The doctor's `image-source` check (`--image-source`): whether each host's pool already
//! holds the content-addressed golden volume and it matches the file, or, when it is
//! missing, whether the pool has room for the upload the provider will make on connect (into
//! an rbd pool: once per cluster, staged in `--seed-pool`, storage::golden_rbd).
//! A same-named volume that does not match blocks, as it keeps the host's slots out.

use super::facts::{Pool, Probe, Volume};
use super::report::{Check, Status, check, gib};
use crate::options::GoldenImage;

/// The check line for one host; `None` when the image probe could not answer (the `image`
/// check already says why).
pub(super) fn check_source(
    zone: &str,
    pool: &str,
    golden: &GoldenImage,
    image: &Probe<Volume>,
    pool_facts: &Pool,
) -> Option<Check> {
    let name = golden.volume.as_str();
    let source = golden.path.display();
    match image {
        // An RBD image is raw to libvirt whatever it was made from.
        Probe::Found(v)
            if (v.format == golden.format || pool_facts.rbd.is_some())
                && v.capacity == golden.capacity =>
        {
            Some(check(
                zone,
                "image-source",
                Status::Ok,
                format!(
                    "{name} in {pool} matches {source} (sha256 {})",
                    &golden.sha256[..16]
                ),
                "",
            ))
        }
        Probe::Found(v) => Some(check(
            zone,
            "image-source",
            Status::Block,
            format!(
                "{name} in {pool} does not match {source}: the volume is {} of virtual size {}, \
                 the file {} of {}; the provider keeps this host's slots out",
                v.format,
                gib(v.capacity),
                golden.format,
                gib(golden.capacity)
            ),
            &format!(
                "the provider never overwrites a volume: delete it (virsh vol-delete --pool \
                 {pool} {name}) if no overlay uses it, and the provider uploads the file"
            ),
        )),
        Probe::Missing if golden.bytes <= pool_facts.available => Some(check(
            zone,
            "image-source",
            Status::Ok,
            format!(
                "{name} is not in {pool} yet: the provider uploads {source} ({}) when it \
                 connects, before offering this host's slots",
                gib(golden.bytes)
            ),
            "",
        )),
        Probe::Missing => Some(check(
            zone,
            "image-source",
            Status::Block,
            format!(
                "{name} is not in {pool} and the pool has {} free, less than {source} ({})",
                gib(pool_facts.available),
                gib(golden.bytes)
            ),
            &format!("free space in pool {pool}, or upload a smaller image"),
        )),
        Probe::Unsupported(_) | Probe::Failed(_) => None,
    }
}
