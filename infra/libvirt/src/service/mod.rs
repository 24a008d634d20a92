//! The top floor: the `Hypervisor` port over the floors below. The adapter and its shared
//! state, and `connect` (`adapter`); which host a call goes to and which blocking sequence
//! runs there (`hypervisor`); Create and Delete as sequences with rollback (`lifecycle`);
//! Configure's and Drain's host steps for machines that configure at first boot
//! (`first_boot`).

mod adapter;
mod agent_steps;
mod first_boot;
mod hypervisor;
pub(crate) mod lifecycle;

pub use adapter::LibvirtHypervisor;
pub(crate) use adapter::{Inner, SequenceContext};
