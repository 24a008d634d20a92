//! One open connection to a host ([`Session`]), and what is read once per connection and
//! cached on it: the base image's facts ([`BaseImage`]), which `storage::volumes` reads.

use std::sync::Mutex;

use virt::connect::Connect;

/// One open connection. Replaced wholesale on reconnect; calls in flight keep the old one
/// alive until they return.
pub(crate) struct Session {
    pub(crate) conn: Connect,
    pub(crate) generation: u64,
    /// libvirt's `test` driver: in memory, cannot upload volume contents.
    pub(crate) test_driver: bool,
    /// The base image facts, read once per connection.
    pub(crate) base: Mutex<Option<BaseImage>>,
}

/// What the adapter needs to know about `--image`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BaseImage {
    /// The base volume's path on the host.
    pub path: String,
    /// Its virtual size in bytes.
    pub capacity: u64,
    /// Its format, read from the volume XML (`qcow2` when unreadable).
    pub format: String,
    /// The cluster of `--storage-pool` when it is an rbd pool (roots are clones of the
    /// base there); `None` on a local pool.
    pub rbd: Option<crate::render::rbd::RbdSource>,
}
