//! Unit tests for `identity`: SAN classification from real DER certificates (rcgen).

use bigfleet_libvirt_domain::authorization::Identity;
use rcgen::{CertificateParams, KeyPair, SanType};

use super::*;

fn der_with(sans: Vec<SanType>) -> Vec<u8> {
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.subject_alt_names = sans;
    let key = KeyPair::generate().unwrap();
    params.self_signed(&key).unwrap().der().to_vec()
}

fn uri(text: &str) -> SanType {
    SanType::URI(text.try_into().unwrap())
}

#[test]
fn identities_are_read_from_real_certificates() {
    let shard = der_with(vec![
        SanType::DnsName("shard-a.example".try_into().unwrap()),
        uri("bigfleet://shard/alpha"),
    ]);
    assert_eq!(
        PeerIdentity::from_certificates(Some(&[CertificateDer::from(shard)])).seen(),
        &Seen::One {
            identity: Identity::Shard("alpha".into()),
            raw: "bigfleet://shard/alpha".into(),
        }
    );
    let two = der_with(vec![uri("bigfleet://shard/alpha"), uri("bigfleet://admin")]);
    assert!(matches!(seen_in_der(&two), Seen::Several(s) if s.len() == 2));
    let dns_only = der_with(vec![SanType::DnsName("x.example".try_into().unwrap())]);
    assert_eq!(seen_in_der(&dns_only), Seen::Missing);
    let no_san = der_with(Vec::new());
    assert_eq!(seen_in_der(&no_san), Seen::Missing);
    assert!(matches!(seen_in_der(b"junk"), Seen::Unreadable(_)));
    assert_eq!(PeerIdentity::from_certificates(None).seen(), &Seen::Missing);
    assert_eq!(
        PeerIdentity::from_certificates(Some(&[])).seen(),
        &Seen::Missing
    );
}
