//! Why a host's TLS server certificate was refused.
//!
//! libvirt's client reports every failed check of the server's certificate as "Failed to
//! verify peer's certificate" (its detail goes only to libvirt's own warning log). After
//! such a refusal, [`check`] opens one TLS handshake of its own to the same host and port,
//! verifies the certificate the host presents against the same `cacert.pem` and host name,
//! and says which check failed. It sends no client certificate and nothing after the
//! handshake, and it runs only after libvirt has already dialled that address.

use std::net::{TcpStream, ToSocketAddrs};
use std::sync::Arc;
use std::time::Duration;

use tokio_rustls::rustls::client::WebPkiServerVerifier;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, ServerName};
use tokio_rustls::rustls::{
    CertificateError, ClientConfig, ClientConnection, Error as TlsError, RootCertStore,
};

/// What the host's certificate failed.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// It is not signed by the CA in `cacert.pem`.
    OtherCa,
    /// It does not name the host the URI names.
    WrongName,
    /// It is out of date.
    Expired,
    /// None of those could be shown (why).
    Unknown(String),
}

const TIMEOUT: Duration = Duration::from_secs(5);

/// Checks the certificate `host:port` presents against the CA certificates in `ca_file`.
pub(crate) fn check(host: &str, port: u16, ca_file: &str) -> Verdict {
    match handshake(host, port, ca_file) {
        Ok(()) => Verdict::Unknown(format!(
            "it verifies against {ca_file} for {host:?} here; libvirt refused it for another reason"
        )),
        Err(HandshakeError::Certificate(e)) => match e {
            CertificateError::UnknownIssuer | CertificateError::BadSignature => Verdict::OtherCa,
            CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. } => {
                Verdict::WrongName
            }
            CertificateError::Expired | CertificateError::ExpiredContext { .. } => Verdict::Expired,
            other => Verdict::Unknown(format!("{other:?}")),
        },
        Err(HandshakeError::Other(why)) => Verdict::Unknown(why),
    }
}

enum HandshakeError {
    Certificate(CertificateError),
    Other(String),
}

fn handshake(host: &str, port: u16, ca_file: &str) -> Result<(), HandshakeError> {
    let other =
        |what: &str, e: &dyn std::fmt::Display| HandshakeError::Other(format!("{what}: {e}"));
    let pem = std::fs::read(ca_file).map_err(|e| other(&format!("read {ca_file}"), &e))?;
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(&pem) {
        let cert = cert.map_err(|e| other(&format!("parse {ca_file}"), &e))?;
        roots
            .add(cert)
            .map_err(|e| other(&format!("use {ca_file}"), &e))?;
    }
    let verifier = WebPkiServerVerifier::builder_with_provider(
        Arc::new(roots),
        Arc::new(tokio_rustls::rustls::crypto::ring::default_provider()),
    )
    .build()
    .map_err(|e| other("build the verifier", &e))?;
    let config = ClientConfig::builder_with_provider(Arc::new(
        tokio_rustls::rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| other("TLS versions", &e))?
    .with_webpki_verifier(verifier)
    .with_no_client_auth();
    let name = ServerName::try_from(host.to_owned()).map_err(|e| other("host name", &e))?;
    let mut conn =
        ClientConnection::new(Arc::new(config), name).map_err(|e| other("TLS client", &e))?;
    let address = (host, port)
        .to_socket_addrs()
        .map_err(|e| other("resolve", &e))?
        .next()
        .ok_or_else(|| HandshakeError::Other(format!("{host} resolves to no address")))?;
    let mut tcp =
        TcpStream::connect_timeout(&address, TIMEOUT).map_err(|e| other("connect", &e))?;
    tcp.set_read_timeout(Some(TIMEOUT))
        .and_then(|()| tcp.set_write_timeout(Some(TIMEOUT)))
        .map_err(|e| other("socket", &e))?;
    while conn.is_handshaking() {
        match conn.complete_io(&mut tcp) {
            Ok(_) => {}
            Err(e) => {
                return Err(
                    match e
                        .get_ref()
                        .and_then(|inner| inner.downcast_ref::<TlsError>())
                    {
                        Some(TlsError::InvalidCertificate(cert)) => {
                            HandshakeError::Certificate(cert.clone())
                        }
                        _ => other("handshake", &e),
                    },
                );
            }
        }
    }
    Ok(())
}

/// The subject DN of the first certificate in `file`, as `O=…,CN=…`, or why it cannot be
/// read.
pub(crate) fn subject(file: &str) -> String {
    let Ok(pem) = std::fs::read(file) else {
        return "(unreadable)".to_owned();
    };
    let Some(Ok(der)) = CertificateDer::pem_slice_iter(&pem).next() else {
        return "(no certificate)".to_owned();
    };
    match x509_parser::parse_x509_certificate(&der) {
        Ok((_, cert)) => cert.subject().to_string().replace(", ", ","),
        Err(_) => "(not a certificate)".to_owned(),
    }
}
