//! The guest's serial console, read back through libvirt.
//!
//! Every domain's serial port writes to a log file beside its seed (`render::xml`): libvirt's
//! log daemon (virtlogd) writes it, rewrites it at each start and rotates it at its
//! configured size, so it is bounded on the host. The file is a volume of the seed's pool,
//! so its end is read here with a volume download, which works for remote hosts too, where
//! the host's files are out of reach. When a guest does not come up (its start fails or it
//! stops, or its agent cannot be reached), the last lines of this boot go into the machine's
//! `last_error` and timeline: usually the kernel's or the init system's own words.

use std::borrow::Cow;

use virt::domain::Domain;
use virt::storage_vol::StorageVol;

use bigfleet_libvirt_observe::timeline::{self, Timeline, What};

use crate::host::error::text;
use crate::host::session::Session;
use crate::storage::readback::download;

/// How much of the log's end is read.
const TAIL_BYTES: u64 = 16 * 1024;

/// How many of the last non-blank lines are quoted.
const QUOTED_LINES: usize = 8;

/// The most bytes of console text quoted (the front is cut first).
pub(crate) const QUOTED_BYTES: usize = 600;

/// The console log's path a domain definition names (its first `<serial>`'s `<log file>`),
/// if it keeps one.
pub(crate) fn log_path(domain_xml: &str) -> Option<String> {
    let document = roxmltree::Document::parse(domain_xml).ok()?;
    // A `<serial>` of `<devices>`: a disk's `<serial>` is its serial number.
    let serial = (document.descendants()).find(|n| {
        n.has_tag_name("serial") && n.parent().is_some_and(|p| p.has_tag_name("devices"))
    })?;
    let log = serial.children().find(|n| n.has_tag_name("log"))?;
    log.attribute("file")
        .filter(|path| !path.is_empty())
        .map(str::to_owned)
}

/// The last lines of `domain`'s console, quoted for an error: `Ok(None)` when there is
/// nothing to quote (the domain keeps no console log, as domains defined by older versions
/// of the provider, or it is empty, or the host is libvirt's test driver, which runs no
/// guest).
///
/// # Errors
/// The libvirt call that failed, in its words.
pub(crate) fn last_lines(session: &Session, domain: &Domain) -> Result<Option<String>, String> {
    if session.test_driver {
        return Ok(None);
    }
    let document =
        (domain.xml_desc(0)).map_err(|e| format!("read the definition: {}", text(&e)))?;
    let Some(path) = log_path(&document) else {
        return Ok(None);
    };
    let volume = (session.conn.lookup_storage_vol_by_path(&path))
        .map_err(|e| format!("find the console log {path}: {}", text(&e)))?;
    let tail = read_tail(session, &volume).map_err(|e| format!("read {path}: {e}"))?;
    Ok(quote(&tail))
}

/// `message` (why the guest did not come up) with the last lines of `domain`'s console
/// after it; the lines also go on machine `machine_id`'s timeline. A console that cannot be
/// read leaves the message as it is, and says why in a warning.
pub(crate) fn explain(
    message: &mut String,
    session: &Session,
    domain: &Domain,
    machine_id: &str,
    timeline: &Timeline,
) {
    match last_lines(session, domain) {
        Ok(Some(lines)) => {
            timeline.record(
                machine_id,
                None,
                What::Console(timeline::bounded_end(&lines)),
            );
            message.push_str("; the guest's console ended with: ");
            message.push_str(&lines);
        }
        Ok(None) => {}
        Err(e) => tracing::warn!(
            machine = machine_id, error = %e,
            "the guest's console log could not be read"
        ),
    }
}

/// The log's last [`TAIL_BYTES`] bytes, over a libvirt stream.
fn read_tail(session: &Session, volume: &StorageVol) -> Result<Vec<u8>, String> {
    // For a file, libvirt re-reads its size here: the log keeps growing while the guest runs.
    let size = (volume.info())
        .map_err(|e| format!("size: {}", text(&e)))?
        .capacity;
    let offset = size.saturating_sub(TAIL_BYTES);
    let length = size - offset;
    let mut tail = Vec::new();
    if length == 0 {
        return Ok(tail);
    }
    download(&session.conn, volume, (offset, length), 4096, |chunk| {
        tail.extend_from_slice(chunk);
        // libvirt sends no more than asked; this bound holds even if it did.
        (tail.len() as u64) <= TAIL_BYTES
    })?;
    Ok(tail)
}

/// The last [`QUOTED_LINES`] non-blank lines of console output `bytes`, joined with ` | `
/// and cut to [`QUOTED_BYTES`] from the front: terminal escape sequences removed, other
/// control characters and invalid UTF-8 replaced, so the quote is one line of plain text.
/// `None` when nothing printable is left.
pub(crate) fn quote(bytes: &[u8]) -> Option<String> {
    let lossy = String::from_utf8_lossy(bytes);
    let plain: Cow<'_, str> = console::strip_ansi_codes(&lossy);
    let lines: Vec<String> = plain
        .split(['\n', '\r'])
        .map(|line| {
            let shown: String = (line.chars())
                .map(|c| if c.is_control() { ' ' } else { c })
                .collect();
            shown.split_whitespace().collect::<Vec<_>>().join(" ")
        })
        .filter(|line| !line.is_empty())
        .collect();
    let first = lines.len().saturating_sub(QUOTED_LINES);
    let joined = lines[first..].join(" | ");
    if joined.is_empty() {
        return None;
    }
    if joined.len() <= QUOTED_BYTES {
        return Some(joined);
    }
    let mut start = joined.len() - QUOTED_BYTES;
    while !joined.is_char_boundary(start) {
        start += 1;
    }
    Some(format!("…{}", &joined[start..]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_log_path_is_the_first_serials_log_file() {
        let domain = "<domain><devices>
            <disk><serial>root</serial></disk>
            <channel type='unix'><log file='/not/this'/></channel>
            <serial type='pty'><log file='/pool/d-console.log' append='off'/></serial>
            <serial type='pty'><log file='/second'/></serial>
            </devices></domain>";
        assert_eq!(log_path(domain).as_deref(), Some("/pool/d-console.log"));
        let without = "<domain><devices><serial type='pty'/></devices></domain>";
        assert_eq!(log_path(without), None, "an older domain keeps no log");
        let empty = "<domain><devices><serial><log file=''/></serial></devices></domain>";
        assert_eq!(log_path(empty), None);
        assert_eq!(log_path("not xml"), None);
    }

    #[test]
    fn the_quote_is_the_last_lines_of_plain_text() {
        let boot: String = (1..=20)
            .map(|n| format!("[    {n}.000000] line {n}\r\n"))
            .collect();
        let quoted = quote(boot.as_bytes()).unwrap();
        assert!(quoted.starts_with("[ 13.000000] line 13 | "), "{quoted}");
        assert!(quoted.ends_with("[ 20.000000] line 20"), "{quoted}");
        assert_eq!(quoted.matches(" | ").count(), QUOTED_LINES - 1);

        // systemd's colours and a terminal's control bytes go; blank lines do not count.
        let coloured = b"[\x1b[0;32m  OK  \x1b[0m] Started x.\r\n\r\n\x07bell\ttab\x00nul\n\n";
        assert_eq!(
            quote(coloured).as_deref(),
            Some("[ OK ] Started x. | bell tab nul")
        );
        // Invalid UTF-8 is replaced, not dropped silently.
        assert_eq!(
            quote(b"ok \xff\xfe\n").as_deref(),
            Some("ok \u{fffd}\u{fffd}")
        );
        assert_eq!(quote(b"\r\n \x1b[2J\n"), None, "nothing printable");
        assert_eq!(quote(b""), None);
    }

    #[test]
    fn a_long_quote_keeps_its_end_on_a_character_boundary() {
        let noisy = "é".repeat(2000);
        let quoted = quote(format!("first\n{noisy}\nlast words").as_bytes()).unwrap();
        assert!(quoted.len() <= QUOTED_BYTES + "…".len(), "{}", quoted.len());
        assert!(quoted.starts_with('…'), "{quoted}");
        assert!(quoted.ends_with("é | last words"), "{quoted}");
    }
}
