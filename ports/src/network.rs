//! The `Network` port: binding the listeners the provider serves on. The real adapter binds
//! TCP sockets; a simulator binds simulated ones. Binding happens in the composition root,
//! never inside an adapter's constructor.

use std::future::Future;
use std::io;
use std::net::SocketAddr;

/// Binds listening sockets.
///
/// Contract: `bind` MUST either return a listener already accepting on `addr` (with the
/// actual port when `addr` asks for port 0) or an error naming why it could not bind; it
/// MUST NOT retry silently.
pub trait Network: Send + Sync + 'static {
    /// A bound listener.
    type Listener: Send + 'static;

    /// Binds `addr`.
    fn bind(&self, addr: SocketAddr) -> impl Future<Output = io::Result<Self::Listener>> + Send;

    /// The address a listener is actually bound to.
    ///
    /// # Errors
    /// When the socket cannot report its address.
    fn local_addr(listener: &Self::Listener) -> io::Result<SocketAddr>;
}
