//! The storage a domain stands on: its overlay and seed volumes (`volumes`), and the
//! content-addressed golden image `--image-source` uploads to every host (`golden`).

pub mod golden;
pub(crate) mod volumes;
