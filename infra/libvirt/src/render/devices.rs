//! A domain's CPU and NICs rendered into the domain XML (the operator's choices themselves
//! are `options::devices`), and the MAC address each NIC gets.
//!
//! A MAC derives from the provider label, the machine id and the NIC's index, so re-creating
//! the same slot gives its NICs the same addresses (DHCP reservations hold) while two slots
//! never share one: [`MacBook`] resolves the rare hash collision among the configured slots
//! once, at start-up, in machine-id order. Addresses are locally administered unicast
//! (`x2:`, `x6:`, `xA:` or `xE:` first octet), 46 bits from SHA-256.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use sha2::{Digest, Sha256};

use crate::render::ownership::escape;

pub use crate::options::devices::{CpuChoice, CpuMode, DirectMode, NicSource};

/// One NIC of one domain.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Nic {
    /// Where it plugs in.
    pub source: NicSource,
    /// Its MAC address.
    pub mac: Mac,
    /// Its 802.1Q tag (a static address pool's `vlan`, first NIC only).
    pub vlan: Option<u16>,
}

impl Nic {
    /// The `<interface>` element.
    #[must_use]
    pub fn to_xml(&self) -> String {
        let (kind, source) = match &self.source {
            NicSource::Network(name) => {
                ("network", format!("<source network='{}'/>", escape(name)))
            }
            NicSource::Bridge(name) => ("bridge", format!("<source bridge='{}'/>", escape(name))),
            NicSource::Ovs(name) => (
                "bridge",
                format!(
                    "<source bridge='{}'/>\n      <virtualport type='openvswitch'/>",
                    escape(name)
                ),
            ),
            NicSource::Direct { device, mode } => (
                "direct",
                format!(
                    "<source dev='{}' mode='{}'/>",
                    escape(device),
                    mode.as_str()
                ),
            ),
        };
        let vlan = (self.vlan)
            .map(|tag| format!("\n      <vlan>\n        <tag id='{tag}'/>\n      </vlan>"))
            .unwrap_or_default();
        format!(
            "\n    <interface type='{kind}'>
      <mac address='{}'/>
      {source}{vlan}
      <model type='virtio'/>
    </interface>",
            self.mac
        )
    }
}

/// A MAC address.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Mac(pub [u8; 6]);

impl fmt::Display for Mac {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let [a, b, c, d, e, g] = self.0;
        write!(f, "{a:02x}:{b:02x}:{c:02x}:{d:02x}:{e:02x}:{g:02x}")
    }
}

impl Mac {
    /// The address of NIC `index` of `machine_id` under `provider`, at collision-resolution
    /// `attempt` (0 unless [`MacBook`] found a collision).
    #[must_use]
    pub fn derive(provider: &str, machine_id: &str, index: usize, attempt: u32) -> Self {
        let mut hasher = Sha256::new();
        for part in [
            b"bigfleet-mac".as_slice(),
            provider.as_bytes(),
            machine_id.as_bytes(),
        ] {
            hasher.update(part);
            hasher.update([0]);
        }
        hasher.update(u64::try_from(index).unwrap_or(u64::MAX).to_le_bytes());
        hasher.update(attempt.to_le_bytes());
        let digest = hasher.finalize();
        let mut mac = [0; 6];
        mac.copy_from_slice(&digest[..6]);
        // Unicast (bit 0 clear), locally administered (bit 1 set).
        mac[0] = (mac[0] & 0xfc) | 0x02;
        Self(mac)
    }
}

/// The MAC address of every NIC of every configured slot, collision-free.
#[derive(Clone, Debug, Default)]
pub struct MacBook {
    provider: String,
    assigned: BTreeMap<(String, usize), Mac>,
}

impl MacBook {
    /// Assigns addresses to `nics` (machine id, NIC count) in machine-id order: a derived
    /// address already taken is derived again with the next attempt number. A slot keeps its
    /// addresses as long as no slot sorting before it collides with it (at 100,000 NICs the
    /// chance that any pair collides is below 1 in 10,000).
    #[must_use]
    pub fn new<'a>(provider: &str, nics: impl IntoIterator<Item = (&'a str, usize)>) -> Self {
        let wanted: BTreeSet<(&str, usize)> = nics
            .into_iter()
            .flat_map(|(id, count)| (0..count).map(move |index| (id, index)))
            .collect();
        let mut taken = BTreeSet::new();
        let mut assigned = BTreeMap::new();
        for (id, index) in wanted {
            let mac = first_free(provider, id, index, &taken);
            taken.insert(mac);
            assigned.insert((id.to_owned(), index), mac);
        }
        Self {
            provider: provider.to_owned(),
            assigned,
        }
    }

    /// The address of NIC `index` of `machine_id` (derived afresh for a machine that is not
    /// a configured slot).
    #[must_use]
    pub fn mac(&self, machine_id: &str, index: usize) -> Mac {
        self.assigned
            .get(&(machine_id.to_owned(), index))
            .copied()
            .unwrap_or_else(|| Mac::derive(&self.provider, machine_id, index, 0))
    }
}

impl CpuChoice {
    /// The `<cpu>` element.
    #[must_use]
    pub fn to_xml(&self) -> String {
        let features: String = self
            .features
            .iter()
            .map(|(on, name)| {
                let policy = if *on { "require" } else { "disable" };
                format!("\n    <feature policy='{policy}' name='{}'/>", escape(name))
            })
            .collect();
        let (open, model) = match &self.mode {
            CpuMode::HostPassthrough => {
                ("<cpu mode='host-passthrough' check='none'", String::new())
            }
            CpuMode::HostModel => ("<cpu mode='host-model'", String::new()),
            CpuMode::Custom(model) => (
                "<cpu mode='custom' match='exact' check='partial'",
                format!("\n    <model fallback='forbid'>{}</model>", escape(model)),
            ),
        };
        if model.is_empty() && features.is_empty() {
            format!("\n  {open}/>")
        } else {
            format!("\n  {open}>{model}{features}\n  </cpu>")
        }
    }
}

/// The first derivation of NIC `index` of `id` that is not `taken`.
fn first_free(provider: &str, id: &str, index: usize, taken: &BTreeSet<Mac>) -> Mac {
    (0..)
        .map(|attempt| Mac::derive(provider, id, index, attempt))
        .find(|mac| !taken.contains(mac))
        .expect("2^46 addresses outnumber the slots")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nic_sources_parse_and_print_back() {
        for (text, printed) in [
            ("network=default", "network=default"),
            ("bridge=br0", "bridge=br0"),
            ("direct=eth0", "direct=eth0:bridge"),
            ("direct=eth1:vepa", "direct=eth1:vepa"),
            ("direct=eth2:passthrough", "direct=eth2:passthrough"),
        ] {
            assert_eq!(NicSource::parse(text).unwrap().to_string(), printed);
        }
        for (bad, says) in [
            ("default", "has no '='"),
            ("bridge=", "names no bridge"),
            ("wifi=wlan0", "unknown source \"wifi\""),
            ("direct=eth0:loud", "unknown macvtap mode \"loud\""),
            ("direct=:vepa", "names no device"),
        ] {
            let error = NicSource::parse(bad).unwrap_err();
            assert!(error.contains(says), "{bad}: {error}");
            assert!(error.contains("network=NAME, bridge=NAME"), "{error}");
        }
    }

    #[test]
    fn each_source_renders_its_interface_element() {
        let mac = Mac([0x02, 1, 2, 3, 4, 5]);
        let rendered = |source: &str| {
            let nic = Nic {
                source: NicSource::parse(source).unwrap(),
                mac,
                vlan: None,
            };
            let xml = format!("<devices>{}</devices>", nic.to_xml());
            let document = roxmltree::Document::parse(&xml).unwrap();
            let interface = document
                .descendants()
                .find(|n| n.has_tag_name("interface"))
                .unwrap();
            let child = |name: &str| interface.children().find(|n| n.has_tag_name(name)).unwrap();
            let source = child("source");
            let attributes: Vec<(String, String)> = source
                .attributes()
                .map(|a| (a.name().to_owned(), a.value().to_owned()))
                .collect();
            (
                interface.attribute("type").unwrap().to_owned(),
                attributes,
                child("mac").attribute("address").unwrap().to_owned(),
                child("model").attribute("type").unwrap().to_owned(),
            )
        };
        let pair = |k: &str, v: &str| (k.to_owned(), v.to_owned());
        let mac = "02:01:02:03:04:05".to_owned();
        let virtio = "virtio".to_owned();
        assert_eq!(
            rendered("network=net'<x>"),
            (
                "network".to_owned(),
                vec![pair("network", "net'<x>")],
                mac.clone(),
                virtio.clone()
            )
        );
        assert_eq!(
            rendered("bridge=br0"),
            (
                "bridge".to_owned(),
                vec![pair("bridge", "br0")],
                mac.clone(),
                virtio.clone()
            )
        );
        assert_eq!(
            rendered("direct=eth0:private"),
            (
                "direct".to_owned(),
                vec![pair("dev", "eth0"), pair("mode", "private")],
                mac,
                virtio
            )
        );
    }

    #[test]
    fn macs_are_stable_local_unicast_and_differ_per_machine_and_nic() {
        let a = Mac::derive("libvirt", "libvirt/OnDemand/kvm.small/a/000", 0, 0);
        assert_eq!(
            a,
            Mac::derive("libvirt", "libvirt/OnDemand/kvm.small/a/000", 0, 0)
        );
        assert_eq!(a.0[0] & 0x03, 0x02, "locally administered unicast: {a}");
        let others = [
            Mac::derive("libvirt", "libvirt/OnDemand/kvm.small/a/001", 0, 0),
            Mac::derive("libvirt", "libvirt/OnDemand/kvm.small/a/000", 1, 0),
            Mac::derive("libvirt-2", "libvirt/OnDemand/kvm.small/a/000", 0, 0),
            Mac::derive("libvirt", "libvirt/OnDemand/kvm.small/a/000", 0, 1),
        ];
        assert!(others.iter().all(|m| *m != a), "{a} {others:?}");
        assert_eq!(a.to_string().len(), 17);
    }

    #[test]
    fn the_mac_book_gives_every_nic_of_every_slot_its_own_address() {
        let ids: Vec<String> = (0..20_000)
            .map(|i| format!("p/OnDemand/kvm.small/z/{i:05}"))
            .collect();
        let book = MacBook::new("p", ids.iter().map(|id| (id.as_str(), 2)));
        let all: BTreeSet<Mac> = ids
            .iter()
            .flat_map(|id| [book.mac(id, 0), book.mac(id, 1)])
            .collect();
        assert_eq!(all.len(), 40_000);
        assert_eq!(book.mac(&ids[7], 1), Mac::derive("p", &ids[7], 1, 0));
        assert_eq!(
            book.mac("p/not/a/slot", 0),
            Mac::derive("p", "p/not/a/slot", 0, 0)
        );
    }

    #[test]
    fn a_taken_address_is_derived_again_with_the_next_attempt() {
        let first = Mac::derive("p", "a", 0, 0);
        let second = Mac::derive("p", "a", 0, 1);
        assert_eq!(first_free("p", "a", 0, &BTreeSet::new()), first);
        assert_eq!(first_free("p", "a", 0, &BTreeSet::from([first])), second);
        let both = BTreeSet::from([first, second]);
        assert_eq!(first_free("p", "a", 0, &both), Mac::derive("p", "a", 0, 2));
    }

    #[test]
    fn cpu_choices_parse_render_and_print_back() {
        for text in [
            "host-passthrough",
            "host-model",
            "qemu64",
            "host-passthrough,-arch-capabilities",
            "Skylake-Server-IBRS,+pcid,-hle",
        ] {
            assert_eq!(CpuChoice::parse(text).unwrap().to_string(), text);
        }
        let passthrough = CpuChoice::parse("host-passthrough").unwrap();
        assert_eq!(
            passthrough.to_xml(),
            "\n  <cpu mode='host-passthrough' check='none'/>"
        );
        assert!(passthrough.needs_kvm());
        let custom = CpuChoice::parse("Skylake-Server-IBRS,+pcid,-hle").unwrap();
        assert!(!custom.needs_kvm());
        let xml = custom.to_xml();
        let document = roxmltree::Document::parse(xml.trim()).unwrap();
        let cpu = document.root_element();
        assert_eq!(cpu.attribute("mode"), Some("custom"));
        let model = cpu.children().find(|n| n.has_tag_name("model")).unwrap();
        assert_eq!(model.text(), Some("Skylake-Server-IBRS"));
        assert_eq!(model.attribute("fallback"), Some("forbid"));
        let features: Vec<_> = cpu
            .children()
            .filter(|n| n.has_tag_name("feature"))
            .map(|f| (f.attribute("policy").unwrap(), f.attribute("name").unwrap()))
            .collect();
        assert_eq!(features, [("require", "pcid"), ("disable", "hle")]);
        for (bad, says) in [
            ("", "names no mode"),
            ("host-model,pcid", "must be +name"),
            ("qemu64,+", "must be +name"),
        ] {
            let error = CpuChoice::parse(bad).unwrap_err();
            assert!(error.contains(says), "{bad:?}: {error}");
        }
    }
}
