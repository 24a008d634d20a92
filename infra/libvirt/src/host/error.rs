//! How libvirt's errors become the port's classified [`HypervisorError`]s.
//!
//! libvirt reports failures as a code plus a message. The adapter needs three things from
//! them: whether the object was simply absent (a missing domain is "already deleted", a
//! missing volume is "nothing to clean"), whether the connection itself died (then the host
//! goes unreachable and reconnects), and a short operator-facing text for `last_error`. The
//! text keeps libvirt's message and numeric code but drops the `[code=…, domain=…]` noise
//! of `virt::error::Error`'s `Display`.

use bigfleet_libvirt_ports::{HypervisorError, SideEffects};
use virt::error::{Error as VirtError, ErrorDomain, ErrorNumber};

/// `message (libvirt error N)`.
pub(crate) fn text(error: &VirtError) -> String {
    format!(
        "{} (libvirt error {})",
        error.message().trim_end_matches('.'),
        error.code().to_raw()
    )
}

/// libvirt's message for a domain that would not start, as one line of at most `limit`
/// bytes: QEMU's own words (libvirt quotes the tail of the domain's QEMU log, e.g. `failed
/// to set MSR 0x10a` then the `kvm_buf_set_msrs` assertion) are kept, line breaks and
/// control characters become spaces, and a longer text keeps its start and its end around
/// a `…`, since the cause is usually named first and QEMU's last words come last.
pub(crate) fn one_line(message: &str, limit: usize) -> String {
    let flat: String = message
        .split(|c: char| c.is_whitespace() || c.is_control())
        .filter(|word| !word.is_empty())
        .collect::<Vec<_>>()
        .join(" ");
    if flat.len() <= limit {
        return flat;
    }
    let half = limit / 2;
    let mut head = half;
    while !flat.is_char_boundary(head) {
        head -= 1;
    }
    let mut tail = flat.len() - half;
    while !flat.is_char_boundary(tail) {
        tail += 1;
    }
    format!("{} … {}", &flat[..head], &flat[tail..])
}

/// Whether the error says the domain does not exist.
pub(crate) fn is_missing_domain(error: &VirtError) -> bool {
    error.code().is(ErrorNumber::NoDomain)
}

/// Whether the error says the storage volume does not exist.
pub(crate) fn is_missing_volume(error: &VirtError) -> bool {
    error.code().is(ErrorNumber::NoStorageVolume)
}

/// Whether the error says the storage volume already exists. The QEMU driver answers
/// `StorageVolExist`; the test driver answers a generic failure with this wording.
pub(crate) fn is_volume_exists(error: &VirtError) -> bool {
    error.code().is(ErrorNumber::StorageVolExist)
        || (error.code().is(ErrorNumber::OperationFailed)
            && error.message().contains("already exists"))
}

/// Whether the driver does not implement the call at all.
pub(crate) fn is_unsupported(error: &VirtError) -> bool {
    error.code().is(ErrorNumber::NoSupport)
}

/// Whether the error means the connection to the host is gone (as opposed to a refused
/// request). The host's liveness probe is the second line of defence for anything missed.
pub(crate) fn is_connection_lost(error: &VirtError) -> bool {
    error.code().is_any(vec![
        ErrorNumber::SystemError,
        ErrorNumber::Rpc,
        ErrorNumber::NoConnect,
        ErrorNumber::InvalidConn,
        ErrorNumber::AuthFailed,
    ]) || error.domain().is(ErrorDomain::Rpc)
}

/// A failure that changed nothing on the host: safe to retry.
pub(crate) fn nothing_done(message: impl Into<String>) -> HypervisorError {
    HypervisorError {
        message: message.into(),
        side_effects: SideEffects::None,
    }
}

/// A failure after which the host may or may not have changed.
pub(crate) fn maybe_done(message: impl Into<String>) -> HypervisorError {
    HypervisorError::indefinite(message)
}

/// A failure whose effect happened although the call reports an error.
pub(crate) fn partly_done(message: impl Into<String>) -> HypervisorError {
    HypervisorError {
        message: message.into(),
        side_effects: SideEffects::Applied,
    }
}

/// A refusal that retrying cannot fix (ownership, capacity, configuration).
pub(crate) fn refused(message: impl Into<String>) -> HypervisorError {
    HypervisorError::permanent(message)
}

/// Adds context to a libvirt error from a call that changed nothing.
pub(crate) fn context(what: &str, error: &VirtError) -> HypervisorError {
    if is_connection_lost(error) {
        maybe_done(format!("{what}: {}", text(error)))
    } else {
        nothing_done(format!("{what}: {}", text(error)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_flattens_and_keeps_both_ends() {
        let qemu = "internal error: qemu unexpectedly closed the monitor:\n\
            2026-12-02T03:00:00.000000Z qemu-system-x86_64: error: failed to set MSR 0x10a to 0x2000c04\n\
            qemu-system-x86_64: ../target/i386/kvm/kvm.c:3042: kvm_buf_set_msrs: Assertion `ret == cpu->kvm_msr_buf->nmsrs' failed.";
        let shown = one_line(qemu, 1000);
        assert!(!shown.contains('\n'), "{shown}");
        assert!(shown.contains("monitor: 2026"), "{shown}");
        let short = one_line(qemu, 120);
        assert!(short.len() <= 120 + " … ".len(), "{short}");
        assert!(
            short.starts_with("internal error: qemu unexpectedly"),
            "{short}"
        );
        assert!(short.ends_with("nmsrs' failed."), "{short}");
        assert_eq!(
            one_line(&"é".repeat(100), 11),
            "éé … éé",
            "cut on characters"
        );
    }

    #[test]
    fn texts_keep_the_message_and_code() {
        virt::error::clear_error_callback();
        let conn = virt::connect::Connect::open(Some("test:///default")).unwrap();
        let missing = conn.lookup_domain_by_name("no-such-domain").unwrap_err();
        assert!(is_missing_domain(&missing));
        assert!(!is_connection_lost(&missing));
        let shown = text(&missing);
        assert!(shown.ends_with("(libvirt error 42)"), "{shown}");
        assert_eq!(
            context("look up domain", &missing).side_effects,
            bigfleet_libvirt_ports::SideEffects::None
        );
    }
}
