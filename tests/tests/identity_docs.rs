//! Issue 15 — what the docs and the chart promise about client identities: the operator
//! guide's openssl recipe, run as written, issues a certificate the provider enforces; the chart
//! passes `tls.clientIdentity` as `--client-identity` under mTLS only, refuses `off` without
//! mTLS and unknown values, and the mTLS example overlay turns enforcement on.

use std::path::{Path, PathBuf};
use std::process::Command;

use bigfleet_libvirt_proto::v1alpha1 as pb;
use pb::MachineState as S;
use tonic::Code;

use crate::deploy::{binary_with_chart_args, tools};
use crate::harness::tls::{Ca, Leaf, arg, tls_client, write};
use crate::harness::*;

fn repo_root() -> PathBuf {
    crate::harness::repo_root()
}

/// The first ```sh block after `heading` in the operator guide.
fn guide_block(heading: &str) -> String {
    let guide = std::fs::read_to_string(repo_root().join("docs/operating.md")).unwrap();
    let after = guide
        .split_once(heading)
        .unwrap_or_else(|| panic!("docs/operating.md has no {heading:?}"))
        .1;
    let block = after
        .split_once("```sh\n")
        .and_then(|(_, rest)| rest.split_once("```"))
        .unwrap_or_else(|| panic!("no sh block after {heading:?}"))
        .0;
    block.to_owned()
}

fn read(dir: &Path, file: &str) -> String {
    std::fs::read_to_string(dir.join(file)).unwrap_or_else(|e| panic!("{file}: {e}"))
}

/// The operator guide's (docs/operating.md) openssl commands, run in an empty directory, make a client CA and a
/// `bigfleet://shard/shard-0` certificate; a provider trusting that CA lets the certificate
/// mutate for shard-0 and refuses it for shard-1.
#[tokio::test]
async fn the_operator_guide_openssl_recipe_issues_a_certificate_the_provider_enforces() {
    let script = guide_block("### Issuing client certificates with openssl");
    let dir = tempfile::tempdir().unwrap();
    let output = Command::new("bash")
        .args(["-euo", "pipefail", "-c", &script])
        .current_dir(dir.path())
        .output()
        .expect("run bash");
    assert!(
        output.status.success(),
        "the openssl block of docs/operating.md failed (openssl comes from scripts/install-deps.sh):\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let server_ca = Ca::new("docs server CA");
    let server = server_ca.server("docs server", 3);
    let args = [
        "--use-fake-backend".to_owned(),
        "--seed-count=4".to_owned(),
        arg(
            "--tls-cert",
            &write(dir.path(), "server.pem", &server.cert_pem),
        ),
        arg(
            "--tls-key",
            &write(dir.path(), "server.key", &server.key_pem),
        ),
        arg("--tls-ca", &dir.path().join("client-ca.crt")),
    ];
    let provider = Server::start(&args.iter().map(String::as_str).collect::<Vec<_>>());
    let shard = Leaf {
        cert_pem: read(dir.path(), "shard-0.crt"),
        key_pem: read(dir.path(), "shard-0.key"),
        der: Vec::new(),
    };
    let mut c = tls_client(provider.addr, &server_ca.pem, &shard).await;
    let ids = pick_n(&provider, &mut c, 2).await;
    let refused = create(&mut c, &ids[0], tok("shard-1", 1, 1)).await;
    assert_eq!(code(&refused), Code::PermissionDenied, "{refused:?}");
    assert!(
        refused
            .unwrap_err()
            .message()
            .contains("bigfleet://shard/shard-0")
    );
    create(&mut c, &ids[1], tok("shard-0", 1, 1))
        .await
        .expect("shard-0 creates for itself");
    assert_eq!(state(&get(&mut c, &ids[0]).await.unwrap()), S::Speculative);
}

#[test]
fn the_chart_passes_client_identity_under_mtls_only() {
    let Some(tools) = skip::needs(skip::DEPLOY_TOOLS, tools()) else {
        return;
    };
    let mtls = "tls.enabled=true,tls.mtls=true,tls.secretName=grpc-tls";
    let default = tools.render(&["--set", mtls]);
    assert_eq!(default.arg("--client-identity").as_deref(), Some("enforce"));
    let off = tools.render(&["--set", &format!("{mtls},tls.clientIdentity=off")]);
    assert_eq!(off.arg("--client-identity").as_deref(), Some("off"));
    let tls_only = tools.render(&["--set", "tls.enabled=true,tls.secretName=grpc-tls"]);
    assert_eq!(tls_only.arg("--client-identity"), None, "TLS without mTLS");
    assert_eq!(tools.render(&[]).arg("--client-identity"), None);
    let example = tools.render(&[
        "-f",
        "deploy/examples/dc1.values.yaml",
        "-f",
        "deploy/examples/mtls.values.yaml",
    ]);
    assert_eq!(example.arg("--client-identity").as_deref(), Some("enforce"));
    assert_eq!(
        example.arg("--tls-ca").as_deref(),
        Some("/etc/bigfleet/tls/ca.crt")
    );
    // The binary accepts what the chart passes (the dry run checks the flags, not the files).
    for m in [&default, &off] {
        let files = [
            ("/etc/bigfleet/tls/tls.crt", "/dev/null"),
            ("/etc/bigfleet/tls/tls.key", "/dev/null"),
            ("/etc/bigfleet/tls/ca.crt", "/dev/null"),
        ];
        let (ok, stderr) = binary_with_chart_args(&m.args(), &files);
        assert!(ok, "{stderr}");
    }
}

#[test]
fn the_chart_refuses_off_without_mtls_and_unknown_modes() {
    let Some(tools) = skip::needs(skip::DEPLOY_TOOLS, tools()) else {
        return;
    };
    let error = tools.render_error(&[
        "--set",
        "tls.enabled=true,tls.secretName=x,tls.clientIdentity=off",
    ]);
    assert!(
        error.contains("tls.clientIdentity=off needs tls.mtls=true"),
        "{error}"
    );
    let error = tools.render_error(&[
        "--set",
        "tls.enabled=true,tls.mtls=true,tls.secretName=x,tls.clientIdentity=maybe",
    ]);
    assert!(error.contains("clientIdentity"), "{error}");
}
