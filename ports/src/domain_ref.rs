//! The host reference the hypervisor adapters hand out: `"<zone>/<domain>"`, the zone a
//! machine's domain lives in and the domain's name. The core stores it as an opaque string
//! (`HostRef::reference`); the adapters that write it and read it back (libvirt, the fake)
//! build and split it only through [`DomainRef`], so the two sides cannot drift apart.

use std::fmt;
use std::str::FromStr;

use bigfleet_libvirt_domain::HostRef;

/// A domain in a zone, written `"<zone>/<domain>"` on the wire and in the state file.
///
/// Parsing splits at the last `/`: a domain name holds no `/`, so everything before it is
/// the zone. Either part may be empty; a reader decides what an empty zone means.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DomainRef {
    /// The zone whose host runs the domain.
    pub zone: String,
    /// The domain's name on that host.
    pub name: String,
}

/// A host reference that is not `"<zone>/<domain>"`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "host reference {reference:?} is not <zone>/<domain>: it has no '/' between the zone and \
     the domain name"
)]
pub struct DomainRefError {
    /// The reference as given.
    pub reference: String,
}

impl DomainRef {
    /// The domain `name` in `zone`.
    pub fn new(zone: impl Into<String>, name: impl Into<String>) -> Self {
        Self {
            zone: zone.into(),
            name: name.into(),
        }
    }

    /// The `HostRef` a machine carries for this domain, under the `provider` label.
    #[must_use]
    pub fn host_ref(&self, provider: &str) -> HostRef {
        HostRef {
            provider: provider.to_owned(),
            reference: self.to_string(),
        }
    }
}

impl fmt::Display for DomainRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.zone, self.name)
    }
}

impl FromStr for DomainRef {
    type Err = DomainRefError;

    fn from_str(reference: &str) -> Result<Self, Self::Err> {
        reference
            .rsplit_once('/')
            .map(|(zone, name)| Self::new(zone, name))
            .ok_or_else(|| DomainRefError {
                reference: reference.to_owned(),
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_zone_slash_name_and_reads_it_back() {
        let domain = DomainRef::new("zone-a", "bf-libvirt-0001");
        assert_eq!(domain.to_string(), "zone-a/bf-libvirt-0001");
        assert_eq!("zone-a/bf-libvirt-0001".parse(), Ok(domain.clone()));
        assert_eq!(
            domain.host_ref("libvirt"),
            HostRef {
                provider: "libvirt".to_owned(),
                reference: "zone-a/bf-libvirt-0001".to_owned(),
            }
        );
    }

    #[test]
    fn splits_at_the_last_slash_and_keeps_empty_parts() {
        assert_eq!("eu/west/dom".parse(), Ok(DomainRef::new("eu/west", "dom")));
        assert_eq!("/dom".parse(), Ok(DomainRef::new("", "dom")));
        assert_eq!("zone/".parse(), Ok(DomainRef::new("zone", "")));
    }

    #[test]
    fn a_reference_without_a_slash_is_an_error_naming_it() {
        let error = "just-a-name".parse::<DomainRef>().unwrap_err();
        assert_eq!(error.reference, "just-a-name");
        assert_eq!(
            error.to_string(),
            "host reference \"just-a-name\" is not <zone>/<domain>: it has no '/' between the \
             zone and the domain name"
        );
    }
}
