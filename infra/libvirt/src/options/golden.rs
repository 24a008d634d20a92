//! `--image-source`: the local golden image file and the volume it becomes, as read at
//! start-up (`storage::golden::read`).

use std::path::PathBuf;

/// The local golden image file and the volume it becomes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GoldenImage {
    /// The local file.
    pub path: PathBuf,
    /// The content-addressed volume name.
    pub volume: String,
    /// `qcow2` or `raw`, from the file's header.
    pub format: String,
    /// The file's length in bytes (what is uploaded).
    pub bytes: u64,
    /// The guest-visible size: the qcow2 header's virtual size, or the raw file's length.
    pub capacity: u64,
    /// The file's sha256, hex.
    pub sha256: String,
}
