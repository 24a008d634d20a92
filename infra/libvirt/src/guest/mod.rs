//! The guest, reached through its qemu guest agent: the protocol (`agent`), bootstrap and
//! drain over it (`bootstrap`), and the guest's addresses for Configure's log line
//! (`addresses`).

pub(crate) mod addresses;
pub(crate) mod agent;
pub(crate) mod bootstrap;
