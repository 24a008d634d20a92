//! The libvirt XML documents the adapter writes (domain, overlay volume, seed volume) and the
//! one it reads (the base volume's format).
//!
//! Documents are built as strings because their shape is fixed; every interpolated value
//! goes through [`escape`], unlike the reference, which interpolated flag values and paths
//! raw. The domain mirrors libvirt-reference §5.4: x86_64/q35 with BIOS boot, host CPU,
//! a virtio disk on the qcow2 overlay, the cloud-init seed as a read-only SATA CD-ROM, one
//! virtio NIC on `--network`, the qemu guest-agent channel and a serial console.

use super::ownership::{Tag, escape};

/// The guest-agent channel name qemu-ga listens on.
pub const AGENT_CHANNEL: &str = "org.qemu.guest_agent.0";

/// What a domain is made of.
#[derive(Clone, Debug)]
pub struct DomainSpec<'a> {
    /// The domain name.
    pub name: &'a str,
    /// The ownership tag embedded in `<metadata>`.
    pub tag: &'a Tag,
    /// Virtual CPUs.
    pub vcpu: u32,
    /// Memory in MiB.
    pub memory_mib: u64,
    /// Path of the qcow2 overlay volume.
    pub overlay_path: &'a str,
    /// Path of the NoCloud seed volume.
    pub seed_path: &'a str,
    /// The libvirt network for the NIC.
    pub network: &'a str,
}

/// The domain XML for `spec`.
#[must_use]
pub fn domain(spec: &DomainSpec<'_>) -> String {
    let name = escape(spec.name);
    let overlay = escape(spec.overlay_path);
    let seed = escape(spec.seed_path);
    let network = escape(spec.network);
    let (vcpu, memory) = (spec.vcpu, spec.memory_mib);
    let tag = spec.tag.to_domain_xml();
    format!(
        "<domain type='kvm'>
  <name>{name}</name>
  <metadata>{tag}</metadata>
  <memory unit='MiB'>{memory}</memory>
  <currentMemory unit='MiB'>{memory}</currentMemory>
  <vcpu placement='static'>{vcpu}</vcpu>
  <os>
    <type arch='x86_64' machine='q35'>hvm</type>
    <boot dev='hd'/>
  </os>
  <features><acpi/><apic/></features>
  <cpu mode='host-passthrough' check='none'/>
  <clock offset='utc'/>
  <on_poweroff>destroy</on_poweroff>
  <on_reboot>restart</on_reboot>
  <on_crash>restart</on_crash>
  <devices>
    <disk type='file' device='disk'>
      <driver name='qemu' type='qcow2'/>
      <source file='{overlay}'/>
      <target dev='vda' bus='virtio'/>
    </disk>
    <disk type='file' device='cdrom'>
      <driver name='qemu' type='raw'/>
      <source file='{seed}'/>
      <target dev='sda' bus='sata'/>
      <readonly/>
    </disk>
    <interface type='network'>
      <source network='{network}'/>
      <model type='virtio'/>
    </interface>
    <channel type='unix'>
      <source mode='bind'/>
      <target type='virtio' name='{AGENT_CHANNEL}'/>
    </channel>
    <serial type='pty'/>
    <console type='pty'/>
  </devices>
</domain>
"
    )
}

/// A qcow2 overlay volume backed by the base image. It is thin (allocation 0): qcow2 grows
/// on write, and a pool must not be charged the full virtual size per machine.
#[must_use]
pub fn overlay_volume(name: &str, capacity: u64, base_path: &str, base_format: &str) -> String {
    let (name, base_path, base_format) = (escape(name), escape(base_path), escape(base_format));
    format!(
        "<volume type='file'>
  <name>{name}</name>
  <capacity unit='bytes'>{capacity}</capacity>
  <allocation unit='bytes'>0</allocation>
  <target><format type='qcow2'/></target>
  <backingStore>
    <path>{base_path}</path>
    <format type='{base_format}'/>
  </backingStore>
</volume>
"
    )
}

/// A raw volume sized for the seed ISO.
#[must_use]
pub fn seed_volume(name: &str, capacity: u64) -> String {
    let name = escape(name);
    format!(
        "<volume type='file'>
  <name>{name}</name>
  <capacity unit='bytes'>{capacity}</capacity>
  <target><format type='raw'/></target>
</volume>
"
    )
}

/// The `<target><format type=…/>` of a volume description, if present and non-empty.
#[must_use]
pub fn volume_format(volume_xml: &str) -> Option<String> {
    let document = roxmltree::Document::parse(volume_xml).ok()?;
    let target = document
        .root_element()
        .children()
        .find(|n| n.has_tag_name("target"))?;
    let format = target.children().find(|n| n.has_tag_name("format"))?;
    format
        .attribute("type")
        .filter(|t| !t.is_empty())
        .map(str::to_owned)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec<'a>(tag: &'a Tag, network: &'a str) -> DomainSpec<'a> {
        DomainSpec {
            name: "bigfleet-0123456789abcdef01234567",
            tag,
            vcpu: 2,
            memory_mib: 4096,
            overlay_path: "/var/lib/libvirt/images/o.qcow2",
            seed_path: "/var/lib/libvirt/images/s.iso",
            network,
        }
    }

    #[test]
    fn the_domain_document_parses_and_carries_every_device() {
        let tag = Tag::new("libvirt", "libvirt/OnDemand/kvm.small/a/000");
        let xml = domain(&spec(&tag, "default"));
        let document = roxmltree::Document::parse(&xml).unwrap();
        let find =
            |name: &'static str| document.descendants().filter(move |n| n.has_tag_name(name));
        assert_eq!(find("vcpu").next().unwrap().text(), Some("2"));
        assert_eq!(find("memory").next().unwrap().text(), Some("4096"));
        assert_eq!(find("disk").count(), 2);
        let channel = find("channel").next().unwrap();
        let target = channel
            .children()
            .find(|n| n.has_tag_name("target"))
            .unwrap();
        assert_eq!(target.attribute("name"), Some(AGENT_CHANNEL));
        assert_eq!(find("serial").count(), 1);
        let metadata = find("metadata").next().unwrap();
        let tag_xml = &xml[metadata.range()];
        assert!(tag_xml.contains("machineID"), "{tag_xml}");
    }

    #[test]
    fn hostile_values_are_escaped() {
        let tag = Tag::new("p'<x>", "m&n");
        let xml = domain(&spec(&tag, "net'/><evil/>"));
        let document = roxmltree::Document::parse(&xml).unwrap();
        assert!(!document.descendants().any(|n| n.has_tag_name("evil")));
        let source = document
            .descendants()
            .find(|n| n.has_tag_name("source") && n.attribute("network").is_some())
            .unwrap();
        assert_eq!(source.attribute("network"), Some("net'/><evil/>"));
    }

    #[test]
    fn overlay_records_the_backing_format() {
        let xml = overlay_volume("v-overlay.qcow2", 1 << 30, "/b/base.img", "raw");
        let document = roxmltree::Document::parse(&xml).unwrap();
        let backing = document
            .descendants()
            .find(|n| n.has_tag_name("backingStore"))
            .unwrap();
        let format = backing
            .children()
            .find(|n| n.has_tag_name("format"))
            .unwrap();
        assert_eq!(format.attribute("type"), Some("raw"));
        assert_eq!(volume_format(&xml).as_deref(), Some("qcow2"));
        assert_eq!(
            volume_format(&seed_volume("s.iso", 2048)).as_deref(),
            Some("raw")
        );
    }

    #[test]
    fn volume_format_tolerates_missing_pieces() {
        assert_eq!(volume_format("<volume><name>x</name></volume>"), None);
        assert_eq!(
            volume_format("<volume><target><format type=''/></target></volume>"),
            None
        );
        assert_eq!(volume_format("garbage"), None);
    }
}
