//! A wall clock a test can step under a running process: [`SteppedWallClock`].
//!
//! The process runs with libfaketime preloaded (the Debian `faketime` package, which
//! `scripts/install-deps.sh` installs). Only the wall clock (`CLOCK_REALTIME`) is faked
//! (`FAKETIME_DONT_FAKE_MONOTONIC=1`), by an offset the library reads from a file on every
//! clock read (`FAKETIME_TIMESTAMP_FILE`, `FAKETIME_NO_CACHE=1`): writing the file steps the
//! process's wall clock at once, as an NTP step or `date -s` would, while its monotonic clock
//! runs on untouched.
//!
//! Standard library only: `infra/system/src/clock_tests.rs` includes this file by path.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

/// Where distributions put libfaketime; the first that exists is used.
const LIBRARIES: [&str; 4] = [
    "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1",
    "/usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1",
    "/usr/lib/faketime/libfaketime.so.1",
    "/usr/local/lib/faketime/libfaketime.so.1",
];

/// The variable that names the offset file to a child (see [`SteppedWallClock::at`]).
pub const FILE_VARIABLE: &str = "FAKETIME_TIMESTAMP_FILE";

/// One offset file and the library that reads it; the file's directory goes when dropped.
pub struct SteppedWallClock {
    library: PathBuf,
    file: PathBuf,
    owned_dir: Option<PathBuf>,
}

impl SteppedWallClock {
    /// A fresh offset file at `+0` (the real time).
    ///
    /// # Panics
    /// When libfaketime is not installed: the message names the package and the script.
    pub fn new() -> SteppedWallClock {
        static COUNTER: AtomicU32 = AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!(
            "bigfleet-faketime-{}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("create {}: {e}", dir.display()));
        let mut clock = Self::at(&dir.join("offset"));
        clock.owned_dir = Some(dir);
        clock.set_offset_secs(0);
        clock
    }

    /// The offset file `file`, written by another process's [`SteppedWallClock::new`] (a
    /// child stepping its own clock).
    ///
    /// # Panics
    /// When libfaketime is not installed.
    pub fn at(file: &Path) -> SteppedWallClock {
        let library = LIBRARIES
            .iter()
            .map(PathBuf::from)
            .find(|p| p.exists())
            .unwrap_or_else(|| {
                panic!(
                    "libfaketime is not installed (looked for {}): this test steps the wall \
                     clock under a process with it. Install the `faketime` package: run \
                     scripts/install-deps.sh",
                    LIBRARIES.join(", ")
                )
            });
        SteppedWallClock {
            library,
            file: file.to_path_buf(),
            owned_dir: None,
        }
    }

    /// Makes `command` run under this clock (its wall clock at the file's offset).
    pub fn apply(&self, command: &mut Command) {
        command
            .env("LD_PRELOAD", &self.library)
            .env(FILE_VARIABLE, &self.file)
            .env("FAKETIME_NO_CACHE", "1")
            .env("FAKETIME_DONT_FAKE_MONOTONIC", "1")
            // FAKETIME would take precedence over the file.
            .env_remove("FAKETIME");
    }

    /// Sets the wall clock of every process under this clock to the real time plus
    /// `offset` seconds (negative: behind). Offsets are from the real time, not cumulative.
    /// The file is replaced atomically, so the library never reads half an offset.
    pub fn set_offset_secs(&self, offset: i64) {
        let staged = self.file.with_extension("next");
        std::fs::write(&staged, format!("{offset:+}\n"))
            .unwrap_or_else(|e| panic!("write {}: {e}", staged.display()));
        std::fs::rename(&staged, &self.file)
            .unwrap_or_else(|e| panic!("replace {}: {e}", self.file.display()));
    }
}

impl Drop for SteppedWallClock {
    fn drop(&mut self) {
        if let Some(dir) = &self.owned_dir {
            if let Err(e) = std::fs::remove_dir_all(dir) {
                eprintln!("could not remove {}: {e}", dir.display());
            }
        }
    }
}
