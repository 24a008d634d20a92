//! Part 5: Start-up errors: bad TLS flags stop the binary with one line naming the flag.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::harness::tls::*;
use crate::harness::*;

/// Half a TLS configuration, a CA without cert/key, unreadable files, files without PEM
/// material and a key that does not match the certificate each stop the binary before it
/// serves, with a non-zero exit and one stderr line naming the flag.
#[test]
fn bad_tls_flags_fail_at_startup_with_one_line_naming_the_flag() {
    let ca = Ca::new("ops startup CA");
    let (a, b) = (ca.server("ops server A", 5), ca.server("ops server B", 6));
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let cert = arg("--tls-cert", &write(d, "a.pem", &a.cert_pem));
    let key = arg("--tls-key", &write(d, "a.key", &a.key_pem));
    let other_key = arg("--tls-key", &write(d, "b.key", &b.key_pem));
    let ca_file = arg("--tls-ca", &write(d, "ca.pem", &ca.pem));
    let junk = write(d, "junk.pem", "hello, I am not PEM\n");
    let missing = d.join("missing.pem");
    let cases: Vec<(&str, Vec<String>, &str)> = vec![
        ("cert without key", vec![cert.clone()], "--tls-key"),
        ("key without cert", vec![key.clone()], "--tls-cert"),
        ("CA without cert and key", vec![ca_file.clone()], "--tls-ca"),
        (
            "CA and cert without key",
            vec![cert.clone(), ca_file.clone()],
            "--tls-key",
        ),
        (
            "missing cert file",
            vec![arg("--tls-cert", &missing), key.clone()],
            "--tls-cert",
        ),
        (
            "key is a directory",
            vec![cert.clone(), arg("--tls-key", d)],
            "--tls-key",
        ),
        (
            "missing CA file",
            vec![cert.clone(), key.clone(), arg("--tls-ca", &missing)],
            "--tls-ca",
        ),
        (
            "cert without PEM",
            vec![arg("--tls-cert", &junk), key.clone()],
            "--tls-cert",
        ),
        (
            "key without PEM",
            vec![cert.clone(), arg("--tls-key", &junk)],
            "--tls-key",
        ),
        (
            "CA without PEM",
            vec![cert.clone(), key.clone(), arg("--tls-ca", &junk)],
            "--tls-ca",
        ),
        (
            "key not matching the cert",
            vec![cert.clone(), other_key],
            "--tls-key",
        ),
    ];
    let children: Vec<Child> = cases
        .iter()
        .map(|(_, args, _)| {
            Command::new(binary())
                .args([
                    "--use-fake-backend",
                    "--addr=127.0.0.1:0",
                    "--metrics-addr=127.0.0.1:0",
                ])
                .args(args)
                .env_remove("RUST_LOG")
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    for ((case, args, flag), child) in cases.iter().zip(children) {
        let (status, stderr) = exit_within(child, Duration::from_secs(20));
        let status = status.unwrap_or_else(|| panic!("{case}: still running after 20s ({args:?})"));
        let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
        assert!(
            status.code().is_some_and(|c| c != 0),
            "{case}: exit {status:?}; {stderr}"
        );
        assert_eq!(
            lines.len(),
            1,
            "{case}: want one stderr line, got:\n{stderr}"
        );
        assert!(
            lines[0].contains(flag),
            "{case}: the line does not name {flag}: {}",
            lines[0]
        );
    }
}
