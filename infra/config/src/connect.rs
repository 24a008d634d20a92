//! The `--connect` grammar (docs/libvirt.md §2.1): one bare libvirt URI for
//! `--default-zone`, or a comma-separated `zone=uri` list, one entry per libvirt host.
//!
//! The bare-versus-list decision follows the reference heuristic exactly, because a URI's
//! query string may itself contain `=` (`?keyfile=/k`): a value without a comma is bare when it
//! has no `=` at all, or when the text before its first `=` contains a `:` (a zone label never
//! does, a URI scheme always does). Every zone label, including `--default-zone`, is checked
//! here, and every URI goes through the security gate in `uri`.

use std::collections::BTreeSet;

use super::ConfigError;
use super::uri::{parse_uri, redact, validate_connect_uri};

/// One libvirt host: the zone it serves and the URI the client dials (verbatim).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostConnection {
    /// The zone this host serves.
    pub zone: String,
    /// The libvirt connection URI.
    pub uri: String,
}

impl HostConnection {
    /// The local program libvirt's client runs to reach this host, if its transport spawns
    /// one: the `ssh` transport runs `ssh` (or its `command=` override), the `ext` transport
    /// its `command=`. The `libssh`/`libssh2`, `tls` and local transports run nothing.
    #[must_use]
    pub fn client_program(&self) -> Option<String> {
        let parsed = parse_uri(&self.uri).ok()?;
        let command = parsed
            .query
            .iter()
            .rev()
            .find(|(key, value)| key == "command" && !value.is_empty())
            .map(|(_, value)| value.clone());
        match parsed
            .scheme
            .split_once('+')
            .map(|(_, transport)| transport)
        {
            Some("ssh") => Some(command.unwrap_or_else(|| "ssh".to_owned())),
            Some("ext") => command,
            _ => None,
        }
    }

    /// The URI with any password masked, for messages.
    #[must_use]
    pub fn redacted_uri(&self) -> String {
        redact(&self.uri)
    }
}

/// Checks `--default-zone`: non-empty and free of `:` and `/`, because it becomes a zone
/// label (and, for the fake, the stem of `<zone>-a`/`<zone>-b`).
///
/// # Errors
/// [`ConfigError::DefaultZone`] naming the problem.
pub fn validate_default_zone(zone: &str) -> Result<(), ConfigError> {
    let problem = if zone.trim().is_empty() {
        "must not be empty"
    } else if zone.contains([':', '/']) {
        "must not contain ':' or '/'"
    } else {
        return Ok(());
    };
    Err(ConfigError::DefaultZone {
        zone: zone.to_owned(),
        problem,
    })
}

/// Parses `--connect`. An empty (or blank) value means no connections. `default_zone` is
/// validated whether or not it ends up used.
///
/// # Errors
/// A [`ConfigError`] naming `--connect` (or `--default-zone`) for a malformed entry, a bad
/// zone label, a repeated zone, an unparsable URI or one refused by the security gate.
pub fn parse_connect(raw: &str, default_zone: &str) -> Result<Vec<HostConnection>, ConfigError> {
    validate_default_zone(default_zone)?;
    let trimmed = raw.trim();
    if trimmed.is_empty() {
        return Ok(Vec::new());
    }
    if !trimmed.contains(',') && is_bare_uri(trimmed) {
        validate_connect_uri(trimmed)?;
        let zone = default_zone.to_owned();
        return Ok(vec![HostConnection {
            zone,
            uri: trimmed.to_owned(),
        }]);
    }
    let mut seen = BTreeSet::new();
    let mut connections = Vec::new();
    for part in trimmed
        .split(',')
        .map(str::trim)
        .filter(|part| !part.is_empty())
    {
        let connection = parse_entry(part)?;
        if !seen.insert(connection.zone.clone()) {
            return Err(ConfigError::ConnectDuplicateZone {
                zone: connection.zone,
            });
        }
        connections.push(connection);
    }
    if connections.is_empty() {
        return Err(ConfigError::ConnectEmpty {
            raw: redact(trimmed),
        });
    }
    Ok(connections)
}

/// Bare when there is no `=`, or when the text before the first `=` contains a `:`.
fn is_bare_uri(text: &str) -> bool {
    text.split_once('=')
        .is_none_or(|(before, _)| before.contains(':'))
}

fn parse_entry(part: &str) -> Result<HostConnection, ConfigError> {
    let entry_error = || ConfigError::ConnectEntry { part: redact(part) };
    let (zone, uri) = part.split_once('=').ok_or_else(entry_error)?;
    let (zone, uri) = (zone.trim(), uri.trim());
    if zone.is_empty() || uri.is_empty() {
        return Err(entry_error());
    }
    if zone.contains([':', '/']) {
        return Err(ConfigError::ConnectZone {
            zone: zone.to_owned(),
        });
    }
    validate_connect_uri(uri)?;
    Ok(HostConnection {
        zone: zone.to_owned(),
        uri: uri.to_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_program_names_what_the_transport_spawns() {
        let program = |uri: &str| conn("z", uri).client_program();
        assert_eq!(program("qemu+ssh://root@h/system").as_deref(), Some("ssh"));
        assert_eq!(
            program("qemu+ssh://h/system?command=/opt/ssh&command=/usr/bin/ssh").as_deref(),
            Some("/usr/bin/ssh"),
            "libvirt honours the last copy"
        );
        assert_eq!(
            program("qemu+ext:///system?command=/opt/dial").as_deref(),
            Some("/opt/dial")
        );
        for runs_nothing in [
            "qemu:///system",
            "qemu+libssh://h/system?keyfile=/k",
            "qemu+tls://h/system",
            "test:///default",
        ] {
            assert_eq!(program(runs_nothing), None, "{runs_nothing}");
        }
    }

    fn conn(zone: &str, uri: &str) -> HostConnection {
        HostConnection {
            zone: zone.into(),
            uri: uri.into(),
        }
    }

    fn parse(raw: &str) -> Vec<HostConnection> {
        parse_connect(raw, "local").unwrap_or_else(|e| panic!("{raw:?} refused: {e}"))
    }

    fn refuse(raw: &str) -> String {
        match parse_connect(raw, "local") {
            Ok(c) => panic!("{raw:?} accepted as {c:?}"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn empty_and_blank_mean_no_connections() {
        assert!(parse("").is_empty());
        assert!(parse("   ").is_empty());
    }

    #[test]
    fn bare_uri_goes_to_the_default_zone() {
        assert_eq!(
            parse(" qemu:///system "),
            vec![conn("local", "qemu:///system")]
        );
        let got = parse_connect("qemu:///system", "rack9").unwrap();
        assert_eq!(got, vec![conn("rack9", "qemu:///system")]);
    }

    #[test]
    fn bare_uri_with_query_params_is_kept_whole() {
        let uri = "qemu+libssh://h/system?keyfile=/k&known_hosts=/kh";
        assert_eq!(parse(uri), vec![conn("local", uri)]);
    }

    #[test]
    fn single_zone_entry_splits_on_the_first_equals() {
        let got = parse("rack1=qemu+libssh://h/system?keyfile=/k&known_hosts=/kh");
        assert_eq!(
            got,
            vec![conn(
                "rack1",
                "qemu+libssh://h/system?keyfile=/k&known_hosts=/kh"
            )]
        );
        assert_eq!(
            parse("rack1=qemu:///system"),
            vec![conn("rack1", "qemu:///system")]
        );
    }

    #[test]
    fn zone_list_keeps_order_trims_and_skips_empty_parts() {
        let got = parse(
            " rack2 = qemu+libssh://b/system?keyfile=/k ,, rack1=qemu+tls://a/system?pkipath=/p,",
        );
        assert_eq!(
            got,
            vec![
                conn("rack2", "qemu+libssh://b/system?keyfile=/k"),
                conn("rack1", "qemu+tls://a/system?pkipath=/p"),
            ]
        );
    }

    #[test]
    fn duplicate_zone_is_refused() {
        let msg = refuse("rack1=qemu:///system,rack1=qemu+tls://h/system");
        assert_eq!(
            msg,
            "--connect lists zone \"rack1\" twice; give each libvirt host its own zone name"
        );
    }

    #[test]
    fn entries_without_zone_or_uri_are_refused() {
        for raw in [
            "qemu:///system,rack1=qemu:///system",
            "=qemu:///system",
            "rack1=",
            "a,b",
        ] {
            let msg = refuse(raw);
            assert!(msg.starts_with("--connect entry "), "{raw:?}: {msg}");
            assert!(msg.contains("must be zone=uri"), "{msg}");
        }
    }

    #[test]
    fn zone_labels_with_colon_or_slash_are_refused() {
        for raw in [
            "ra/ck=qemu:///system",
            "a=qemu:///system,b/c=qemu:///system",
        ] {
            let msg = refuse(raw);
            assert!(msg.contains("must not contain ':' or '/'"), "{msg}");
        }
        // Inside a list every entry is zone=uri, even when the zone holds a ':'.
        assert!(refuse("x:y=qemu:///system,b=qemu:///system").contains("zone \"x:y\""));
    }

    #[test]
    fn only_commas_parse_to_nothing() {
        assert_eq!(
            refuse(" , ,"),
            "--connect \", ,\" parsed to no host connections; give a libvirt URI or a \
             comma-separated zone=uri list, or leave the flag empty"
        );
    }

    #[test]
    fn default_zone_is_validated_even_without_connect() {
        for (zone, problem) in [("", "must not be empty"), (" ", "must not be empty")] {
            let err = parse_connect("", zone).unwrap_err().to_string();
            assert!(
                err.starts_with("--default-zone ") && err.contains(problem),
                "{err}"
            );
        }
        for zone in ["a:b", "a/b"] {
            let err = parse_connect("qemu:///system", zone)
                .unwrap_err()
                .to_string();
            assert!(err.contains("must not contain ':' or '/'"), "{err}");
        }
        assert!(validate_default_zone("local").is_ok());
    }

    #[test]
    fn every_uri_goes_through_the_security_gate() {
        assert!(refuse("qemu+tcp://h/system").contains("plaintext qemu+tcp://"));
        assert!(refuse("a=qemu:///system,b=qemu+tcp://h/system").contains("plaintext"));
        let msg = refuse("rack1=qemu+libssh://h/system?known_hosts_verify=ignore");
        assert!(msg.contains("known_hosts_verify=normal"), "{msg}");
        assert!(refuse("rack1=nonsense").starts_with("invalid --connect URI \"nonsense\""));
    }

    #[test]
    fn passwords_never_reach_error_messages() {
        let msg = refuse("rack1=qemu+tcp://root:hunter2@h/system");
        assert!(
            !msg.contains("hunter2") && msg.contains("root:***@h"),
            "{msg}"
        );
        let msg = refuse("qemu+tls://root:hunter2@h/system,rack1=qemu:///system");
        assert!(
            msg.starts_with("--connect entry") && !msg.contains("hunter2"),
            "{msg}"
        );
    }
}
