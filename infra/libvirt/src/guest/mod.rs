//! The guest, reached through its qemu guest agent: the protocol (`agent`), bootstrap and
//! drain over it (`bootstrap`), the check that the agent allows what they run (`probe`),
//! and the guest's addresses for Configure's log line and the machine's timeline
//! (`addresses`).

pub(crate) mod addresses;
pub(crate) mod agent;
pub(crate) mod bootstrap;
pub(crate) mod probe;
