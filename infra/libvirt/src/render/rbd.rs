//! Ceph RBD storage pools: what a libvirt pool of type `rbd` says about its cluster
//! ([`RbdSource`]: the Ceph pool, the monitors and the cephx user with its libvirt secret),
//! read from the pool's own definition, and the documents that use it: a raw RBD volume and
//! a domain's `<disk type='network'>` on an image of that pool.
//!
//! The pool definition is the one place the operator states the cluster: a domain's disks
//! repeat its monitors and its `<auth>` (QEMU opens the images itself, with the key libvirt
//! holds as the secret), so a machine can never be pointed at another cluster or user than
//! the pool it was made in.

use crate::render::ownership::escape;

/// The Ceph side of a libvirt `rbd` pool.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RbdSource {
    /// The Ceph pool's name (the pool definition's `<source><name>`).
    pub pool: String,
    /// The monitors, in the definition's order.
    pub hosts: Vec<RbdHost>,
    /// The cephx user and its secret; `None` when the cluster needs no authentication.
    pub auth: Option<RbdAuth>,
}

/// One Ceph monitor.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RbdHost {
    /// Host name or address.
    pub name: String,
    /// Port; `None` is Ceph's default.
    pub port: Option<u16>,
}

/// A cephx user and the libvirt secret that holds its key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RbdAuth {
    /// The cephx user without `client.` (e.g. `libvirt`).
    pub username: String,
    /// The libvirt secret, by UUID or by usage name.
    pub secret: SecretRef,
}

/// How a pool names its libvirt secret.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SecretRef {
    /// `<secret uuid='…'/>`.
    Uuid(String),
    /// `<secret usage='…'/>`.
    Usage(String),
}

impl SecretRef {
    /// How `doctor` and the errors name it.
    #[must_use]
    pub fn describe(&self) -> String {
        match self {
            Self::Uuid(uuid) => format!("uuid {uuid}"),
            Self::Usage(usage) => format!("usage {usage:?}"),
        }
    }
}

/// What kind of pool a definition is, as far as the provider's disks are concerned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PoolKind {
    /// Volumes are files or block devices with a path on the host (`dir`, `fs`, `netfs`, …):
    /// roots are qcow2 overlays.
    Local(String),
    /// A Ceph RBD pool: roots are copy-on-write clones of the golden image.
    Rbd(RbdSource),
}

/// Reads a storage pool definition.
///
/// # Errors
/// When the document is not a pool definition, or an `rbd` pool lacks its Ceph pool name,
/// a monitor or (with `<auth>`) its user or secret.
pub fn pool_kind(pool_xml: &str) -> Result<PoolKind, String> {
    let document = roxmltree::Document::parse(pool_xml)
        .map_err(|e| format!("unreadable pool definition: {e}"))?;
    let root = document.root_element();
    let kind = (root.has_tag_name("pool"))
        .then(|| root.attribute("type"))
        .flatten()
        .ok_or("not a <pool type=…> definition")?;
    if kind != "rbd" {
        return Ok(PoolKind::Local(kind.to_owned()));
    }
    let source = (root.children().find(|n| n.has_tag_name("source")))
        .ok_or("the rbd pool has no <source>")?;
    let child = |name: &str| source.children().find(|n| n.has_tag_name(name));
    let pool = (child("name").and_then(|n| n.text()))
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .ok_or("the rbd pool's <source> names no Ceph pool (<name>)")?;
    let hosts: Vec<RbdHost> = (source.children())
        .filter(|n| n.has_tag_name("host"))
        .filter_map(|n| {
            Some(RbdHost {
                name: n.attribute("name")?.to_owned(),
                port: n.attribute("port").and_then(|p| p.parse().ok()),
            })
        })
        .collect();
    if hosts.is_empty() {
        return Err("the rbd pool's <source> names no monitor (<host name=…>)".to_owned());
    }
    let auth = match child("auth") {
        None => None,
        Some(auth) => Some(read_auth(auth)?),
    };
    Ok(PoolKind::Rbd(RbdSource {
        pool: pool.to_owned(),
        hosts,
        auth,
    }))
}

fn read_auth(auth: roxmltree::Node<'_, '_>) -> Result<RbdAuth, String> {
    let username = (auth.attribute("username"))
        .filter(|u| !u.is_empty())
        .ok_or("the rbd pool's <auth> has no username")?;
    let secret = (auth.children().find(|n| n.has_tag_name("secret")))
        .ok_or("the rbd pool's <auth> names no <secret>")?;
    let secret = match (secret.attribute("uuid"), secret.attribute("usage")) {
        (Some(uuid), _) => SecretRef::Uuid(uuid.to_owned()),
        (None, Some(usage)) => SecretRef::Usage(usage.to_owned()),
        (None, None) => return Err("the rbd pool's <secret> has neither uuid nor usage".into()),
    };
    Ok(RbdAuth {
        username: username.to_owned(),
        secret,
    })
}

/// A raw RBD volume `name` of `capacity` bytes (RBD images are thin: nothing is written).
#[must_use]
pub fn volume(name: &str, capacity: u64) -> String {
    format!(
        "<volume type='network'>
  <name>{}</name>
  <capacity unit='bytes'>{capacity}</capacity>
  <target><format type='raw'/></target>
</volume>
",
        escape(name)
    )
}

/// A domain's `<disk>` on image `image` of the pool `source` describes, as `target` (e.g.
/// `vda`) on virtio, with `serial`.
#[must_use]
pub fn disk(source: &RbdSource, image: &str, target: &str, serial: &str) -> String {
    network_disk(source, image, (target, serial), "")
}

/// [`disk`], marked `<shareable/>`: a disk another writer (a block job) may write beside the
/// device that holds it (the golden image's copier, `storage::golden_rbd`).
#[must_use]
pub fn shareable_disk(source: &RbdSource, image: &str, target: &str, serial: &str) -> String {
    network_disk(source, image, (target, serial), "\n      <shareable/>")
}

fn network_disk(
    source: &RbdSource,
    image: &str,
    (target, serial): (&str, &str),
    extra: &str,
) -> String {
    let hosts: String = (source.hosts.iter())
        .map(|h| match h.port {
            Some(port) => format!("\n        <host name='{}' port='{port}'/>", escape(&h.name)),
            None => format!("\n        <host name='{}'/>", escape(&h.name)),
        })
        .collect();
    let auth = source.auth.as_ref().map_or_else(String::new, |auth| {
        let secret = match &auth.secret {
            SecretRef::Uuid(uuid) => format!("uuid='{}'", escape(uuid)),
            SecretRef::Usage(usage) => format!("usage='{}'", escape(usage)),
        };
        format!(
            "
      <auth username='{}'>
        <secret type='ceph' {secret}/>
      </auth>",
            escape(&auth.username)
        )
    });
    format!(
        "
    <disk type='network' device='disk'>
      <driver name='qemu' type='raw' cache='writeback' discard='unmap'/>
      <source protocol='rbd' name='{}/{}'>{hosts}
      </source>{auth}
      <target dev='{target}' bus='virtio'/>
      <serial>{}</serial>{extra}
    </disk>",
        escape(&source.pool),
        escape(image),
        escape(serial)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const POOL: &str = "<pool type='rbd'><name>ceph</name><source>
      <host name='10.0.0.1' port='6789'/><host name='mon2'/><name>vms</name>
      <auth type='ceph' username='libvirt'><secret uuid='2a5a7b3e-3c1e-4b0f-9d3c-7f1e5b2a9c10'/></auth>
      </source></pool>";

    #[test]
    fn an_rbd_pool_definition_gives_its_cluster() {
        let PoolKind::Rbd(source) = pool_kind(POOL).unwrap() else {
            panic!("not rbd");
        };
        assert_eq!(source.pool, "vms");
        assert_eq!(
            source.hosts,
            [
                RbdHost {
                    name: "10.0.0.1".into(),
                    port: Some(6789)
                },
                RbdHost {
                    name: "mon2".into(),
                    port: None
                }
            ]
        );
        let auth = source.auth.unwrap();
        assert_eq!(auth.username, "libvirt");
        assert_eq!(
            auth.secret,
            SecretRef::Uuid("2a5a7b3e-3c1e-4b0f-9d3c-7f1e5b2a9c10".into())
        );
        assert_eq!(
            pool_kind("<pool type='dir'><name>d</name></pool>").unwrap(),
            PoolKind::Local("dir".into())
        );
    }

    #[test]
    fn an_incomplete_rbd_pool_is_refused_by_what_it_lacks() {
        for (document, lacks) in [
            ("<pool type='rbd'><name>c</name></pool>", "no <source>"),
            (
                "<pool type='rbd'><source><host name='m'/></source></pool>",
                "names no Ceph pool",
            ),
            (
                "<pool type='rbd'><source><name>p</name></source></pool>",
                "names no monitor",
            ),
            (
                "<pool type='rbd'><source><name>p</name><host name='m'/><auth username='u'/></source></pool>",
                "names no <secret>",
            ),
            ("<network/>", "not a <pool"),
        ] {
            let error = pool_kind(document).unwrap_err();
            assert!(error.contains(lacks), "{document}: {error}");
        }
    }

    #[test]
    fn a_shareable_disk_is_the_disk_marked_shareable() {
        let PoolKind::Rbd(source) = pool_kind(POOL).unwrap() else {
            panic!("not rbd");
        };
        let plain = disk(&source, "img", "vdb", "upload");
        let shared = shareable_disk(&source, "img", "vdb", "upload");
        for (document, shareable) in [(&plain, false), (&shared, true)] {
            let parsed = roxmltree::Document::parse(document).unwrap();
            let root = parsed.root_element();
            assert!(root.has_tag_name("disk"), "{document}");
            let has = root.children().any(|c| c.has_tag_name("shareable"));
            assert_eq!(has, shareable, "{document}");
        }
        assert_eq!(shared.replace("\n      <shareable/>", ""), plain);
    }
}
