//! Who is calling, under mTLS, and what they may do.
//!
//! A verified client certificate proves only that the client CA signed it. Without more, any
//! such client could send a Create with a high fencing token under another shard's id and so
//! fence that shard out, or drive any machine. BigFleet gives every client certificate
//! exactly one URI SAN of scheme `bigfleet://` naming the caller: `bigfleet://shard/<id>`,
//! `bigfleet://admin`, `bigfleet://readonly` or `bigfleet://cluster/<id>`. This module reads
//! that SAN once per connection ([`PeerIdentity::from_certificates`], carried to every request
//! of the connection by [`Identified`]) and decides each call ([`authorize`]):
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
use std::io::IoSlice;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bigfleet_libvirt_system::accept::{Activity, Admitted};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_rustls::rustls::pki_types::CertificateDer;
use tonic::transport::server::Connected;

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

    /// Reads the URI SANs of a DER certificate.
    #[must_use]
    pub fn from_der(der: &[u8]) -> Self {
        let cert = match x509_parser::parse_x509_certificate(der) {
            Ok((_, cert)) => cert,
            Err(e) => return Self::Unreadable(format!("not an X.509 certificate ({e})")),
        };
        match cert.subject_alternative_name() {
            Ok(None) => Self::Missing,
            Ok(Some(san)) => {
                Self::from_uris(
                    san.value
                        .general_names
                        .iter()
                        .filter_map(|name| match name {
                            x509_parser::extensions::GeneralName::URI(uri) => Some(*uri),
                            _ => None,
                        }),
                )
            }
            Err(e) => Self::Unreadable(format!("unreadable subject alternative names ({e})")),
        }
    }
}

/// The identity of one connection, shared by all its requests (cheap to clone). It is the
/// connection info tonic attaches to each request of an [`Identified`] stream (in its
/// [`PeerConnection`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerIdentity(Arc<Seen>);

impl PeerIdentity {
    /// The identity in the end-entity certificate of a verified chain (`None` or an empty
    /// chain: no certificate).
    #[must_use]
    pub fn from_certificates(chain: Option<&[CertificateDer<'_>]>) -> Self {
        let seen = match chain.and_then(<[_]>::first) {
            Some(leaf) => Seen::from_der(leaf.as_ref()),
            None => Seen::Missing,
        };
        Self(Arc::new(seen))
    }

    /// Wraps an already classified identity.
    #[must_use]
    pub fn new(seen: Seen) -> Self {
        Self(Arc::new(seen))
    }

    /// What the certificate said.
    #[must_use]
    pub fn seen(&self) -> &Seen {
        &self.0
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
    let deny = |reason: Reason, identity: String, what: String| {
        let message = format!("permission denied: {what}; {}", needs(method, access));
        Err(Denial {
            reason,
            identity,
            message,
        })
    };
    let (identity, raw) = match peer {
        Seen::One { identity, raw } => (identity, raw),
        Seen::Missing => {
            return deny(
                Reason::NoIdentity,
                "(none)".to_owned(),
                "the client certificate carries no bigfleet:// URI SAN".to_owned(),
            );
        }
        Seen::Several(sans) => {
            let mut listed: Vec<String> = sans.iter().take(SHOWN_SANS).map(|s| shown(s)).collect();
            if sans.len() > SHOWN_SANS {
                listed.push("…".to_owned());
            }
            let listed = listed.join(", ");
            let plain: Vec<String> = sans.iter().take(SHOWN_SANS).map(|s| escaped(s)).collect();
            return deny(
                Reason::SeveralIdentities,
                plain.join(", "),
                format!(
                    "the client certificate carries {} bigfleet:// URI SANs ({listed}), so no single identity",
                    sans.len()
                ),
            );
        }
        Seen::Unrecognised(raw) => {
            return deny(
                Reason::UnrecognisedIdentity,
                escaped(raw),
                format!("client identity {} is not a known identity", shown(raw)),
            );
        }
        Seen::Unreadable(why) => {
            return deny(
                Reason::UnreadableCertificate,
                "(unreadable)".to_owned(),
                format!("the client certificate could not be read: {why}"),
            );
        }
    };
    let Access::Mutate { shard_id } = access else {
        return Ok(());
    };
    match identity {
        Identity::Admin => Ok(()),
        Identity::Shard(own) if own == shard_id => Ok(()),
        Identity::Shard(_) if shard_id.is_empty() => deny(
            Reason::Unfenced,
            escaped(raw),
            format!("client identity {} sent no shard_id", shown(raw)),
        ),
        Identity::Shard(_) => deny(
            Reason::ShardMismatch,
            escaped(raw),
            format!(
                "client identity {} may not act for shard {}",
                shown(raw),
                shown(shard_id)
            ),
        ),
        Identity::Readonly | Identity::Cluster(_) => deny(
            Reason::NotAShard,
            escaped(raw),
            format!("client identity {} may only read", shown(raw)),
        ),
    }
}

/// What tonic attaches to each request of an [`Identified`] connection: the identity read
/// from its handshake, and the connection's activity (which keeps it from being evicted at
/// the connection cap while a request is in flight).
#[derive(Clone, Debug)]
pub struct PeerConnection {
    /// The client certificate's identity.
    pub identity: PeerIdentity,
    /// What the connection is doing, for the acceptor's eviction rule.
    pub activity: Activity,
}

/// A server stream that carries the identity of its client certificate, read once when the
/// connection was established; tonic hands it to every request as connection info.
#[derive(Debug)]
pub struct Identified<S> {
    stream: S,
    peer: PeerConnection,
}

impl<S> Identified<Admitted<S>> {
    /// Pairs `stream` with the identity read from its handshake.
    pub fn new(stream: Admitted<S>, identity: PeerIdentity) -> Self {
        let activity = stream.activity();
        Self {
            stream,
            peer: PeerConnection { identity, activity },
        }
    }
}

impl<S> Connected for Identified<S> {
    type ConnectInfo = PeerConnection;

    fn connect_info(&self) -> PeerConnection {
        self.peer.clone()
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Identified<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Identified<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

#[cfg(test)]
#[path = "identity_tests.rs"]
mod tests;
