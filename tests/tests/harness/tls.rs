//! Certificates made for one test (rcgen) and TLS clients of the provider: raw rustls
//! handshakes and tonic channels, with or without a client certificate.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bigfleet_libvirt_proto::v1alpha1 as pb;
use bigfleet_libvirt_proto::v1alpha1::capacity_provider_client::CapacityProviderClient;
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType, SerialNumber,
};
use tokio::net::TcpStream;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio_rustls::rustls::{self, ClientConfig, RootCertStore};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

use super::Client;

/// A certificate authority made for one test.
pub struct Ca {
    pub pem: String,
    issuer: Issuer<'static, KeyPair>,
}

/// A certificate and its key.
pub struct Leaf {
    pub cert_pem: String,
    pub key_pem: String,
    pub der: Vec<u8>,
}

fn name(common_name: &str) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, common_name);
    dn
}

impl Ca {
    pub fn new(common_name: &str) -> Ca {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.distinguished_name = name(common_name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let key = KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        Ca {
            pem: cert.pem(),
            issuer: Issuer::new(params, key),
        }
    }

    pub fn leaf(&self, common_name: &str, serial: u8, server: bool) -> Leaf {
        let names: Vec<String> = if server {
            vec!["localhost".into(), "127.0.0.1".into()]
        } else {
            Vec::new()
        };
        let mut params = CertificateParams::new(names).unwrap();
        params.serial_number = Some(SerialNumber::from_slice(&[0x5a, serial, 0x17]));
        params.extended_key_usages = vec![if server {
            ExtendedKeyUsagePurpose::ServerAuth
        } else {
            ExtendedKeyUsagePurpose::ClientAuth
        }];
        self.sign(common_name, params)
    }

    /// Signs `params` (any SANs already set) as a leaf named `common_name`.
    fn sign(&self, common_name: &str, mut params: CertificateParams) -> Leaf {
        params.distinguished_name = name(common_name);
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.use_authority_key_identifier_extension = true;
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        Leaf {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            der: cert.der().to_vec(),
        }
    }

    /// A client certificate whose SANs are exactly these URIs (none: no SAN extension).
    pub fn client_with_uris(&self, common_name: &str, uris: &[&str]) -> Leaf {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.subject_alt_names = uris
            .iter()
            .map(|uri| SanType::URI((*uri).try_into().unwrap()))
            .collect();
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        self.sign(common_name, params)
    }

    /// A server certificate for `localhost` and 127.0.0.1.
    pub fn server(&self, common_name: &str, serial: u8) -> Leaf {
        self.leaf(common_name, serial, true)
    }

    /// A client certificate.
    pub fn client(&self, common_name: &str) -> Leaf {
        self.leaf(common_name, 0x77, false)
    }
}

pub fn write(dir: &Path, file: &str, contents: &str) -> PathBuf {
    let path = dir.join(file);
    std::fs::write(&path, contents).unwrap();
    path
}

/// Replaces `path` atomically (write a sibling, then rename), optionally giving the new file
/// a chosen modification time.
pub fn replace(path: &Path, contents: &str, mtime: Option<SystemTime>) {
    let tmp = path.with_extension("new");
    std::fs::write(&tmp, contents).unwrap();
    if let Some(mtime) = mtime {
        let file = std::fs::File::options().write(true).open(&tmp).unwrap();
        file.set_modified(mtime).unwrap();
    }
    std::fs::rename(&tmp, path).unwrap();
}

pub fn arg(flag: &str, path: &Path) -> String {
    format!("{flag}={}", path.display())
}

/// A raw rustls client trusting `ca_pem`, optionally presenting `identity`.
pub fn rustls_client(ca_pem: &str, identity: Option<&Leaf>, tls12_only: bool) -> Arc<ClientConfig> {
    let mut roots = RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_slice(ca_pem.as_bytes()).unwrap())
        .unwrap();
    let versions: &[&'static rustls::SupportedProtocolVersion] = if tls12_only {
        &[&rustls::version::TLS12]
    } else {
        &[&rustls::version::TLS13, &rustls::version::TLS12]
    };
    let builder =
        ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_protocol_versions(versions)
            .unwrap()
            .with_root_certificates(roots);
    let mut config = match identity {
        Some(leaf) => builder
            .with_client_auth_cert(
                vec![CertificateDer::from(leaf.der.clone())],
                PrivateKeyDer::from_pem_slice(leaf.key_pem.as_bytes()).unwrap(),
            )
            .unwrap(),
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = vec![b"h2".to_vec()];
    Arc::new(config)
}

pub type RawTls = tokio_rustls::client::TlsStream<TcpStream>;

/// A TLS handshake with the server at `addr` as `localhost`.
pub async fn handshake(addr: SocketAddr, config: Arc<ClientConfig>) -> Result<RawTls, String> {
    let connect = async {
        let tcp = TcpStream::connect(addr).await?;
        let server = ServerName::try_from("localhost").unwrap();
        tokio_rustls::TlsConnector::from(config)
            .connect(server, tcp)
            .await
    };
    match tokio::time::timeout(Duration::from_secs(5), connect).await {
        Ok(Ok(stream)) => Ok(stream),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err("handshake timed out".to_owned()),
    }
}

/// The DER of the certificate a new connection is served.
pub async fn served_cert(addr: SocketAddr, ca_pem: &str) -> Result<Vec<u8>, String> {
    let stream = handshake(addr, rustls_client(ca_pem, None, false)).await?;
    let peer = stream.get_ref().1.peer_certificates().unwrap_or_default();
    peer.first()
        .map(|c| c.to_vec())
        .ok_or_else(|| "no peer certificate".to_owned())
}

/// A tonic endpoint for the provider at `addr` over TLS, trusting `ca_pem` and presenting
/// `identity` when given.
pub fn tls_endpoint(
    addr: SocketAddr,
    ca_pem: &str,
    identity: Option<&Leaf>,
) -> Result<Endpoint, String> {
    let mut tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(ca_pem))
        .domain_name("localhost");
    if let Some(leaf) = identity {
        tls = tls.identity(Identity::from_pem(&leaf.cert_pem, &leaf.key_pem));
    }
    Endpoint::from_shared(format!("https://{addr}"))
        .unwrap()
        .connect_timeout(Duration::from_secs(5))
        .timeout(Duration::from_secs(30))
        .tls_config(tls)
        .map_err(|e| format!("tls config: {e:?}"))
}

/// A connected TLS channel presenting `identity`.
pub async fn tls_channel(addr: SocketAddr, ca_pem: &str, identity: &Leaf) -> Channel {
    tls_endpoint(addr, ca_pem, Some(identity))
        .unwrap()
        .connect()
        .await
        .expect("TLS connection with a trusted client certificate")
}

/// A generated client over TLS presenting `identity`.
pub async fn tls_client(addr: SocketAddr, ca_pem: &str, identity: &Leaf) -> Client {
    CapacityProviderClient::new(tls_channel(addr, ca_pem, identity).await)
}

/// Connects a tonic client over TLS and lists every machine; any failure as text.
pub async fn tls_list(
    addr: SocketAddr,
    ca_pem: &str,
    identity: Option<&Leaf>,
) -> Result<usize, String> {
    list_over(tls_endpoint(addr, ca_pem, identity)?).await
}

/// Lists over a plaintext HTTP/2 connection; any failure as text.
pub async fn plaintext_list(addr: SocketAddr) -> Result<usize, String> {
    list_over(Endpoint::from_shared(format!("http://{addr}")).unwrap()).await
}

pub async fn list_over(endpoint: Endpoint) -> Result<usize, String> {
    let channel = endpoint
        .connect_timeout(Duration::from_secs(5))
        .timeout(Duration::from_secs(5))
        .connect()
        .await
        .map_err(|e| format!("connect: {e:?}"))?;
    let mut client = CapacityProviderClient::new(channel);
    client
        .list(pb::ListFilter::default())
        .await
        .map(|r| r.into_inner().machines.len())
        .map_err(|e| format!("List: {e:?}"))
}
