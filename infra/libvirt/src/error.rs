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
