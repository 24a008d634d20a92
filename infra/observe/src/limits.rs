//! The HTTP side server's per-client bounds, as plain values: the composition root reads
//! them from the flags whether or not it links the server itself (`side_server`).

use std::time::Duration;

/// The side server's per-client bounds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HttpLimits {
    /// Connections open at once.
    pub max_connections: usize,
    /// How long a request head may take to arrive.
    pub header_read_timeout: Duration,
    /// How long a connection may move no byte.
    pub idle_timeout: Duration,
}
