//! The storage a domain stands on: its root, data and seed volumes (`volumes`), and the
//! content-addressed golden image `--image-source` puts on every host's local pool
//! (`golden`), or once per Ceph cluster into an rbd pool (`golden_rbd`); and whether a
//! volume holds what was streamed into it (`readback`); and the end of a guest's serial console
//! log (`console`).

pub(crate) mod console;
pub mod golden;
pub(crate) mod golden_rbd;
pub(crate) mod readback;
pub(crate) mod volumes;
