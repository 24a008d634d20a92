//! The authorization table: who may call what under a client identity (docs/contract.md
//! §12), a contract decision like the others in this crate. The gRPC adapter reads the
//! identity out of the client certificate (`infra/grpc/src/identity.rs`) and hands it here
//! as the URIs of its subject alternative names.
//!
//! A verified client certificate proves only that the client CA signed it. Without more, any
//! such client could send a Create with a high fencing token under another shard's id and so
//! fence that shard out, or drive any machine. BigFleet gives every client certificate
//! exactly one URI SAN of scheme `bigfleet://` naming the caller: `bigfleet://shard/<id>`,
//! `bigfleet://admin`, `bigfleet://readonly` or `bigfleet://cluster/<id>`. [`Seen::from_uris`]
//! classifies a certificate's SANs, and [`authorize`] decides each call:
//!
//! | identity | Create / Configure / Drain / Delete | Get / List |
//! |---|---|---|
//! | `shard/S` | only when the request's `shard_id` is exactly `S` | yes |
//! | `admin` | yes, fenced or not | yes |
//! | `readonly`, `cluster/…` | no | yes |
//! | none, several, or not one of the above | no | no |
//!
//! The id after `shard/` is compared byte for byte with the request's `shard_id` (no
//! percent-decoding, no case folding): the SAN must be exactly `bigfleet://shard/<shard_id>`.
//! The decision is a pure function; the gRPC layer maps a [`Denial`] to its status code.

use std::fmt;

/// Whether the caller's identity is checked on every RPC (`--client-identity`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum IdentityMode {
    /// Every verified client may call every RPC for any shard (plaintext, TLS without a
    /// client CA, or mTLS with `--client-identity=off`).
    #[default]
    Off,
    /// Calls are allowed by the table in this module's documentation.
    Enforce,
}

impl IdentityMode {
    /// `enforce` or `off`, as the flag and the serving line spell it.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::Off => "off",
            Self::Enforce => "enforce",
        }
    }
}

/// A well-formed caller identity.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Identity {
    /// `bigfleet://shard/<id>`: one shard; may mutate only under its own `shard_id`.
    Shard(String),
    /// `bigfleet://admin`: may do anything.
    Admin,
    /// `bigfleet://readonly`: may only read.
    Readonly,
    /// `bigfleet://cluster/<id>`: an operator of one cluster; may only read here.
    Cluster(String),
}

/// What the client certificate of a connection says about its caller.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Seen {
    /// Exactly one `bigfleet://` URI SAN, of a known form. `raw` is the SAN as written.
    One {
        /// The parsed identity.
        identity: Identity,
        /// The SAN as it appears in the certificate.
        raw: String,
    },
    /// No client certificate, or one without any `bigfleet://` URI SAN.
    Missing,
    /// More than one `bigfleet://` URI SAN (each as written).
    Several(Vec<String>),
    /// One `bigfleet://` URI SAN that names none of the known identities.
    Unrecognised(String),
    /// The certificate's extensions could not be read (why, as text).
    Unreadable(String),
}

const SCHEME: &str = "bigfleet://";

/// Whether `uri` has the `bigfleet` scheme (schemes are case-insensitive).
fn is_bigfleet(uri: &str) -> bool {
    uri.get(..SCHEME.len())
        .is_some_and(|head| head.eq_ignore_ascii_case(SCHEME))
}

/// Parses the part after `bigfleet://`; `None` when it is not a known identity.
fn parse(rest: &str) -> Option<Identity> {
    match rest {
        "admin" => Some(Identity::Admin),
        "readonly" => Some(Identity::Readonly),
        _ => {
            if let Some(id) = rest.strip_prefix("shard/") {
                (!id.is_empty()).then(|| Identity::Shard(id.to_owned()))
            } else if let Some(id) = rest.strip_prefix("cluster/") {
                (!id.is_empty()).then(|| Identity::Cluster(id.to_owned()))
            } else {
                None
            }
        }
    }
}

impl Seen {
    /// Classifies a certificate's URI SANs; URIs of other schemes are ignored.
    pub fn from_uris<'a>(uris: impl IntoIterator<Item = &'a str>) -> Self {
        let mut ours: Vec<String> = uris
            .into_iter()
            .filter(|uri| is_bigfleet(uri))
            .map(str::to_owned)
            .collect();
        match ours.len() {
            0 => Self::Missing,
            1 => {
                let raw = ours.remove(0);
                match parse(&raw[SCHEME.len()..]) {
                    Some(identity) => Self::One { identity, raw },
                    None => Self::Unrecognised(raw),
                }
            }
            _ => Self::Several(ours),
        }
    }
}

/// What a call needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access<'a> {
    /// Get or List.
    Read,
    /// Create, Configure, Drain or Delete, with the request's `shard_id`.
    Mutate {
        /// The request's `shard_id` (empty: an unfenced call).
        shard_id: &'a str,
    },
}

/// Why a call was refused; also the `reason` label of `bigfleet_libvirt_authz_denied_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reason {
    /// No `bigfleet://` URI SAN.
    NoIdentity,
    /// More than one `bigfleet://` URI SAN.
    SeveralIdentities,
    /// A `bigfleet://` URI SAN that is not a known identity.
    UnrecognisedIdentity,
    /// The certificate's extensions could not be read.
    UnreadableCertificate,
    /// `readonly` or `cluster/…` asked to mutate.
    NotAShard,
    /// `shard/S` mutating under another shard's id.
    ShardMismatch,
    /// `shard/S` mutating with an empty `shard_id`.
    Unfenced,
}

impl Reason {
    /// Every reason a call can be refused for: a read only for a missing or unusable
    /// identity, a mutation for any reason.
    #[must_use]
    pub fn possible(mutating: bool) -> &'static [Reason] {
        const ANY_CALL: [Reason; 4] = [
            Reason::NoIdentity,
            Reason::SeveralIdentities,
            Reason::UnrecognisedIdentity,
            Reason::UnreadableCertificate,
        ];
        const MUTATION: [Reason; 7] = [
            Reason::NoIdentity,
            Reason::SeveralIdentities,
            Reason::UnrecognisedIdentity,
            Reason::UnreadableCertificate,
            Reason::NotAShard,
            Reason::ShardMismatch,
            Reason::Unfenced,
        ];
        if mutating { &MUTATION } else { &ANY_CALL }
    }

    /// The metric label.
    #[must_use]
    pub fn label(self) -> &'static str {
        match self {
            Self::NoIdentity => "no_identity",
            Self::SeveralIdentities => "several_identities",
            Self::UnrecognisedIdentity => "unrecognised_identity",
            Self::UnreadableCertificate => "unreadable_certificate",
            Self::NotAShard => "not_a_shard",
            Self::ShardMismatch => "shard_mismatch",
            Self::Unfenced => "unfenced",
        }
    }
}

/// A refused call: what was seen and what the call needed. Its text is the status message
/// and the log line; every caller-supplied string in it is escaped and bounded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Denial {
    /// Why.
    pub reason: Reason,
    /// The identity seen, escaped and bounded, unquoted (for logs and spans).
    pub identity: String,
    message: String,
}

impl fmt::Display for Denial {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

/// Longest caller-supplied text quoted in a message, in characters.
pub const SHOWN_CHARS: usize = 96;

/// At most this many SANs are quoted when a certificate has several.
const SHOWN_SANS: usize = 3;

/// `text` escaped (as Rust escapes a string literal) and cut to [`SHOWN_CHARS`] characters;
/// an ellipsis marks a cut.
#[must_use]
pub fn escaped(text: &str) -> String {
    let mut out = String::new();
    for (i, c) in text.chars().enumerate() {
        if i == SHOWN_CHARS {
            out.push('…');
            break;
        }
        out.extend(c.escape_debug());
    }
    out
}

/// [`escaped`] in double quotes.
#[must_use]
pub fn shown(text: &str) -> String {
    format!("\"{}\"", escaped(text))
}

const KNOWN: &str =
    "bigfleet://shard/<shard_id>, bigfleet://admin, bigfleet://readonly or bigfleet://cluster/<id>";

/// What `access` needs, in words, for `method`.
fn needs(method: &str, access: Access<'_>) -> String {
    match access {
        Access::Read => format!("{method} needs a client certificate with exactly one of {KNOWN}"),
        Access::Mutate { shard_id: "" } => format!(
            "an unfenced {method} (empty shard_id) needs bigfleet://admin; a shard must send its own shard_id"
        ),
        Access::Mutate { shard_id } => format!(
            "{method} for shard {} needs bigfleet://shard/{} or bigfleet://admin",
            shown(shard_id),
            escaped(shard_id),
        ),
    }
}

/// Decides one call: `Ok` to go ahead, or the [`Denial`] to answer with.
///
/// # Errors
/// The refusal, by the table in this module's documentation.
pub fn authorize(peer: &Seen, method: &str, access: Access<'_>) -> Result<(), Denial> {
    let deny = |(reason, identity, what): Refusal| Denial {
        reason,
        identity,
        message: format!("permission denied: {what}; {}", needs(method, access)),
    };
    let (identity, raw) = usable(peer).map_err(deny)?;
    match access {
        Access::Read => Ok(()),
        Access::Mutate { shard_id } => may_mutate(identity, raw, shard_id).map_err(deny),
    }
}

/// A refusal before it is worded for its call: why, the identity as logs show it, and what
/// was wrong with it.
type Refusal = (Reason, String, String);

/// The one identity a certificate names (and its SAN as written), or why it names none
/// that may call anything.
fn usable(peer: &Seen) -> Result<(&Identity, &str), Refusal> {
    match peer {
        Seen::One { identity, raw } => Ok((identity, raw)),
        Seen::Missing => Err((
            Reason::NoIdentity,
            "(none)".to_owned(),
            "the client certificate carries no bigfleet:// URI SAN".to_owned(),
        )),
        Seen::Several(sans) => {
            let mut listed: Vec<String> = sans.iter().take(SHOWN_SANS).map(|s| shown(s)).collect();
            if sans.len() > SHOWN_SANS {
                listed.push("…".to_owned());
            }
            let listed = listed.join(", ");
            let plain: Vec<String> = sans.iter().take(SHOWN_SANS).map(|s| escaped(s)).collect();
            Err((
                Reason::SeveralIdentities,
                plain.join(", "),
                format!(
                    "the client certificate carries {} bigfleet:// URI SANs ({listed}), so no single identity",
                    sans.len()
                ),
            ))
        }
        Seen::Unrecognised(raw) => Err((
            Reason::UnrecognisedIdentity,
            escaped(raw),
            format!("client identity {} is not a known identity", shown(raw)),
        )),
        Seen::Unreadable(why) => Err((
            Reason::UnreadableCertificate,
            "(unreadable)".to_owned(),
            format!("the client certificate could not be read: {why}"),
        )),
    }
}

/// Whether `identity` (its SAN `raw`) may mutate under `shard_id`.
fn may_mutate(identity: &Identity, raw: &str, shard_id: &str) -> Result<(), Refusal> {
    match identity {
        Identity::Admin => Ok(()),
        Identity::Shard(own) if own == shard_id => Ok(()),
        Identity::Shard(_) if shard_id.is_empty() => Err((
            Reason::Unfenced,
            escaped(raw),
            format!("client identity {} sent no shard_id", shown(raw)),
        )),
        Identity::Shard(_) => Err((
            Reason::ShardMismatch,
            escaped(raw),
            format!(
                "client identity {} may not act for shard {}",
                shown(raw),
                shown(shard_id)
            ),
        )),
        Identity::Readonly | Identity::Cluster(_) => Err((
            Reason::NotAShard,
            escaped(raw),
            format!("client identity {} may only read", shown(raw)),
        )),
    }
}
