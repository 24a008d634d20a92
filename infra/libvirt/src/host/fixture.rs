//! libvirt test-driver node files: a host with a CPU/memory size, a `dir` storage pool
//! holding a base image volume, a network, and optionally node devices (PCI devices, VFs,
//! mediated devices: [`pci_device`], [`mdev_device`]), for tests, benchmarks and trying the
//! provider without a real host (`--connect test:///abs/path/node.xml`).
//!
//! Unlike `test:///default`, whose state every connection in a process shares, each
//! connection opened from a node file gets its own fresh in-memory host, so tests that
//! each write their own file cannot see each other's domains. The test driver stores no
//! volume contents and answers qemu guest-agent commands with "not supported".

use std::io;
use std::path::{Path, PathBuf};

use crate::render::ownership::escape;

/// What the fake host looks like.
#[derive(Clone, Debug)]
pub struct Fixture {
    /// Physical CPUs.
    pub cpus: u32,
    /// Memory in MiB.
    pub memory_mib: u64,
    /// Storage pool name.
    pub pool: String,
    /// Storage pool directory (nothing is written there).
    pub pool_path: String,
    /// Base image volume name.
    pub base_volume: String,
    /// Base image virtual size in bytes.
    pub base_capacity: u64,
    /// Base image format.
    pub base_format: String,
    /// Network name.
    pub network: String,
    /// Extra `<domain>` documents defined at open (for foreign or leftover domains).
    pub domains: Vec<String>,
    /// Extra `<pool>` documents (e.g. [`rbd_pool`]).
    pub pools: Vec<String>,
    /// Node `<device>` documents (e.g. [`pci_device`]).
    pub devices: Vec<String>,
}

/// A PCI node device at `0000:<bus>:00.<function>` with `ids` (vendor, product), in IOMMU
/// group `bus` when `iommu`; a VF of the device at function 0 when `vf`. (The test driver
/// keeps no driver binding: every such device reads as bound to none.)
#[must_use]
pub fn pci_device(
    (bus, function): (u8, u8),
    (vendor, product): (u16, u16),
    (vf, iommu): (bool, bool),
) -> String {
    let address = |f: u8| {
        format!("<address domain='0x0000' bus='0x{bus:02x}' slot='0x00' function='0x{f:x}'/>")
    };
    let physical = if vf {
        format!(
            "\n    <capability type='phys_function'>{}</capability>",
            address(0)
        )
    } else {
        String::new()
    };
    let group = if iommu {
        format!(
            "\n    <iommuGroup number='{bus}'>{}</iommuGroup>",
            address(function)
        )
    } else {
        String::new()
    };
    format!(
        "<device>
  <name>pci_0000_{bus:02x}_00_{function:x}</name>
  <parent>computer</parent>
  <capability type='pci'>
    <domain>0</domain><bus>{bus}</bus><slot>0</slot><function>{function}</function>
    <product id='0x{product:04x}'/>
    <vendor id='0x{vendor:04x}'/>{physical}{group}
  </capability>
</device>
"
    )
}

/// A mediated device of `mdev_type` with `uuid` on the PCI device `pci_0000_<bus>_00_0`.
#[must_use]
pub fn mdev_device(uuid: &str, mdev_type: &str, bus: u8) -> String {
    format!(
        "<device>
  <name>mdev_{}</name>
  <parent>pci_0000_{bus:02x}_00_0</parent>
  <capability type='mdev'>
    <type id='{}'/>
    <uuid>{}</uuid>
    <iommuGroup number='{bus}'/>
  </capability>
</device>
",
        uuid.replace('-', "_"),
        escape(mdev_type),
        escape(uuid)
    )
}

/// An rbd pool `name` on Ceph pool `bigfleet` (monitor 127.0.0.1:6789, cephx user
/// `libvirt` with secret [`RBD_SECRET`]), holding a raw golden image `golden` of
/// `golden_bytes`. The test driver keeps the definition and its volumes in memory; it
/// clones within the pool like the rbd backend, and cannot resize or hold secrets.
#[must_use]
pub fn rbd_pool(name: &str, golden: &str, golden_bytes: u64) -> String {
    format!(
        "<pool type='rbd'>
    <name>{}</name>
    <capacity unit='TiB'>10</capacity>
    <available unit='TiB'>10</available>
    <source>
      <host name='127.0.0.1' port='6789'/>
      <name>bigfleet</name>
      <auth type='ceph' username='libvirt'><secret uuid='{RBD_SECRET}'/></auth>
    </source>
    <volume type='network'>
      <name>{}</name>
      <capacity unit='bytes'>{golden_bytes}</capacity>
      <allocation unit='bytes'>0</allocation>
      <target><format type='raw'/></target>
    </volume>
  </pool>
",
        escape(name),
        escape(golden)
    )
}

/// The libvirt secret UUID of [`rbd_pool`]'s cephx user.
pub const RBD_SECRET: &str = "2a5a7b3e-3c1e-4b0f-9d3c-7f1e5b2a9c10";

impl Default for Fixture {
    fn default() -> Self {
        Self {
            cpus: 16,
            memory_mib: 64 * 1024,
            pool: "default".to_owned(),
            pool_path: "/var/lib/libvirt/images".to_owned(),
            base_volume: "base.qcow2".to_owned(),
            base_capacity: 10 << 30,
            base_format: "qcow2".to_owned(),
            network: "default".to_owned(),
            domains: Vec::new(),
            pools: Vec::new(),
            devices: Vec::new(),
        }
    }
}

impl Fixture {
    /// The `<node>` document.
    #[must_use]
    pub fn node_xml(&self) -> String {
        let domains: String = self.domains.concat();
        let pools: String = self.pools.concat();
        let devices: String = self.devices.concat();
        format!(
            "<node>
  <cpu><nodes>1</nodes><sockets>1</sockets><cores>{cpus}</cores><threads>1</threads>
    <mhz>2000</mhz><model>x86_64</model></cpu>
  <memory>{memory_kib}</memory>
  <network>
    <name>{network}</name>
    <bridge name='virbr0'/>
    <forward/>
    <ip address='192.168.122.1' netmask='255.255.255.0'/>
  </network>
  <pool type='dir'>
    <name>{pool}</name>
    <capacity unit='TiB'>10</capacity>
    <available unit='TiB'>10</available>
    <target><path>{pool_path}</path></target>
    <volume type='file'>
      <name>{base}</name>
      <capacity unit='bytes'>{base_capacity}</capacity>
      <allocation unit='bytes'>{base_capacity}</allocation>
      <target><format type='{base_format}'/></target>
    </volume>
  </pool>
{pools}{domains}{devices}</node>
",
            cpus = self.cpus,
            memory_kib = self.memory_mib * 1024,
            network = escape(&self.network),
            pool = escape(&self.pool),
            pool_path = escape(&self.pool_path),
            base = escape(&self.base_volume),
            base_capacity = self.base_capacity,
            base_format = escape(&self.base_format),
        )
    }

    /// Writes the node file into `dir` as `name` and returns its `test://` URI.
    ///
    /// # Errors
    /// When the file cannot be written.
    pub fn write(&self, dir: &Path, name: &str) -> io::Result<String> {
        let path = dir.join(name);
        std::fs::write(&path, self.node_xml())?;
        Ok(uri(&path))
    }
}

/// The test-driver URI of an absolute node file path (`test:///abs/path/node.xml`).
#[must_use]
pub fn uri(path: &Path) -> String {
    let absolute: PathBuf = std::path::absolute(path).unwrap_or_else(|_| path.to_owned());
    format!("test://{}", absolute.display())
}
