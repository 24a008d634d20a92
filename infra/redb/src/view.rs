//! A private, writable view of a state file, for reading one that was not closed cleanly.
//!
//! redb reads such a file only after its repair, and the repair writes (it commits the
//! recovered roots and the rebuilt allocator state). Here the file is opened read-only and
//! every write lands in memory instead: redb repairs the view, the caller reads it, and the
//! file stays byte for byte as it was. Only the pages the repair writes are held (a few per
//! region of the file), not a copy of the file.
//!
//! Locks: redb's writer asks for exclusive locks, which a read-only file cannot take; the
//! view takes them shared instead. That is what a reader holds: it keeps a provider from
//! opening the file meanwhile (and is refused while one has it), as `state inspect` is.

use std::collections::BTreeMap;
use std::io;
use std::ops::Bound;
use std::path::Path;
use std::sync::{Mutex, MutexGuard};

use redb::backends::FileBackend;
use redb::{BackendError, Database, DatabaseError, StorageBackend};

/// The unit in which written bytes are held.
const BLOCK: u64 = 4096;

/// The file, read-only, under the writes made to the view.
#[derive(Debug)]
pub struct PrivateView {
    file: FileBackend,
    written: Mutex<Written>,
}

#[derive(Debug)]
struct Written {
    /// Blocks written to the view, whole, by index.
    blocks: BTreeMap<u64, Vec<u8>>,
    /// The view's length.
    len: u64,
    /// Below this offset, bytes not written are the file's; from it on, they are zero (the
    /// view was shortened there, and bytes past a length read as zero once it grows again).
    file_part: u64,
}

/// Opens the file at `path` as a private view and lets redb repair it there, with the same
/// integrity check and cache size as the provider's own open.
pub fn open_repaired(path: &Path, cache_bytes: usize) -> Result<Database, DatabaseError> {
    let file = std::fs::File::open(path)?;
    let len = file.metadata()?.len();
    let view = PrivateView {
        file: FileBackend::new(file)?,
        written: Mutex::new(Written {
            blocks: BTreeMap::new(),
            len,
            file_part: len,
        }),
    };
    let mut builder = Database::builder();
    builder.set_check_integrity_on_open(true);
    builder.set_cache_size(cache_bytes);
    builder.create_with_backend(view)
}

impl PrivateView {
    fn written(&self) -> MutexGuard<'_, Written> {
        // Every update below leaves `Written` consistent before anything can panic.
        self.written
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The block at `index` as it is before any write to it: the file's bytes below
    /// `file_part`, zeros from there on.
    fn unwritten_block(&self, file_part: u64, index: u64) -> io::Result<Vec<u8>> {
        let mut block = vec![0; BLOCK as usize];
        let start = index * BLOCK;
        let from_file = file_part.saturating_sub(start).min(BLOCK);
        if from_file > 0 {
            self.file.read(start, &mut block[..from_file as usize])?;
        }
        Ok(block)
    }
}

fn out_of_range(offset: u64, len: usize, view: u64) -> io::Error {
    io::Error::new(
        io::ErrorKind::UnexpectedEof,
        format!("read of {len} bytes at {offset} past the end of the view ({view} bytes)"),
    )
}

impl StorageBackend for PrivateView {
    fn len(&self) -> io::Result<u64> {
        Ok(self.written().len)
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> io::Result<()> {
        let written = self.written();
        let end = offset + out.len() as u64;
        if end > written.len {
            return Err(out_of_range(offset, out.len(), written.len));
        }
        let mut at = offset;
        while at < end {
            let index = at / BLOCK;
            let within = (at % BLOCK) as usize;
            let take = ((BLOCK - at % BLOCK).min(end - at)) as usize;
            let into = &mut out[(at - offset) as usize..][..take];
            match written.blocks.get(&index) {
                Some(block) => into.copy_from_slice(&block[within..within + take]),
                None if at + take as u64 <= written.file_part => self.file.read(at, into)?,
                None => {
                    let block = self.unwritten_block(written.file_part, index)?;
                    into.copy_from_slice(&block[within..within + take]);
                }
            }
            at += take as u64;
        }
        Ok(())
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        let mut written = self.written();
        if len < written.len {
            written.blocks.retain(|index, _| index * BLOCK < len);
            let (last, cut) = (len / BLOCK, (len % BLOCK) as usize);
            if let Some(block) = written.blocks.get_mut(&last) {
                block[cut..].fill(0);
            }
            written.file_part = written.file_part.min(len);
        }
        written.len = len;
        Ok(())
    }

    fn sync_data(&self) -> io::Result<()> {
        Ok(())
    }

    fn write(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        let mut written = self.written();
        let end = offset + data.len() as u64;
        let mut at = offset;
        while at < end {
            let index = at / BLOCK;
            let within = (at % BLOCK) as usize;
            let take = ((BLOCK - at % BLOCK).min(end - at)) as usize;
            let mut block = match written.blocks.remove(&index) {
                Some(block) => block,
                None => self.unwritten_block(written.file_part, index)?,
            };
            block[within..within + take].copy_from_slice(&data[(at - offset) as usize..][..take]);
            written.blocks.insert(index, block);
            at += take as u64;
        }
        written.len = written.len.max(end);
        Ok(())
    }

    fn close(&self) -> io::Result<()> {
        self.file.close()
    }

    fn try_lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<bool, BackendError> {
        self.file.try_lock_shared_range(start, end)
    }

    fn try_lock_shared_range(
        &self,
        start: Bound<u64>,
        end: Bound<u64>,
    ) -> Result<bool, BackendError> {
        self.file.try_lock_shared_range(start, end)
    }

    fn lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.file.lock_shared_range(start, end)
    }

    fn lock_shared_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.file.lock_shared_range(start, end)
    }

    fn unlock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.file.unlock_range(start, end)
    }

    fn query_lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<bool, BackendError> {
        self.file.query_lock_range(start, end)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A view over a file of `len` bytes `0, 1, 2, ...` (mod 251).
    fn view(len: usize) -> (tempfile::NamedTempFile, PrivateView, Vec<u8>) {
        let file = tempfile::NamedTempFile::new().unwrap();
        let bytes: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
        std::fs::write(file.path(), &bytes).unwrap();
        let view = PrivateView {
            file: FileBackend::new(std::fs::File::open(file.path()).unwrap()).unwrap(),
            written: Mutex::new(Written {
                blocks: BTreeMap::new(),
                len: len as u64,
                file_part: len as u64,
            }),
        };
        (file, view, bytes)
    }

    fn read(view: &PrivateView, offset: u64, len: usize) -> Vec<u8> {
        let mut out = vec![0xAA; len];
        view.read(offset, &mut out).unwrap();
        out
    }

    #[test]
    fn writes_are_read_back_and_never_reach_the_file() {
        let (file, view, mut model) = view(3 * BLOCK as usize + 100);
        let original = model.clone();
        // Within a block, across a boundary, and past the end (the view grows).
        for (offset, len, value) in [(10, 20, 1u8), (4090, 20, 2), (3 * 4096 + 90, 30, 3)] {
            view.write(offset, &vec![value; len]).unwrap();
            let end = offset as usize + len;
            model.resize(model.len().max(end), 0);
            model[offset as usize..end].fill(value);
        }
        assert_eq!(view.len().unwrap(), model.len() as u64);
        assert_eq!(read(&view, 0, model.len()), model);
        assert_eq!(read(&view, 4000, 200), model[4000..4200]);
        assert!(view.read(0, &mut vec![0; model.len() + 1]).is_err());
        assert_eq!(std::fs::read(file.path()).unwrap(), original);
    }

    #[test]
    fn shortening_then_growing_reads_zeros_past_the_cut() {
        let (file, view, original) = view(3 * BLOCK as usize);
        view.write(4100, &[7; 50]).unwrap();
        view.set_len(4120).unwrap();
        view.set_len(3 * BLOCK).unwrap();
        let mut model = original.clone();
        model[4100..4120].fill(7);
        model[4120..].fill(0);
        assert_eq!(read(&view, 0, model.len()), model);
        view.set_len(100).unwrap();
        view.set_len(200).unwrap();
        let mut model = original[..100].to_vec();
        model.resize(200, 0);
        assert_eq!(read(&view, 0, 200), model);
        assert_eq!(std::fs::read(file.path()).unwrap(), original);
    }

    #[test]
    fn a_view_and_a_writer_exclude_each_other_and_the_file_is_not_written() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db.redb");
        drop(Database::create(&path).unwrap());
        let writer = Database::open(&path).unwrap();
        let refused = open_repaired(&path, 1 << 20).map(|_| ());
        assert!(
            matches!(refused, Err(DatabaseError::DatabaseAlreadyOpen)),
            "{refused:?}"
        );
        drop(writer);
        let before = std::fs::read(&path).unwrap();
        let view = open_repaired(&path, 1 << 20).unwrap();
        let refused = Database::open(&path).map(|_| ());
        assert!(
            matches!(refused, Err(DatabaseError::DatabaseAlreadyOpen)),
            "{refused:?}"
        );
        drop(view);
        assert_eq!(
            std::fs::read(&path).unwrap(),
            before,
            "the view wrote the file"
        );
        drop(Database::open(&path).expect("the view released its locks"));
    }
}
