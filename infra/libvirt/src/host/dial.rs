//! Opening connections to a host: how many a URI gets (`connections_for`), one dial with
//! libvirt's client keepalive off (`dial`), and libvirt's event loop, which every remote
//! connection needs (`ensure_event_loop`). The supervised connection (`connection`) uses
//! them; `doctor` too.

use std::sync::OnceLock;

use tracing::warn;
use virt::connect::Connect;

use crate::host::capacity::Node;
use crate::host::error::{is_unsupported, text};

/// The connections a host at `uri` gets: `configured`, but one on libvirt's `test` driver,
/// which keeps a separate in-memory host per connection (two connections would be two
/// hosts), in this process (`test:///…`) or behind a daemon (`test+unix://…`).
pub(crate) fn connections_for(uri: &str, configured: usize) -> usize {
    let scheme = uri.split("://").next().unwrap_or_default();
    if scheme == "test" || scheme.starts_with("test+") {
        1
    } else {
        configured.max(1)
    }
}

/// Opens the connection, turns libvirt's client keepalive off (see the module docs: its
/// close is not ordered after the calls in flight) and reads the node info.
pub(crate) fn dial(uri: &str, zone: &str) -> Result<(Connect, bool, Node), String> {
    let conn =
        Connect::open(Some(uri)).map_err(|e| crate::host::credentials::connect_failure(uri, &e))?;
    // An interval of -1 disables keepalive; libvirt still answers the daemon's own pings.
    if let Err(e) = conn.set_keep_alive(-1, 0) {
        if !is_unsupported(&e) {
            warn!(zone, error = %text(&e), "libvirt keepalive could not be turned off");
        }
    }
    let test_driver = conn
        .driver_type()
        .is_ok_and(|t| t.eq_ignore_ascii_case("test"));
    let info = conn
        .node_info()
        .map_err(|e| format!("read node info: {}", text(&e)))?;
    let node = Node {
        cpus: info.cpus,
        memory_kib: info.memory,
    };
    Ok((conn, test_driver, node))
}

/// Registers libvirt's default event loop once per process and runs it on a dedicated
/// thread: remote connections need it to notice a dead peer, to answer the daemon's
/// keepalive pings between calls, and for large answers over libssh.
pub(crate) fn ensure_event_loop() {
    static STARTED: OnceLock<()> = OnceLock::new();
    STARTED.get_or_init(|| {
        virt::error::clear_error_callback();
        if let Err(e) = virt::event::event_register_default_impl() {
            warn!(error = %text(&e), "libvirt event loop unavailable");
            return;
        }
        let spawned = std::thread::Builder::new()
            .name("libvirt-events".to_owned())
            .spawn(|| {
                while virt::event::event_run_default_impl().is_ok() {}
                warn!("libvirt event loop stopped");
            });
        if let Err(e) = spawned {
            warn!(error = %e, "cannot start the libvirt event loop thread");
        }
    });
}
