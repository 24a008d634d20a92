//! Part 3: TLS and mTLS on `--addr`, with certificates made here (rcgen).

use tokio_rustls::rustls;

use crate::harness::logs::*;
use crate::harness::tls::*;
use crate::harness::*;

/// mTLS: no client certificate, an untrusted one, TLS 1.2 only and plaintext are refused;
/// a trusted client lists (TLS 1.3, ALPN h2), and the refusals do not hurt the server.
#[tokio::test]
async fn mtls_refuses_untrusted_clients_and_serves_trusted_ones() {
    let ca = Ca::new("ops test CA");
    let server_leaf = ca.server("ops server", 1);
    let trusted = ca.client_with_uris("ops shard", &["bigfleet://shard/ops"]);
    let rogue = Ca::new("rogue CA").client("rogue shard");
    let dir = tempfile::tempdir().unwrap();
    let args = [
        "--use-fake-backend".to_owned(),
        "--seed-count=4".to_owned(),
        arg(
            "--tls-cert",
            &write(dir.path(), "server.pem", &server_leaf.cert_pem),
        ),
        arg(
            "--tls-key",
            &write(dir.path(), "server.key", &server_leaf.key_pem),
        ),
        arg("--tls-ca", &write(dir.path(), "ca.pem", &ca.pem)),
    ];
    let server = Server::start(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert_eq!(serving_fields(&server)["security"], "mTLS");
    let addr = server.addr;

    let listed = tls_list(addr, &ca.pem, Some(&trusted)).await;
    assert!(
        listed.as_ref().is_ok_and(|n| *n > 0),
        "trusted client: {listed:?}"
    );
    let stream = handshake(addr, rustls_client(&ca.pem, Some(&trusted), false))
        .await
        .expect("TLS 1.3 handshake with a trusted client certificate");
    let (_, session) = stream.get_ref();
    assert_eq!(
        session.protocol_version(),
        Some(rustls::ProtocolVersion::TLSv1_3)
    );
    assert_eq!(session.alpn_protocol(), Some(&b"h2"[..]));
    assert_eq!(
        session.peer_certificates().unwrap()[0].as_ref(),
        server_leaf.der.as_slice()
    );
    drop(stream);

    let anonymous = tls_list(addr, &ca.pem, None).await;
    assert!(
        anonymous.is_err(),
        "a client without a certificate was served: {anonymous:?}"
    );
    let untrusted = tls_list(addr, &ca.pem, Some(&rogue)).await;
    assert!(
        untrusted.is_err(),
        "a client with an untrusted certificate was served"
    );
    let tls12 = handshake(addr, rustls_client(&ca.pem, Some(&trusted), true)).await;
    assert!(
        tls12.is_err(),
        "a TLS 1.2-only client completed a handshake"
    );
    let plain = plaintext_list(addr).await;
    assert!(plain.is_err(), "a plaintext client was served: {plain:?}");

    let again = tls_list(addr, &ca.pem, Some(&trusted)).await;
    assert!(
        again.is_ok(),
        "trusted client after the refusals: {again:?}"
    );
}

/// TLS without `--tls-ca`: a client without a certificate is served; plaintext is refused.
#[tokio::test]
async fn tls_without_ca_serves_anonymous_clients_and_refuses_plaintext() {
    let ca = Ca::new("ops test CA");
    let leaf = ca.server("ops server", 2);
    let dir = tempfile::tempdir().unwrap();
    let args = [
        "--use-fake-backend".to_owned(),
        "--seed-count=4".to_owned(),
        arg(
            "--tls-cert",
            &write(dir.path(), "server.pem", &leaf.cert_pem),
        ),
        arg("--tls-key", &write(dir.path(), "server.key", &leaf.key_pem)),
    ];
    let server = Server::start(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert_eq!(serving_fields(&server)["security"], "TLS");
    let listed = tls_list(server.addr, &ca.pem, None).await;
    assert!(
        listed.as_ref().is_ok_and(|n| *n > 0),
        "TLS client: {listed:?}"
    );
    let plain = plaintext_list(server.addr).await;
    assert!(plain.is_err(), "a plaintext client was served: {plain:?}");
    let tls12 = handshake(server.addr, rustls_client(&ca.pem, None, true)).await;
    assert!(
        tls12.is_err(),
        "a TLS 1.2-only client completed a handshake"
    );
}
