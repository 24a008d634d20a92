//! TLS and mTLS for the gRPC port.
//!
//! `--tls-cert` + `--tls-key` serve TLS 1.3 only; `--tls-ca` also requires every client to
//! present a certificate that chains to that CA. Certificates are held behind swappable
//! handles, so a rotated certificate, key or CA on disk is served without a restart: a
//! watcher polls the files' modification times, and SIGHUP reloads at once. A reload that
//! fails (a half-written file, a key that does not match) keeps the previous material and
//! logs a warning, so a bad rotation never takes the port down.

// TLS serving runs only on the real tokio runtime (it owns real sockets), so its accept
// loop, handshakes and file-watch timer use tokio directly.
#![allow(clippy::disallowed_methods)]
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

use futures::Stream;
use tokio::net::TcpStream;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls::client::danger::HandshakeSignatureValid;
use tokio_rustls::rustls::crypto::{CryptoProvider, ring};
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer, UnixTime};
use tokio_rustls::rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use tokio_rustls::rustls::server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier};
use tokio_rustls::rustls::sign::CertifiedKey;
use tokio_rustls::rustls::{
    DigitallySignedStruct, DistinguishedName, Error as RustlsError, RootCertStore, ServerConfig,
    SignatureScheme, version,
};
use tokio_rustls::server::TlsStream;
use tracing::{info, warn};

/// The certificate files named on the command line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsFiles {
    /// Server certificate chain (PEM).
    pub cert: PathBuf,
    /// Server private key (PEM).
    pub key: PathBuf,
    /// Client CA bundle (PEM); `Some` turns on mTLS.
    pub client_ca: Option<PathBuf>,
}

/// Why TLS material could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file could not be read.
    #[error("{flag} {path}: cannot read the file: {source}")]
    Read {
        /// The flag naming the file.
        flag: &'static str,
        /// The file.
        path: String,
        /// The IO error.
        source: std::io::Error,
    },
    /// A file holds no usable PEM material.
    #[error("{flag} {path}: {problem}")]
    Invalid {
        /// The flag naming the file.
        flag: &'static str,
        /// The file.
        path: String,
        /// What is wrong and how to fix it.
        problem: String,
    },
}

fn read(flag: &'static str, path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        flag,
        path: path.display().to_string(),
        source,
    })
}

fn invalid(flag: &'static str, path: &Path, problem: impl Into<String>) -> TlsError {
    TlsError::Invalid {
        flag,
        path: path.display().to_string(),
        problem: problem.into(),
    }
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(ring::default_provider())
}

fn load_key(files: &TlsFiles) -> Result<Arc<CertifiedKey>, TlsError> {
    let cert_pem = read("--tls-cert", &files.cert)?;
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&cert_pem)
        .collect::<Result<_, _>>()
        .map_err(|e| {
            invalid(
                "--tls-cert",
                &files.cert,
                format!("not a PEM certificate chain ({e})"),
            )
        })?;
    if chain.is_empty() {
        return Err(invalid(
            "--tls-cert",
            &files.cert,
            "holds no PEM certificate",
        ));
    }
    let key_pem = read("--tls-key", &files.key)?;
    let key = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|e| {
        invalid(
            "--tls-key",
            &files.key,
            format!("holds no PEM private key ({e})"),
        )
    })?;
    let certified = CertifiedKey::from_der(chain, key, &provider()).map_err(|e| {
        invalid(
            "--tls-key",
            &files.key,
            format!("does not match --tls-cert or is unsupported ({e})"),
        )
    })?;
    Ok(Arc::new(certified))
}

fn load_verifier(path: &Path) -> Result<Arc<dyn ClientCertVerifier>, TlsError> {
    let pem = read("--tls-ca", path)?;
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(&pem) {
        let cert =
            cert.map_err(|e| invalid("--tls-ca", path, format!("not a PEM bundle ({e})")))?;
        roots.add(cert).map_err(|e| {
            invalid(
                "--tls-ca",
                path,
                format!("holds an unusable CA certificate ({e})"),
            )
        })?;
    }
    if roots.is_empty() {
        return Err(invalid(
            "--tls-ca",
            path,
            "no certificates parsed from the client CA bundle",
        ));
    }
    WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider())
        .build()
        .map_err(|e| {
            invalid(
                "--tls-ca",
                path,
                format!("cannot verify clients with it ({e})"),
            )
        })
}

/// The live TLS material; clones share it.
#[derive(Clone, Debug)]
pub struct TlsState {
    files: TlsFiles,
    key: Arc<RwLock<Arc<CertifiedKey>>>,
    verifier: Option<Arc<SwappableVerifier>>,
    /// The files' modification times taken just before they were loaded: the watcher
    /// starts from these, so a file replaced between loading and the watcher's first look
    /// is still reloaded.
    loaded: Vec<Option<SystemTime>>,
}

impl TlsState {
    /// Loads and checks every file.
    ///
    /// # Errors
    /// The first unreadable or invalid file, named by its flag.
    pub fn load(files: TlsFiles) -> Result<Self, TlsError> {
        let loaded = modified(&files);
        let key = Arc::new(RwLock::new(load_key(&files)?));
        let verifier = match &files.client_ca {
            Some(path) => Some(Arc::new(SwappableVerifier(RwLock::new(load_verifier(
                path,
            )?)))),
            None => None,
        };
        Ok(Self {
            files,
            key,
            verifier,
            loaded,
        })
    }

    /// `TLS` or `mTLS`, for the serving line.
    #[must_use]
    pub fn mode(&self) -> &'static str {
        if self.verifier.is_some() {
            "mTLS"
        } else {
            "TLS"
        }
    }

    /// Re-reads the files; on failure the previous material stays in use.
    ///
    /// # Errors
    /// The file that could not be loaded.
    pub fn reload(&self) -> Result<(), TlsError> {
        let key = load_key(&self.files)?;
        let verifier = match (&self.files.client_ca, &self.verifier) {
            (Some(path), Some(_)) => Some(load_verifier(path)?),
            _ => None,
        };
        *self
            .key
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = key;
        if let (Some(new), Some(slot)) = (verifier, &self.verifier) {
            *slot
                .0
                .write()
                .unwrap_or_else(std::sync::PoisonError::into_inner) = new;
        }
        Ok(())
    }

    /// The rustls server configuration: TLS 1.3 only, HTTP/2 over ALPN.
    ///
    /// # Panics
    /// Never: TLS 1.3 with the ring provider is always available.
    #[must_use]
    pub fn server_config(&self) -> Arc<ServerConfig> {
        let builder = ServerConfig::builder_with_provider(provider())
            .with_protocol_versions(&[&version::TLS13])
            .expect("TLS 1.3 is supported by the ring provider");
        let resolver = Arc::new(SwappableKey(Arc::clone(&self.key)));
        let mut config = match &self.verifier {
            Some(verifier) => builder
                .with_client_cert_verifier(Arc::clone(verifier) as Arc<dyn ClientCertVerifier>)
                .with_cert_resolver(resolver),
            None => builder.with_no_client_auth().with_cert_resolver(resolver),
        };
        config.alpn_protocols = vec![b"h2".to_vec()];
        Arc::new(config)
    }

    /// Reloads whenever a file's modification time changes (checked every `period`) or on
    /// SIGHUP. Runs until the process ends.
    pub async fn watch(self, period: Duration) {
        let mut last = self.loaded.clone();
        let mut hangup =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok();
        loop {
            let hup = async {
                match hangup.as_mut() {
                    Some(signal) => signal.recv().await,
                    None => std::future::pending().await,
                }
            };
            // Biased: a SIGHUP and a tick in the same instant reload once either way.
            let reason = tokio::select! {
                biased;
                _ = hup => "SIGHUP",
                () = tokio::time::sleep(period) => "file change",
            };
            let now = modified(&self.files);
            if reason == "file change" && now == last {
                continue;
            }
            last = now;
            match self.reload() {
                Ok(()) => info!(reason, "reloaded TLS certificates"),
                Err(e) => {
                    warn!(reason, error = %e, "TLS reload failed; still serving the previous certificates")
                }
            }
        }
    }
}

/// The modification time of each TLS file (`None` for one that cannot be read).
fn modified(files: &TlsFiles) -> Vec<Option<SystemTime>> {
    let paths = [
        Some(&files.cert),
        Some(&files.key),
        files.client_ca.as_ref(),
    ];
    paths
        .into_iter()
        .flatten()
        .map(|p| std::fs::metadata(p).and_then(|m| m.modified()).ok())
        .collect()
}

/// Serves whichever certificate is current.
#[derive(Debug)]
struct SwappableKey(Arc<RwLock<Arc<CertifiedKey>>>);

impl ResolvesServerCert for SwappableKey {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(Arc::clone(
            &self
                .0
                .read()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        ))
    }
}

/// Verifies clients against whichever CA bundle is current.
#[derive(Debug)]
struct SwappableVerifier(RwLock<Arc<dyn ClientCertVerifier>>);

impl SwappableVerifier {
    fn current(&self) -> Arc<dyn ClientCertVerifier> {
        Arc::clone(
            &self
                .0
                .read()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        )
    }
}

impl ClientCertVerifier for SwappableVerifier {
    fn offer_client_auth(&self) -> bool {
        true
    }

    fn client_auth_mandatory(&self) -> bool {
        true
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        // Hints are optional; clients are configured with their certificate explicitly.
        &[]
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, RustlsError> {
        self.current()
            .verify_client_cert(end_entity, intermediates, now)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, RustlsError> {
        self.current().verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, RustlsError> {
        self.current().verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.current().supported_verify_schemes()
    }
}

/// Accepts TCP connections and completes TLS handshakes off the accept loop, yielding only
/// established streams; a client that fails the handshake (no or untrusted certificate, TLS
/// 1.2 only) is dropped and logged at debug. The connection cap, accept backoff and the
/// deadline for the handshake plus the HTTP/2 preface are `bigfleet_libvirt_system::accept`'s.
pub fn incoming(
    acceptor: bigfleet_libvirt_system::accept::Acceptor,
    state: &TlsState,
    handshake_timeout: Duration,
) -> impl Stream<
    Item = Result<bigfleet_libvirt_system::accept::Admitted<TlsStream<TcpStream>>, std::io::Error>,
> + Send
+ 'static {
    let tls = TlsAcceptor::from(state.server_config());
    bigfleet_libvirt_system::accept::grpc_incoming(acceptor, handshake_timeout, move |tcp| {
        tls.accept(tcp)
    })
}

#[cfg(test)]
#[path = "tls_tests.rs"]
mod tests;
