//! Unit tests for `tls`: a certificate replaced at any moment after loading is reloaded,
//! including before the watcher first looks at the files (the provider announces it serves
//! before the watcher task has run, and a deployment may rotate the files right then).

use std::time::{Duration, SystemTime};

use super::*;

/// A self-signed certificate and key, as PEM, and the certificate's DER.
fn self_signed(name: &str) -> (String, String, Vec<u8>) {
    let rcgen::CertifiedKey { cert, signing_key } =
        rcgen::generate_simple_self_signed(vec![name.to_owned()]).unwrap();
    (cert.pem(), signing_key.serialize_pem(), cert.der().to_vec())
}

/// Writes `contents` to `path` by rename, with the modification time `mtime`.
fn replace(path: &std::path::Path, contents: &str, mtime: SystemTime) {
    let tmp = path.with_extension("new");
    std::fs::write(&tmp, contents).unwrap();
    let file = std::fs::File::options().write(true).open(&tmp).unwrap();
    file.set_modified(mtime).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

fn served(state: &TlsState) -> Vec<u8> {
    let key = state.key.read().unwrap();
    key.cert[0].to_vec()
}

#[tokio::test(start_paused = true)]
#[allow(
    clippy::disallowed_methods,
    reason = "the watcher sleeps on tokio's clock; paused time makes its ticks instant"
)]
async fn files_replaced_before_the_watcher_starts_are_reloaded() {
    let dir = tempfile::tempdir().unwrap();
    let files = TlsFiles {
        cert: dir.path().join("server.pem"),
        key: dir.path().join("server.key"),
        client_ca: None,
    };
    let (cert_a, key_a, der_a) = self_signed("a.example");
    let loaded_at = SystemTime::now() - Duration::from_secs(60);
    replace(&files.cert, &cert_a, loaded_at);
    replace(&files.key, &key_a, loaded_at);
    let state = TlsState::load(files.clone()).unwrap();
    assert_eq!(served(&state), der_a);

    // Rotated after loading, before the watcher's first tick.
    let (cert_b, key_b, der_b) = self_signed("b.example");
    let rotated_at = SystemTime::now();
    replace(&files.key, &key_b, rotated_at);
    replace(&files.cert, &cert_b, rotated_at);
    tokio::spawn(state.clone().watch(Duration::from_secs(2)));
    for _ in 0..5 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        if served(&state) == der_b {
            return;
        }
    }
    panic!("the certificate rotated before the watcher started was never reloaded");
}
