//! One libvirt host and everything about reaching it: the supervised connections and their
//! health (`connection`), opening them (`dial`), the dial's refusals as one line with the fix (`credentials`,
//! `tls_peer`), the reconnect backoff (`backoff`), the per-host lanes (`lanes`), libvirt's
//! errors sorted by what they mean for the caller (`error`), what a host can run and what
//! is committed on it (`capacity`), the dedicated CPUs and huge pages one machine holds alone
//! (`claims`), the host's CPU and huge page topology and what a domain binds (`topology`), our domains on it (`domains`), the checks a fresh connection
//! passes (`gate`), the rbd pools started again after a daemon restart (`pools`), and the test driver's node files (`fixture`).

pub(crate) mod backoff;
pub(crate) mod capacity;
pub(crate) mod claims;
pub(crate) mod connection;
pub(crate) mod credentials;
pub(crate) mod dial;
pub(crate) mod domains;
pub(crate) mod error;
pub mod fixture;
pub(crate) mod gate;
pub mod lanes;
pub(crate) mod pools;
pub(crate) mod session;
pub(crate) mod tls_peer;
pub(crate) mod topology;
