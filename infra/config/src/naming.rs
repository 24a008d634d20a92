//! Names of the things the provider creates on a host.
//!
//! A domain's name derives from the provider label *and* the machine id, so two provider
//! processes sharing a host, or one provider before and after losing its state, can never
//! compute the same name for different machines (the reference derived names from the
//! operation counter alone, which restarts at 1 without durable state).

use sha2::{Digest, Sha256};

/// The libvirt domain name for `machine_id` under provider label `provider`:
/// `bigfleet-` followed by 24 hex digits of SHA-256(provider, NUL, machine id).
#[must_use]
pub fn domain_name(provider: &str, machine_id: &str) -> String {
    let mut hasher = Sha256::new();
    hasher.update(provider.as_bytes());
    hasher.update([0]);
    hasher.update(machine_id.as_bytes());
    let digest = hasher.finalize();
    let hex: String = digest.iter().take(12).map(|b| format!("{b:02x}")).collect();
    format!("bigfleet-{hex}")
}

#[cfg(test)]
mod tests {
    use super::domain_name;

    #[test]
    fn names_are_stable_short_and_scoped_by_provider() {
        let a = domain_name("libvirt", "libvirt/OnDemand/kvm.large/local-a/000");
        assert_eq!(
            a,
            domain_name("libvirt", "libvirt/OnDemand/kvm.large/local-a/000")
        );
        assert_eq!(a.len(), "bigfleet-".len() + 24);
        assert_ne!(
            a,
            domain_name("libvirt-dc2", "libvirt/OnDemand/kvm.large/local-a/000")
        );
        assert_ne!(
            a,
            domain_name("libvirt", "libvirt/OnDemand/kvm.large/local-a/001")
        );
        // The separator keeps (ab, c) and (a, bc) apart.
        assert_ne!(domain_name("ab", "c"), domain_name("a", "bc"));
    }
}
