//! What each host really runs against what the provider's records say: the full scan at
//! each describe (`describe`), orphan bookkeeping (`orphans`), the machines the adapter tracks
//! (`tracked`), and the 2-second drift watch between describes (`watch`) with its timeline
//! events (`timeline`).

pub(crate) mod describe;
pub(crate) mod orphans;
pub(crate) mod timeline;
pub(crate) mod tracked;
pub(crate) mod watch;
