//! The authorization table (`domain/src/authorization.rs`): every cell of it, SAN
//! classification, and the bounds and escaping of what a refusal quotes.

use bigfleet_libvirt_domain::authorization::{Access, Identity, Reason, Seen, authorize, shown};

fn one(raw: &str) -> Seen {
    Seen::from_uris([raw])
}

const MUTATIONS: [&str; 4] = ["Create", "Configure", "Drain", "Delete"];
const READS: [&str; 2] = ["Get", "List"];

fn reason(peer: &Seen, method: &str, access: Access<'_>) -> Option<Reason> {
    authorize(peer, method, access).err().map(|d| d.reason)
}

#[test]
fn a_shard_mutates_only_under_its_own_shard_id_and_reads_everything() {
    let alpha = one("bigfleet://shard/alpha");
    for method in MUTATIONS {
        let own = Access::Mutate { shard_id: "alpha" };
        assert_eq!(reason(&alpha, method, own), None, "{method}");
        let other = Access::Mutate { shard_id: "beta" };
        assert_eq!(
            reason(&alpha, method, other),
            Some(Reason::ShardMismatch),
            "{method}"
        );
        let prefix = Access::Mutate { shard_id: "alph" };
        assert_eq!(
            reason(&alpha, method, prefix),
            Some(Reason::ShardMismatch),
            "{method}"
        );
        let unfenced = Access::Mutate { shard_id: "" };
        assert_eq!(
            reason(&alpha, method, unfenced),
            Some(Reason::Unfenced),
            "{method}"
        );
    }
    for method in READS {
        assert_eq!(reason(&alpha, method, Access::Read), None, "{method}");
    }
}

#[test]
fn admin_does_everything_fenced_or_not() {
    let admin = one("bigfleet://admin");
    for method in MUTATIONS {
        for shard_id in ["", "alpha", "beta"] {
            let access = Access::Mutate { shard_id };
            assert_eq!(reason(&admin, method, access), None, "{method} {shard_id}");
        }
    }
    for method in READS {
        assert_eq!(reason(&admin, method, Access::Read), None, "{method}");
    }
}

#[test]
fn readonly_and_cluster_identities_only_read() {
    for raw in ["bigfleet://readonly", "bigfleet://cluster/prod-1"] {
        let peer = one(raw);
        for method in MUTATIONS {
            for shard_id in ["", "prod-1", "alpha"] {
                let access = Access::Mutate { shard_id };
                assert_eq!(
                    reason(&peer, method, access),
                    Some(Reason::NotAShard),
                    "{raw} {method} {shard_id}"
                );
            }
        }
        for method in READS {
            assert_eq!(reason(&peer, method, Access::Read), None, "{raw} {method}");
        }
    }
}

#[test]
fn no_several_or_unknown_identities_are_refused_everything() {
    let cases = [
        (Seen::from_uris([]), Reason::NoIdentity),
        (
            Seen::from_uris(["spiffe://example.org/shard", "https://bigfleet.dev/"]),
            Reason::NoIdentity,
        ),
        (
            Seen::from_uris(["bigfleet://shard/alpha", "bigfleet://admin"]),
            Reason::SeveralIdentities,
        ),
        (
            Seen::from_uris(["bigfleet://shard/alpha", "BIGFLEET://shard/alpha"]),
            Reason::SeveralIdentities,
        ),
        (one("bigfleet://root"), Reason::UnrecognisedIdentity),
        (one("bigfleet://shard/"), Reason::UnrecognisedIdentity),
        (one("bigfleet://cluster/"), Reason::UnrecognisedIdentity),
        (one("bigfleet://Admin"), Reason::UnrecognisedIdentity),
        (
            Seen::Unreadable("broken".into()),
            Reason::UnreadableCertificate,
        ),
    ];
    for (peer, want) in cases {
        for method in READS {
            assert_eq!(reason(&peer, method, Access::Read), Some(want), "{peer:?}");
        }
        for method in MUTATIONS {
            let access = Access::Mutate { shard_id: "alpha" };
            assert_eq!(reason(&peer, method, access), Some(want), "{peer:?}");
        }
    }
}

#[test]
fn the_scheme_is_case_insensitive_and_other_schemes_are_ignored() {
    let peer = Seen::from_uris(["https://example.org", "BigFleet://shard/alpha"]);
    assert_eq!(
        peer,
        Seen::One {
            identity: Identity::Shard("alpha".into()),
            raw: "BigFleet://shard/alpha".into(),
        }
    );
    // The id is everything after `shard/`, as written.
    assert_eq!(
        one("bigfleet://shard/eu/west%2F1"),
        Seen::One {
            identity: Identity::Shard("eu/west%2F1".into()),
            raw: "bigfleet://shard/eu/west%2F1".into(),
        }
    );
}

#[test]
fn messages_name_the_identity_seen_and_what_the_call_needed() {
    let alpha = one("bigfleet://shard/alpha");
    let denial = authorize(&alpha, "Create", Access::Mutate { shard_id: "beta" }).unwrap_err();
    assert_eq!(
        denial.to_string(),
        "permission denied: client identity \"bigfleet://shard/alpha\" may not act for shard \
         \"beta\"; Create for shard \"beta\" needs bigfleet://shard/beta or bigfleet://admin"
    );
    assert_eq!(denial.identity, "bigfleet://shard/alpha");
    let unfenced = authorize(&alpha, "Drain", Access::Mutate { shard_id: "" }).unwrap_err();
    assert!(
        unfenced.to_string().contains("sent no shard_id")
            && unfenced.to_string().contains("unfenced Drain"),
        "{unfenced}"
    );
    let readonly = one("bigfleet://readonly");
    let denial = authorize(&readonly, "Delete", Access::Mutate { shard_id: "a" }).unwrap_err();
    assert!(
        denial
            .to_string()
            .contains("\"bigfleet://readonly\" may only read"),
        "{denial}"
    );
    let none = authorize(&Seen::Missing, "Get", Access::Read).unwrap_err();
    assert!(
        none.to_string().contains("no bigfleet:// URI SAN")
            && none.to_string().contains("Get needs"),
        "{none}"
    );
    let several = Seen::from_uris(["bigfleet://shard/a", "bigfleet://admin"]);
    let denial = authorize(&several, "List", Access::Read).unwrap_err();
    assert!(
        denial
            .to_string()
            .contains("2 bigfleet:// URI SANs (\"bigfleet://shard/a\", \"bigfleet://admin\")"),
        "{denial}"
    );
}

#[test]
fn quoted_caller_text_is_escaped_and_bounded() {
    let hostile = format!("bigfleet://shard/{}\n\u{1b}[31m", "x".repeat(5000));
    let peer = one(&hostile);
    let denial = authorize(&peer, "Create", Access::Mutate { shard_id: "y" }).unwrap_err();
    let text = denial.to_string();
    assert!(text.len() < 600, "{} bytes: {text}", text.len());
    assert!(!text.contains('\n') && !text.contains('\u{1b}'), "{text}");
    assert!(denial.identity.ends_with('…'), "{}", denial.identity);
    assert_eq!(shown("a\"b\nc"), "\"a\\\"b\\nc\"");
    let long_shard = "s".repeat(10_000);
    let alpha = one("bigfleet://shard/alpha");
    let denial = authorize(
        &alpha,
        "Create",
        Access::Mutate {
            shard_id: &long_shard,
        },
    )
    .unwrap_err();
    assert!(denial.to_string().len() < 600, "{denial}");
    let many: Vec<String> = (0..50).map(|i| format!("bigfleet://shard/{i}")).collect();
    let peer = Seen::from_uris(many.iter().map(String::as_str));
    let denial = authorize(&peer, "Get", Access::Read).unwrap_err();
    assert!(denial.to_string().len() < 600, "{denial}");
    assert!(
        denial.to_string().contains("50 bigfleet:// URI SANs"),
        "{denial}"
    );
}
