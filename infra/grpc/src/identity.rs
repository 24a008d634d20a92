//! Who is calling, under mTLS: the identity in a connection's client certificate, read once
//! per connection ([`PeerIdentity::from_certificates`]) and carried to every request of the
//! connection by the stream wrapper [`Identified`]. What each identity may call is the
//! domain's authorization table (`bigfleet_libvirt_domain::authorization`); this module only
//! reads the certificate (with x509-parser) and hands over its URI SANs.

use std::io::IoSlice;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bigfleet_libvirt_domain::authorization::Seen;
use bigfleet_libvirt_system::accept::{Activity, Admitted};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_rustls::rustls::pki_types::CertificateDer;
use tonic::transport::server::Connected;

/// What a DER certificate's URI SANs say about its caller (classified by
/// [`Seen::from_uris`]).
#[must_use]
pub fn seen_in_der(der: &[u8]) -> Seen {
    let cert = match x509_parser::parse_x509_certificate(der) {
        Ok((_, cert)) => cert,
        Err(e) => return Seen::Unreadable(format!("not an X.509 certificate ({e})")),
    };
    match cert.subject_alternative_name() {
        Ok(None) => Seen::Missing,
        Ok(Some(san)) => Seen::from_uris(san.value.general_names.iter().filter_map(
            |name| match name {
                x509_parser::extensions::GeneralName::URI(uri) => Some(*uri),
                _ => None,
            },
        )),
        Err(e) => Seen::Unreadable(format!("unreadable subject alternative names ({e})")),
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
            Some(leaf) => seen_in_der(leaf.as_ref()),
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
