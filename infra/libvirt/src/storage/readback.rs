//! Whether a volume holds what was streamed into it.
//!
//! libvirt can report an upload finished when the host's last write into the volume failed:
//! its file-stream worker records the error, and closing the stream then overwrites the
//! result with that of `close(2)`. On libvirt 9.0 an upload that fits in one stream packet
//! onto a full pool always "succeeds" that way. So the golden image's upload (into a thin
//! volume, whose writes allocate) is checked after `finish`:
//! the volume's allocation (what the host's file system holds for it) is asked first, and
//! only when it is short of the bytes sent — a lost write, or a file system that compresses
//! or deduplicates — is the volume read back and hashed.

use sha2::{Digest, Sha256};
use virt::connect::Connect;
use virt::storage_vol::StorageVol;
use virt::stream::Stream;

use crate::host::error::text;

/// Read-back chunk size.
const CHUNK: usize = 1 << 20;

/// Lower-case hex.
pub(crate) fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    bytes.iter().fold(String::new(), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

/// What a check of a volume's content found.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Content {
    /// The host holds at least the bytes sent (trusted without reading them back).
    Allocated,
    /// Short of them on disk, but the first `len` bytes read back hash to `sha256`.
    ReadBack,
    /// The volume holds `allocation` bytes and its content differs.
    Differs {
        /// What the host's file system holds for the volume.
        allocation: u64,
    },
}

/// Checks that `volume` holds `len` bytes whose sha256 is `sha256()` (asked only when the
/// volume has to be read back).
///
/// # Errors
/// When libvirt cannot say the volume's allocation or read it back.
pub(crate) fn content(
    conn: &Connect,
    volume: &StorageVol,
    len: u64,
    sha256: impl FnOnce() -> String,
) -> Result<Content, String> {
    let info = volume
        .info()
        .map_err(|e| format!("read volume info: {}", text(&e)))?;
    if info.allocation >= len {
        return Ok(Content::Allocated);
    }
    if downloaded_sha256(conn, volume, len)? == sha256() {
        return Ok(Content::ReadBack);
    }
    Ok(Content::Differs {
        allocation: info.allocation,
    })
}

/// The sha256 (hex) of the volume's first `bytes` bytes, read over a libvirt stream.
fn downloaded_sha256(conn: &Connect, volume: &StorageVol, bytes: u64) -> Result<String, String> {
    let mut hasher = Sha256::new();
    download(conn, volume, (0, bytes), CHUNK, |chunk| {
        hasher.update(chunk);
        true
    })?;
    Ok(hex(&hasher.finalize()))
}

/// Streams `length` bytes of `volume` from `offset` (`span`) in chunks of up to `chunk`
/// bytes, handing each to `take`, which returns `false` to stop early (the stream is then
/// aborted, which is not an error).
///
/// # Errors
/// The libvirt call that failed, in its words; the stream is aborted.
pub(crate) fn download(
    conn: &Connect,
    volume: &StorageVol,
    (offset, length): (u64, u64),
    chunk: usize,
    mut take: impl FnMut(&[u8]) -> bool,
) -> Result<(), String> {
    let stream = Stream::new(conn, 0).map_err(|e| format!("open download stream: {}", text(&e)))?;
    if let Err(e) = volume.download(&stream, offset, length, 0) {
        let _ = stream.abort();
        return Err(format!("start download: {}", text(&e)));
    }
    let mut buffer = vec![0u8; chunk];
    loop {
        match stream.recv(&mut buffer) {
            Ok(0) => break,
            Ok(n) if n > 0 => {
                if !take(&buffer[..n.unsigned_abs()]) {
                    let _ = stream.abort();
                    return Ok(());
                }
            }
            Ok(_) => {
                let _ = stream.abort();
                return Err("the download stream returned no data".to_owned());
            }
            Err(e) => {
                let _ = stream.abort();
                return Err(format!("download: {}", text(&e)));
            }
        }
    }
    stream
        .finish()
        .map_err(|e| format!("finish download: {}", text(&e)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_is_lower_case_two_digits_a_byte() {
        assert_eq!(hex(&[0x00, 0xab, 0x0f]), "00ab0f");
        assert_eq!(hex(&[]), "");
    }
}
