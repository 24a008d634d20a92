//! The refusals of libvirt 9.0's libssh and TLS transports, as its client reports them
//! (texts taken from the real-QEMU tier's failures), each turned into its line.

use super::*;

const SSH: &str = "qemu+libssh://bigfleet@127.0.0.1:2222/system?keyfile=/k/id_ed25519&known_hosts=/k/known_hosts&known_hosts_verify=normal";
const TLS: &str = "qemu+tls://localhost:16514/system?pkipath=/nonexistent/tls";

/// [`SSH`] with a known_hosts that exists (the refusals that look at it need one).
fn ssh_with_known_hosts() -> (String, std::path::PathBuf) {
    let file = std::env::temp_dir().join(format!("bigfleet-known-hosts-{}", std::process::id()));
    std::fs::write(&file, "").unwrap();
    (
        SSH.replace("/k/known_hosts", &file.display().to_string()),
        file,
    )
}

fn line(uri: &str, message: &str) -> (String, String) {
    let r = explain(uri, message).unwrap_or_else(|| panic!("{message:?} not recognised"));
    (r.refused, r.fix)
}

#[test]
fn ssh_host_key_refusals_name_known_hosts() {
    let (uri, known_hosts) = ssh_with_known_hosts();
    let (refused, fix) = line(
        &uri,
        "libssh transport error: SSH host key for '127.0.0.1' (72:e0) was not accepted",
    );
    assert!(
        refused.ends_with(&format!(
            "not in {} (unknown host key)",
            known_hosts.display()
        )),
        "{refused}"
    );
    assert!(fix.contains("[127.0.0.1]:2222 ssh-ed25519"), "{fix}");
    let cannot_verify = "libssh transport error: No user interaction callback provided: Can't verify the session host key";
    let (refused, _) = line(&uri, cannot_verify);
    assert!(refused.contains("(unknown host key)"), "{refused}");
    // libssh says the same when the file is not there at all.
    let (refused, fix) = line(SSH, cannot_verify);
    assert_eq!(
        refused,
        "the known_hosts file /k/known_hosts does not exist"
    );
    assert!(
        fix.contains("so that /k/known_hosts exists") && fix.contains("correct known_hosts="),
        "{fix}"
    );
    assert!(fix.contains("[127.0.0.1]:2222 ssh-ed25519"), "{fix}");
    let (refused, fix) = line(
        SSH,
        "authentication failed: !!! SSH HOST KEY VERIFICATION FAILED !!!: Identity of host '127.0.0.1:2222' differs",
    );
    assert!(
        refused.contains("differs from the one pinned in /k/known_hosts (changed host key"),
        "{refused}"
    );
    assert!(fix.contains("replace its line in /k/known_hosts"), "{fix}");
    let _ = std::fs::remove_file(known_hosts);
}

#[test]
fn ssh_key_refusals_name_the_key_and_the_user() {
    let (refused, _) = line(
        SSH,
        "authentication failed: error while reading private key '/k/id_ed25519'",
    );
    assert_eq!(refused, "the SSH key file /k/id_ed25519 does not exist");
    let (refused, _) = line(
        SSH,
        "authentication failed: error while opening private key '/k/id_ed25519', wrong passphrase?",
    );
    assert!(
        refused.contains("not an unencrypted OpenSSH private key"),
        "{refused}"
    );
    let (refused, fix) = line(
        SSH,
        "authentication failed: All provided authentication methods with credentials were rejected by the server",
    );
    assert!(
        refused
            .contains("refused the key /k/id_ed25519 for user \"bigfleet\" (key not authorised)"),
        "{refused}"
    );
    assert!(fix.contains("~bigfleet/.ssh/authorized_keys"), "{fix}");
    let (refused, fix) = line(
        SSH,
        "authentication unavailable: no polkit agent available to authenticate action 'org.libvirt.unix.manage'",
    );
    assert!(
        refused.contains("refused user \"bigfleet\": polkit does not allow it"),
        "{refused}"
    );
    assert!(fix.contains("49-bigfleet-libvirt.rules"), "{fix}");
}

#[test]
fn tls_client_refusals_name_pkipath() {
    let (refused, _) = line(
        TLS,
        "The client certificate /nonexistent/tls/clientcert.pem has expired",
    );
    assert_eq!(
        refused,
        "the client certificate /nonexistent/tls/clientcert.pem has expired"
    );
    let (refused, fix) = line(TLS, "Unable to read TLS confirmation: Input/output error");
    assert!(refused.contains("refused the client certificate /nonexistent/tls/clientcert.pem (its DN (unreadable) is not in the host's tls_allowed_dn_list)"), "{refused}");
    assert!(fix.contains("virt-pki-query-dn"), "{fix}");
    let (refused, _) = line(
        TLS,
        "Cannot read CA certificate '/nonexistent/tls/cacert.pem': No such file or directory",
    );
    assert!(refused.contains("missing or unreadable"), "{refused}");
}

#[test]
fn the_line_redacts_and_doctor_finds_the_fix() {
    let uri = "qemu+libssh://bigfleet:secret@127.0.0.1:1/system?keyfile=/nonexistent/key&known_hosts=/nonexistent/kh&known_hosts_verify=normal";
    let message = "authentication failed: error while reading private key '/nonexistent/key'";
    let shown = describe(uri, message, "raw (libvirt error 45)");
    assert!(!shown.contains("secret"), "{shown}");
    assert!(
        shown.starts_with(
            "connect to qemu+libssh://bigfleet:***@127.0.0.1:1/system?keyfile=/nonexistent/key&"
        ),
        "{shown}"
    );
    assert!(
        shown.contains("(libvirt: raw (libvirt error 45)); fix: mount the SSH key Secret"),
        "{shown}"
    );
    assert!(fix_of(&shown).is_some_and(|f| f.starts_with("mount the SSH key Secret")));
    let plain = describe("qemu+unix:///system", "Failed to connect socket", "raw");
    assert_eq!(plain, "connect: raw");
    assert_eq!(fix_of(&plain), None);
    // doctor's detail and fix: the two halves, or the general advice.
    let (detail, fix) = connection_block("u", &shown);
    assert!(
        !detail.contains("; fix: ") && detail.starts_with("connect to "),
        "{detail}"
    );
    assert!(fix.starts_with("mount the SSH key Secret"), "{fix}");
    let (detail, fix) = connection_block("qemu+unix:///system", &plain);
    assert_eq!(detail, "qemu+unix:///system: connect: raw");
    assert!(fix.starts_with("check the --connect URI"), "{fix}");
}

#[test]
fn uris_split_into_user_host_and_port() {
    let t = Target::parse(SSH);
    assert_eq!(
        (t.user.as_str(), t.host.as_str(), t.port),
        ("bigfleet", "127.0.0.1", Some(2222))
    );
    let t = Target::parse("qemu+tls://[::1]/system");
    assert_eq!(
        (t.host.as_str(), t.port, t.tls_port()),
        ("::1", None, 16514)
    );
}
