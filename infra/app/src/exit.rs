//! What serving hands back to `main` for the exit. Freeing a large inventory (the records,
//! their List encodings, the indexes, the fake's slots) one allocation at a time took most
//! of the time from SIGTERM to exit, and the process is about to give all of its memory
//! back anyway: so once the runtime has stopped and joined its threads, the state file is
//! closed cleanly and those structures are left for the exit to reclaim.
//!
//! A caller that never calls [`Exit::finish`] (the benchmarks) frees everything when the
//! `Exit` is dropped, as before.

use std::sync::Mutex;

use bigfleet_libvirt_redb::RedbStateStore;

/// Structures kept alive past serving, and the state file to close before leaving them.
#[derive(Default)]
pub struct Exit {
    store: Mutex<Option<RedbStateStore>>,
    keep: Mutex<Vec<Box<dyn Send>>>,
}

impl Exit {
    /// Keeps `value` alive until [`Exit::finish`], which never frees it.
    pub(crate) fn keep(&self, value: impl Send + 'static) {
        let mut keep = self.keep.lock().unwrap_or_else(|e| e.into_inner());
        keep.push(Box::new(value));
    }

    /// Closes `store` in [`Exit::finish`], before whatever holds it is left unfreed.
    pub(crate) fn close_at_exit(&self, store: &RedbStateStore) {
        let mut slot = self.store.lock().unwrap_or_else(|e| e.into_inner());
        *slot = Some(store.clone());
    }

    /// Call once the runtime has shut down and joined its threads: writes what is queued
    /// and closes the state file, then lets the kept structures go without freeing them.
    pub fn finish(self) {
        let store = self.store.into_inner().unwrap_or_else(|e| e.into_inner());
        if let Some(store) = store {
            store.close();
        }
        std::mem::forget(self.keep);
    }
}
