//! Why a dial to a remote host was refused, in one line an operator can act on.
//!
//! libvirt reports a refused credential as its own text ("All provided authentication
//! methods with credentials were rejected by the server", "Unable to read TLS
//! confirmation"), which names neither the zone nor the file to change. A failed dial's
//! error is matched here against the refusals of the `qemu+libssh://` and `qemu+tls://`
//! transports (host key unknown or changed, known_hosts missing or unreadable, key file
//! missing, unreadable or not a key, key not authorised, polkit refusing the user, the
//! server certificate from another CA, for another host name or expired, the client
//! certificate expired, from another CA or its DN not allowed, a credential file missing).
//! A match becomes
//! `connect to <redacted URI>: <what was refused> (libvirt: <libvirt's text>); fix: <the fix>`;
//! anything else keeps libvirt's text after `connect: `. The same line goes to the serving
//! log (with the zone) and to `doctor`, which shows the part after `; fix: ` as the fix.
//!
//! libvirt's client reports every failed check of the server's certificate as the same
//! "Failed to verify peer's certificate"; [`crate::host::tls_peer`] then looks at the certificate
//! the host presents to tell the three causes apart.
//!
//! Secrets never appear: the line names files, never their contents, and the URI is
//! redacted (a `user:password@` is masked).

use std::io::ErrorKind;

use bigfleet_libvirt_config::{query_value, redact_uri};
use virt::error::Error as VirtError;

use crate::host::error::text;
use crate::host::tls_peer;

/// Where a refused dial was going: the parts of the URI the fixes name.
struct Target {
    scheme: String,
    user: String,
    host: String,
    port: Option<u16>,
}

impl Target {
    fn parse(uri: &str) -> Self {
        let (scheme, rest) = uri.split_once("://").unwrap_or(("", uri));
        let authority = &rest[..rest.find(['/', '?', '#']).unwrap_or(rest.len())];
        let (userinfo, hostport) = authority.rsplit_once('@').unwrap_or(("", authority));
        let user = userinfo.split(':').next().unwrap_or_default().to_owned();
        let (host, port) = match hostport.strip_prefix('[') {
            Some(v6) => {
                let (host, after) = v6.split_once(']').unwrap_or((v6, ""));
                (host, after.strip_prefix(':').and_then(|p| p.parse().ok()))
            }
            None => match hostport.rsplit_once(':') {
                Some((h, p)) => (h, p.parse().ok()),
                None => (hostport, None),
            },
        };
        Self {
            scheme: scheme.to_ascii_lowercase(),
            user,
            host: host.to_owned(),
            port,
        }
    }

    fn ssh_user(&self) -> String {
        if self.user.is_empty() {
            "the provider's user".to_owned()
        } else {
            format!("user {:?}", self.user)
        }
    }

    fn tls_port(&self) -> u16 {
        self.port.unwrap_or(16514)
    }
}

/// What was refused and how to fix it.
struct Refusal {
    refused: String,
    fix: String,
}

fn refusal(refused: impl Into<String>, fix: impl Into<String>) -> Option<Refusal> {
    Some(Refusal {
        refused: refused.into(),
        fix: fix.into(),
    })
}

/// The line for a failed `virConnectOpen` of `uri`.
pub(crate) fn connect_failure(uri: &str, error: &VirtError) -> String {
    describe(uri, error.message(), &text(error))
}

fn describe(uri: &str, message: &str, raw: &str) -> String {
    match explain(uri, message) {
        Some(r) => format!(
            "connect to {}: {} (libvirt: {raw}); fix: {}",
            redact_uri(uri),
            r.refused,
            r.fix
        ),
        None => format!("connect: {raw}"),
    }
}

/// The fix of a line made by [`connect_failure`], for `doctor`'s fix column.
#[must_use]
pub fn fix_of(line: &str) -> Option<&str> {
    line.starts_with("connect to ")
        .then(|| line.rsplit_once("; fix: ").map(|(_, fix)| fix))
        .flatten()
}

/// `doctor`'s detail and fix for a host it could not connect to: a refusal explained by
/// [`connect_failure`] split into its two halves, anything else with the general advice.
pub(crate) fn connection_block<'a>(uri: &str, error: &'a str) -> (String, &'a str) {
    match error.rsplit_once("; fix: ") {
        Some((detail, fix)) if fix_of(error).is_some() => (detail.to_owned(), fix),
        _ => (
            format!("{uri}: {error}"),
            "check the --connect URI, that libvirtd runs there, and this process's \
             credentials for it (ssh key, TLS certificate or socket permissions)",
        ),
    }
}

fn explain(uri: &str, message: &str) -> Option<Refusal> {
    let target = Target::parse(uri);
    match target.scheme.split_once('+').map(|(_, t)| t) {
        Some("libssh" | "libssh2") => ssh(uri, &target, message),
        Some("tls") => tls(uri, &target, message),
        None if !target.host.is_empty() => tls(uri, &target, message),
        _ => None,
    }
}

fn ssh(uri: &str, target: &Target, message: &str) -> Option<Refusal> {
    let known_hosts = query_value(uri, "known_hosts").unwrap_or_else(|| "known_hosts".into());
    let keyfile = query_value(uri, "keyfile").unwrap_or_else(|| "the key file".into());
    let host = match target.port {
        Some(port) => format!("{}:{port}", target.host),
        None => target.host.clone(),
    };
    let user = target.ssh_user();
    // With an auth callback libvirt asks and reports "was not accepted"; without one (the
    // provider has none) it cannot ask.
    if (message.contains("was not accepted") && message.contains("SSH host key"))
        || message.contains("Can't verify the session host key")
    {
        return unknown_host(&known_hosts, &host, target);
    }
    if message.contains("HOST KEY VERIFICATION FAILED") {
        return refusal(
            format!(
                "the SSH host key of {host} differs from the one pinned in {known_hosts} \
                 (changed host key: a reinstalled host, a rotated key, or a man in the middle)"
            ),
            format!(
                "check on the host itself that its key changed (its \
                 /etc/ssh/ssh_host_*_key.pub), then replace its line in {known_hosts}; if it \
                 did not change, do not connect"
            ),
        );
    }
    if message.contains("error while reading private key") {
        return key_unreadable(&keyfile);
    }
    if message.contains("error while opening private key") {
        return refusal(
            format!("{keyfile} is not an unencrypted OpenSSH private key"),
            format!(
                "put the private key (ssh-keygen -t ed25519 -N '') in {keyfile}; keys with a \
                 passphrase cannot be used"
            ),
        );
    }
    if message.contains("authentication methods with credentials were rejected") {
        return refusal(
            format!("the host's sshd refused the key {keyfile} for {user} (key not authorised)"),
            format!(
                "append the key's public half (ssh-keygen -y -f {keyfile}) to \
                 ~{}/.ssh/authorized_keys on the host (deploy/README.md step 2 A); libvirt \
                 offers {keyfile}.pub instead of the key's own public half when that file \
                 exists, so replace or remove it with the key",
                target.user
            ),
        );
    }
    polkit(target, message)
}

/// libssh could not verify the host key: a missing or unreadable known_hosts (libssh says
/// the same then), or a host not in it.
fn unknown_host(known_hosts: &str, host: &str, target: &Target) -> Option<Refusal> {
    match std::fs::File::open(known_hosts) {
        Err(e) if e.kind() == ErrorKind::NotFound => {
            return refusal(
                format!("the known_hosts file {known_hosts} does not exist"),
                format!(
                    "mount the SSH Secret with its known_hosts (a line `{}` for each host, \
                     from the host's /etc/ssh/ssh_host_ed25519_key.pub) so that {known_hosts} \
                     exists (the chart mounts it at /etc/bigfleet/libvirt-ssh), or correct \
                     known_hosts= in --connect",
                    known_host_name(target)
                ),
            );
        }
        Err(e) if e.kind() == ErrorKind::PermissionDenied => {
            return refusal(
                format!("the known_hosts file {known_hosts} cannot be read by this process"),
                format!(
                    "mount the SSH Secret so that {known_hosts} is readable by the provider's \
                     uid (the chart mounts it at /etc/bigfleet/libvirt-ssh with mode 0440)"
                ),
            );
        }
        _ => {}
    }
    refusal(
        format!("the SSH host key of {host} is not in {known_hosts} (unknown host key)"),
        format!(
            "add the host's public key to {known_hosts} as a line `{}` (take it from the \
             host's /etc/ssh/ssh_host_ed25519_key.pub, not from the network), then update \
             the Secret",
            known_host_name(target)
        ),
    )
}

fn polkit(target: &Target, message: &str) -> Option<Refusal> {
    let polkit_said = message.contains("polkit")
        || message.contains("PolicyKit")
        || message.contains("access denied by policy");
    polkit_said.then_some(())?;
    let user = target.ssh_user();
    refusal(
        format!(
            "libvirtd on {} refused {user}: polkit does not allow it to manage libvirt",
            target.host
        ),
        format!(
            "on the host, add {} to the libvirt group and install \
             deploy/examples/49-bigfleet-libvirt.rules in /etc/polkit-1/rules.d/ \
             (deploy/README.md step 2 A)",
            target.user
        ),
    )
}

fn key_unreadable(keyfile: &str) -> Option<Refusal> {
    let why = match std::fs::File::open(keyfile) {
        Err(e) if e.kind() == ErrorKind::NotFound => "does not exist",
        Err(e) if e.kind() == ErrorKind::PermissionDenied => "cannot be read by this process",
        _ => "cannot be read",
    };
    refusal(
        format!("the SSH key file {keyfile} {why}"),
        format!(
            "mount the SSH key Secret so that {keyfile} exists and is readable by the \
             provider's uid (the chart mounts it at /etc/bigfleet/libvirt-ssh with mode \
             0440), or correct keyfile= in --connect"
        ),
    )
}

fn known_host_name(target: &Target) -> String {
    match target.port {
        Some(port) if port != 22 => format!("[{}]:{port} ssh-ed25519 AAAA...", target.host),
        _ => format!("{} ssh-ed25519 AAAA...", target.host),
    }
}

fn tls(uri: &str, target: &Target, message: &str) -> Option<Refusal> {
    let pkipath = query_value(uri, "pkipath").unwrap_or_else(|| "/etc/pki".into());
    let host = format!("{}:{}", target.host, target.tls_port());
    if message.contains("has expired") && message.contains("client certificate") {
        return refusal(
            format!("the client certificate {pkipath}/clientcert.pem has expired"),
            format!(
                "issue a new client certificate with the same DN and replace clientcert.pem \
                 and clientkey.pem in {pkipath} (the next dial uses them; SIGHUP redials at once)"
            ),
        );
    }
    if message.contains("Our own certificate") && message.contains("failed validation") {
        return refusal(
            format!("the client certificate in {pkipath} is not signed by {pkipath}/cacert.pem"),
            format!("put the client certificate the hosts' CA issued, and that CA, in {pkipath}"),
        );
    }
    if message.contains("Cannot read")
        || message.contains("Cannot access")
        || message.contains("Error while reading file")
    {
        return refusal(
            format!("a TLS credential file in {pkipath} is missing or unreadable"),
            format!(
                "mount the TLS Secret at {pkipath} with cacert.pem, clientcert.pem and \
                 clientkey.pem readable by the provider's uid (the chart: \
                 /etc/bigfleet/libvirt-tls, mode 0440)"
            ),
        );
    }
    if message.contains("Failed to verify peer's certificate") {
        return Some(server_certificate(target, &pkipath, &host));
    }
    if message.contains("Unable to read TLS confirmation") {
        return refusal(
            format!(
                "libvirtd on {host} refused the client certificate {pkipath}/clientcert.pem \
                 (its DN {} is not in the host's tls_allowed_dn_list)",
                tls_peer::subject(&format!("{pkipath}/clientcert.pem"))
            ),
            "add that DN, exactly as virt-pki-query-dn prints it, to tls_allowed_dn_list in \
             the host's libvirtd.conf and restart libvirtd (deploy/README.md step 2 B)",
        );
    }
    None
}

fn server_certificate(target: &Target, pkipath: &str, host: &str) -> Refusal {
    let ca = format!("{pkipath}/cacert.pem");
    let found = tls_peer::check(&target.host, target.tls_port(), &ca);
    let (refused, fix) = match found {
        tls_peer::Verdict::OtherCa => (
            format!(
                "the server certificate of {host} is not signed by the CA in {ca} (another CA)"
            ),
            format!(
                "put the CA that issued the host's server certificate in {ca}, or reissue the \
                 host's /etc/pki/libvirt/servercert.pem from this CA"
            ),
        ),
        tls_peer::Verdict::WrongName => (
            format!(
                "the server certificate of {host} is not issued for the name {:?} (hostname mismatch)",
                target.host
            ),
            format!(
                "use the host name the certificate names in --connect, or reissue the host's \
                 certificate with {:?} in its subjectAltName",
                target.host
            ),
        ),
        tls_peer::Verdict::Expired => (
            format!("the server certificate of {host} has expired"),
            "reissue the host's /etc/pki/libvirt/servercert.pem and restart libvirtd".to_owned(),
        ),
        tls_peer::Verdict::Unknown(why) => (
            format!("the server certificate of {host} was refused ({why})"),
            format!(
                "check that {ca} holds the CA of the host's certificate and that the \
                 certificate names {:?} and is in date",
                target.host
            ),
        ),
    };
    Refusal { refused, fix }
}

#[cfg(test)]
#[path = "credentials_tests.rs"]
mod tests;
