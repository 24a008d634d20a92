//! The `--connect` URI security gate (docs/libvirt.md §2.2).
//!
//! There is no URL crate in the workspace, and a libvirt URI needs only three things checked:
//! its scheme (which names the transport), whether it has a host, and its query parameters.
//! A small hand parser extracts exactly those. The gate then refuses the transports and
//! options that would let the cluster-join secret travel in the clear or to an unverified
//! host. Query parameters are percent-decoded and every occurrence of a repeated parameter is
//! checked, because libvirt decodes and may honour the last copy: neither can sneak an
//! option past the gate.

use super::ConfigError;

/// The parts of a libvirt URI the gate looks at.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct ParsedUri {
    /// The scheme, lower-cased (`qemu+libssh`).
    pub scheme: String,
    /// The host (userinfo removed), empty for a local socket.
    pub host: String,
    /// Query parameters in order, percent-decoded.
    pub query: Vec<(String, String)>,
}

impl ParsedUri {
    /// Every value given for `key`.
    fn values<'a>(&'a self, key: &'a str) -> impl Iterator<Item = &'a str> {
        self.query
            .iter()
            .filter(move |(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    fn has(&self, key: &str) -> bool {
        self.values(key).next().is_some()
    }

    /// Whether any `no_verify` value is present, non-empty and not exactly `0`.
    fn no_verify(&self) -> bool {
        self.values("no_verify").any(|v| !v.is_empty() && v != "0")
    }

    /// The transport: the part of the scheme after `+`, else `tls` for a remote bare scheme,
    /// else empty (local socket).
    fn transport(&self) -> &str {
        match self.scheme.split_once('+') {
            Some((_, transport)) => transport,
            None if !self.host.is_empty() => "tls",
            None => "",
        }
    }
}

/// Splits `uri` into scheme, host and query.
pub(super) fn parse_uri(uri: &str) -> Result<ParsedUri, String> {
    let (scheme, rest) = match uri.split_once("://") {
        Some((scheme, rest)) => (scheme, Some(rest)),
        None => (uri.split_once(':').map_or("", |(scheme, _)| scheme), None),
    };
    if scheme.is_empty() {
        return Err(
            "missing scheme; write e.g. qemu:///system or qemu+libssh://host/system".into(),
        );
    }
    let valid_scheme = scheme.starts_with(|c: char| c.is_ascii_alphabetic())
        && scheme
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c));
    if !valid_scheme {
        return Err(format!(
            "scheme {scheme:?} is not valid; write e.g. qemu+libssh://host/system"
        ));
    }
    let host = rest.map_or("", |rest| {
        let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
        authority
            .rsplit_once('@')
            .map_or(authority, |(_, host)| host)
    });
    let without_fragment = uri.split_once('#').map_or(uri, |(before, _)| before);
    let query = match without_fragment.split_once('?') {
        Some((_, query)) => parse_query(query)?,
        None => Vec::new(),
    };
    Ok(ParsedUri {
        scheme: scheme.to_ascii_lowercase(),
        host: host.to_owned(),
        query,
    })
}

fn parse_query(query: &str) -> Result<Vec<(String, String)>, String> {
    query
        .split('&')
        .filter(|pair| !pair.is_empty())
        .map(|pair| {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            Ok((percent_decode(key)?, percent_decode(value)?))
        })
        .collect()
}

fn percent_decode(text: &str) -> Result<String, String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = text
                .get(i + 1..i + 3)
                .and_then(|h| u8::from_str_radix(h, 16).ok());
            let Some(byte) = hex else {
                return Err(format!(
                    "bad percent-escape in query {text:?}; escape '%' as %25"
                ));
            };
            out.push(byte);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| format!("query {text:?} does not decode to UTF-8"))
}

/// The refusal for an option the plain ssh transport ignores (it would look like host-key
/// checking while doing none).
macro_rules! ignored_by_ssh {
    ($option:literal) => {
        concat!(
            "sets ",
            $option,
            " on the ssh transport, which ignores it; use the qemu+libssh:// scheme (which \
             honours keyfile/known_hosts)"
        )
    };
}

const NO_VERIFY_SSH: &str = "sets no_verify, disabling SSH host-key verification; remove it";

/// Applies the transport security rules to one URI.
pub(super) fn validate_connect_uri(uri: &str) -> Result<(), ConfigError> {
    let parsed = parse_uri(uri).map_err(|problem| ConfigError::ConnectUri {
        uri: redact(uri),
        problem,
    })?;
    let problem = match parsed.transport() {
        "ssh" => ssh_problem(&parsed),
        "libssh" | "libssh2" => libssh_problem(&parsed),
        "tls" if parsed.no_verify() => {
            Some("sets no_verify, disabling TLS server-certificate verification; remove it")
        }
        "tcp" => Some(
            "uses plaintext qemu+tcp:// (no encryption or authentication); the cluster-join \
             secret would travel in the clear, so use qemu+tls:// or qemu+libssh://",
        ),
        _ => None,
    };
    match problem {
        Some(problem) => Err(ConfigError::ConnectInsecure {
            uri: redact(uri),
            problem,
        }),
        None => Ok(()),
    }
}

fn ssh_problem(parsed: &ParsedUri) -> Option<&'static str> {
    if parsed.has("known_hosts") {
        Some(ignored_by_ssh!("known_hosts"))
    } else if parsed.has("known_hosts_verify") {
        Some(ignored_by_ssh!("known_hosts_verify"))
    } else if parsed.has("sshauth") {
        Some(ignored_by_ssh!("sshauth"))
    } else {
        parsed.no_verify().then_some(NO_VERIFY_SSH)
    }
}

fn libssh_problem(parsed: &ParsedUri) -> Option<&'static str> {
    if parsed
        .values("known_hosts_verify")
        .any(|v| !v.is_empty() && v != "normal")
    {
        return Some(
            "must use known_hosts_verify=normal (strict against known_hosts); 'auto' \
             (trust-on-first-use) and 'ignore' leave a host-key MITM window",
        );
    }
    parsed.no_verify().then_some(NO_VERIFY_SSH)
}

/// The last value of query parameter `key` in `uri`, percent-decoded (libvirt honours the
/// last copy); `None` when absent or when the URI does not parse.
#[must_use]
pub fn query_value(uri: &str, key: &str) -> Option<String> {
    parse_uri(uri).ok()?.values(key).last().map(str::to_owned)
}

/// Masks the password of a `user:password@` userinfo so error messages never leak it.
#[must_use]
pub fn redact(uri: &str) -> String {
    let Some((scheme, rest)) = uri.split_once("://") else {
        return uri.to_owned();
    };
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let authority = &rest[..authority_end];
    let Some((userinfo, host)) = authority.rsplit_once('@') else {
        return uri.to_owned();
    };
    let Some((user, _password)) = userinfo.split_once(':') else {
        return uri.to_owned();
    };
    format!("{scheme}://{user}:***@{host}{}", &rest[authority_end..])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn accepts(uri: &str) {
        if let Err(e) = validate_connect_uri(uri) {
            panic!("{uri:?} refused: {e}");
        }
    }

    fn refuses(uri: &str, needle: &str) {
        match validate_connect_uri(uri) {
            Ok(()) => panic!("{uri:?} accepted"),
            Err(e) => {
                let msg = e.to_string();
                assert!(msg.starts_with("--connect URI ") || msg.starts_with("invalid --connect"));
                assert!(msg.contains(needle), "{uri:?}: {msg} lacks {needle:?}");
            }
        }
    }

    #[test]
    fn parser_extracts_scheme_host_and_query() {
        let p =
            parse_uri("QEMU+LibSSH://root@h.example:22/system?keyfile=/k&flag&x=a=b#frag").unwrap();
        assert_eq!(p.scheme, "qemu+libssh");
        assert_eq!(p.host, "h.example:22");
        let query = [("keyfile", "/k"), ("flag", ""), ("x", "a=b")];
        assert_eq!(p.query, query.map(|(k, v)| (k.to_owned(), v.to_owned())));
        let local = parse_uri("qemu:///system").unwrap();
        assert_eq!((local.scheme.as_str(), local.host.as_str()), ("qemu", ""));
        assert_eq!(parse_uri("test:default").unwrap().scheme, "test");
        assert_eq!(parse_uri("qemu+tls://h?no_verify=1").unwrap().host, "h");
    }

    #[test]
    fn parser_refuses_missing_or_bad_scheme_and_bad_escapes() {
        refuses("system", "missing scheme");
        refuses("://h/system", "missing scheme");
        refuses("1qemu:///system", "is not valid");
        refuses("qe mu:///system", "is not valid");
        refuses("qemu+libssh://h/system?keyfile=%zz", "percent-escape");
    }

    #[test]
    fn transport_comes_from_the_scheme_or_the_host() {
        let transport = |uri: &str| parse_uri(uri).unwrap().transport().to_owned();
        assert_eq!(transport("qemu+libssh://h/system"), "libssh");
        assert_eq!(transport("qemu://h/system"), "tls");
        assert_eq!(transport("qemu:///system"), "");
        assert_eq!(transport("qemu+unix:///system"), "unix");
    }

    #[test]
    fn libssh_must_verify_host_keys_strictly() {
        let fix = "known_hosts_verify=normal";
        for transport in ["libssh", "libssh2"] {
            let base = format!("qemu+{transport}://h/system");
            refuses(&format!("{base}?known_hosts_verify=ignore"), fix);
            refuses(&format!("{base}?known_hosts_verify=auto"), fix);
            refuses(&format!("{base}?known_hosts_verify=bogus"), fix);
            refuses(
                &format!("{base}?no_verify=1"),
                "disabling SSH host-key verification",
            );
            refuses(
                &format!("{base}?no_verify=yes"),
                "disabling SSH host-key verification",
            );
            accepts(&format!("{base}?keyfile=/k&known_hosts=/kh"));
            accepts(&format!(
                "{base}?keyfile=/k&known_hosts=/kh&known_hosts_verify=normal"
            ));
            accepts(&format!("{base}?known_hosts_verify="));
            accepts(&format!("{base}?no_verify=0"));
            accepts(&format!("{base}?no_verify="));
        }
    }

    #[test]
    fn plain_ssh_refuses_options_it_ignores_and_no_verify() {
        let base = "qemu+ssh://root@h/system";
        for option in ["known_hosts", "known_hosts_verify", "sshauth"] {
            let msg = validate_connect_uri(&format!("{base}?{option}=x")).unwrap_err();
            let msg = msg.to_string();
            assert!(
                msg.contains(&format!("sets {option} on the ssh transport")),
                "{msg}"
            );
            assert!(msg.contains("use the qemu+libssh:// scheme"), "{msg}");
        }
        refuses(
            &format!("{base}?no_verify=1"),
            "disabling SSH host-key verification",
        );
        accepts(base);
        accepts(&format!("{base}?keyfile=/root/.ssh/id"));
        accepts(&format!("{base}?no_verify=0"));
    }

    #[test]
    fn ssh_options_are_checked_in_order() {
        let uri = "qemu+ssh://h/system?sshauth=x&known_hosts_verify=y&known_hosts=z";
        refuses(uri, "sets known_hosts on");
        refuses(
            "qemu+ssh://h/system?sshauth=x&known_hosts_verify=y",
            "known_hosts_verify on",
        );
    }

    #[test]
    fn tls_refuses_no_verify_only() {
        refuses(
            "qemu+tls://h/system?no_verify=1",
            "TLS server-certificate verification",
        );
        refuses(
            "qemu://h/system?no_verify=1",
            "TLS server-certificate verification",
        );
        accepts("qemu+tls://h/system?pkipath=/etc/pki/bigfleet");
        accepts("qemu+tls://h/system?no_verify=0");
        accepts("qemu://h/system");
    }

    #[test]
    fn tcp_is_always_refused() {
        refuses("qemu+tcp://h/system", "use qemu+tls:// or qemu+libssh://");
        refuses("QEMU+TCP://h/system", "plaintext");
    }

    #[test]
    fn local_and_unknown_transports_pass() {
        accepts("qemu:///system");
        accepts("qemu:///session?no_verify=1");
        accepts("qemu+unix:///system?socket=/run/libvirt/libvirt-sock");
        accepts("test:///default");
        accepts("qemu+ext:///system?command=/bin/true");
    }

    #[test]
    fn encoded_or_repeated_parameters_cannot_slip_past() {
        refuses(
            "qemu+tls://h/system?no%5Fverify=1",
            "TLS server-certificate",
        );
        refuses(
            "qemu+tls://h/system?no_verify=0&no_verify=1",
            "TLS server-certificate",
        );
        refuses(
            "qemu+libssh://h/s?known_hosts_verify=normal&known_hosts_verify=auto",
            "normal",
        );
        refuses(
            "qemu+ssh://h/system?known%5Fhosts=/kh",
            "sets known_hosts on",
        );
    }

    #[test]
    fn redact_masks_only_the_password() {
        assert_eq!(
            redact("qemu+ssh://u:pw@h/s?x=1"),
            "qemu+ssh://u:***@h/s?x=1"
        );
        assert_eq!(redact("qemu+ssh://u@h/s"), "qemu+ssh://u@h/s");
        assert_eq!(redact("qemu:///system"), "qemu:///system");
        assert_eq!(redact("not a uri"), "not a uri");
        let msg = validate_connect_uri("qemu+tcp://u:pw@h/s")
            .unwrap_err()
            .to_string();
        assert!(msg.contains("u:***@h") && !msg.contains("pw@"), "{msg}");
    }
}
