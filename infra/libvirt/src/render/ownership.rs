//! The ownership tag every domain this provider defines carries in its libvirt metadata, and
//! the XML escaping every interpolated value goes through.
//!
//! The tag is a custom metadata element in namespace [`NAMESPACE`] recording the provider
//! label and the machine id (and, once Configure succeeded, the cluster id). It is the
//! only proof of ownership the adapter accepts: a domain is adopted, listed, configured or
//! deleted only if its tag names *this* provider label and the expected machine id. The
//! domain name alone is never trusted, because another process (or an operator) can define
//! a domain under any name. Child elements are matched by local name so that prefix
//! choices by libvirt do not matter, and the reference provider's `machineID`/`clusterID`
//! children are kept (a reference-era domain has no `provider` child, so it is never ours).

/// The metadata namespace URI.
pub const NAMESPACE: &str = "https://bigfleet.dev/libvirt/v1";

/// The namespace prefix and metadata key.
pub const KEY: &str = "bigfleet";

/// What the tag records.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tag {
    /// The provider label that defined the domain.
    pub provider: String,
    /// The machine (slot) id the domain serves.
    pub machine_id: String,
    /// The cluster the machine was bootstrapped into; empty when unbound.
    pub cluster_id: String,
}

impl Tag {
    /// An unbound tag.
    #[must_use]
    pub fn new(provider: &str, machine_id: &str) -> Self {
        Self {
            provider: provider.to_owned(),
            machine_id: machine_id.to_owned(),
            cluster_id: String::new(),
        }
    }

    /// Whether the tag names this provider label and machine id.
    #[must_use]
    pub fn is(&self, provider: &str, machine_id: &str) -> bool {
        self.provider == provider && self.machine_id == machine_id
    }

    /// The element embedded in `<metadata>` at define time: prefixed, with the namespace
    /// declared on the root.
    #[must_use]
    pub fn to_domain_xml(&self) -> String {
        let mut xml = format!("<{KEY}:{KEY} xmlns:{KEY}=\"{NAMESPACE}\">");
        for (name, value) in self.fields() {
            xml.push_str(&format!("<{KEY}:{name}>{}</{KEY}:{name}>", escape(value)));
        }
        xml.push_str(&format!("</{KEY}:{KEY}>"));
        xml
    }

    /// The element handed to `virDomainSetMetadata`, which adds the prefix and namespace
    /// itself from the key and URI arguments.
    #[must_use]
    pub fn to_metadata_xml(&self) -> String {
        let mut xml = format!("<{KEY}>");
        for (name, value) in self.fields() {
            xml.push_str(&format!("<{name}>{}</{name}>", escape(value)));
        }
        xml.push_str(&format!("</{KEY}>"));
        xml
    }

    fn fields(&self) -> Vec<(&'static str, &str)> {
        let mut fields = vec![
            ("provider", self.provider.as_str()),
            ("machineID", self.machine_id.as_str()),
        ];
        if !self.cluster_id.is_empty() {
            fields.push(("clusterID", self.cluster_id.as_str()));
        }
        fields
    }

    /// Parses the element libvirt returns for our namespace. `None` when it does not parse
    /// or lacks a provider or machine id: such a domain is not ours.
    #[must_use]
    pub fn parse(xml: &str) -> Option<Self> {
        let document = roxmltree::Document::parse(xml).ok()?;
        let child = |name: &str| {
            document
                .root_element()
                .children()
                .find(|n| n.is_element() && n.tag_name().name() == name)
                .and_then(|n| n.text())
                .unwrap_or_default()
                .to_owned()
        };
        let tag = Self {
            provider: child("provider"),
            machine_id: child("machineID"),
            cluster_id: child("clusterID"),
        };
        (!tag.provider.is_empty() && !tag.machine_id.is_empty()).then_some(tag)
    }
}

/// Escapes text for an XML element body or a quoted attribute value.
#[must_use]
pub fn escape(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for c in value.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escape_covers_the_five_entities() {
        assert_eq!(escape(r#"a&b<c>d"e'f"#), "a&amp;b&lt;c&gt;d&quot;e&apos;f");
        assert_eq!(escape("plain/text-1"), "plain/text-1");
    }

    #[test]
    fn both_renderings_parse_back() {
        let mut tag = Tag::new("libvirt-<dc1>", "libvirt/OnDemand/kvm.large/a&b/000");
        tag.cluster_id = "c'1".into();
        assert_eq!(Tag::parse(&tag.to_domain_xml()), Some(tag.clone()));
        assert_eq!(Tag::parse(&tag.to_metadata_xml()), Some(tag.clone()));
        // libvirt returns the element without its prefix, reformatted.
        let returned = "<bigfleet>\n  <provider>libvirt-&lt;dc1&gt;</provider>\n  \
                        <machineID>libvirt/OnDemand/kvm.large/a&amp;b/000</machineID>\n  \
                        <clusterID>c'1</clusterID>\n</bigfleet>";
        assert_eq!(Tag::parse(returned), Some(tag));
    }

    #[test]
    fn unbound_tags_omit_the_cluster() {
        let tag = Tag::new("p", "m");
        assert!(!tag.to_metadata_xml().contains("clusterID"));
        assert_eq!(Tag::parse(&tag.to_metadata_xml()).unwrap().cluster_id, "");
    }

    #[test]
    fn reference_era_and_garbage_tags_are_not_ours() {
        // The reference provider wrote only machineID: no provider label, never adopted.
        let reference = "<bigfleet><machineID>libvirt/OnDemand/kvm.large/a/000</machineID>\
                         </bigfleet>";
        assert_eq!(Tag::parse(reference), None);
        assert_eq!(
            Tag::parse("<bigfleet><provider>p</provider></bigfleet>"),
            None
        );
        assert_eq!(Tag::parse("not xml"), None);
        assert_eq!(Tag::parse(""), None);
    }

    #[test]
    fn is_checks_both_label_and_id() {
        let tag = Tag::new("p", "m");
        assert!(tag.is("p", "m"));
        assert!(!tag.is("q", "m"));
        assert!(!tag.is("p", "n"));
    }
}
