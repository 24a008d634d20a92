//! What a domain looks like, and its documents: the domain's shape as one value (`spec`:
//! `DomainSpec`, and the volumes' names), the domain, overlay and seed volume XML (`xml`), the NICs
//! and their derived MAC addresses and the guest CPU (`devices`), the cloud-init NoCloud seed ISO
//! (`seed`), Ceph RBD pools' clusters and the disks on them (`rbd`), where a domain sits on its
//! host's CPUs and huge pages and what an existing one holds there (`placement`), passthrough
//! devices: a host's, a domain's, and their elements (`passthrough`), and the
//! ownership tag every domain carries and the XML escaping every document goes through
//! (`ownership`). Nothing here talks to libvirt.

pub mod devices;
pub mod ownership;
pub mod passthrough;
pub mod placement;
pub mod rbd;
pub mod seed;
pub mod spec;
pub mod xml;
