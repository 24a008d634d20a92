//! Where the state file lives, for error messages an operator can act on: the filesystem
//! (mount point and type) holding it, whether that is mounted read-only, and how much room
//! is left on it.

use std::path::{Path, PathBuf};

/// "filesystem /var/lib/bigfleet (ext4) has 0 B free of 1.0 GiB", or as much of it as can
/// be found out.
pub fn describe(path: &Path) -> String {
    let directory = existing_directory(path);
    let mount = mount_of(&directory);
    let name = match &mount {
        Some((point, kind, read_only)) => {
            let ro = if *read_only {
                ", mounted read-only"
            } else {
                ""
            };
            format!("filesystem {} ({kind}{ro})", point.display())
        }
        None => format!("the filesystem holding {}", directory.display()),
    };
    match rustix::fs::statvfs(&directory) {
        Ok(stat) => {
            let free = stat.f_bavail.saturating_mul(stat.f_frsize);
            let size = stat.f_blocks.saturating_mul(stat.f_frsize);
            format!("{name} has {} free of {}", bytes(free), bytes(size))
        }
        Err(e) => format!("{name} (free space unknown: {e})"),
    }
}

/// The nearest directory of `path` that exists (the file itself may not yet).
fn existing_directory(path: &Path) -> PathBuf {
    let absolute = std::path::absolute(path).unwrap_or_else(|_| path.to_owned());
    let mut directory = absolute.parent().map(Path::to_owned).unwrap_or(absolute);
    loop {
        if let Ok(canonical) = directory.canonicalize() {
            return canonical;
        }
        match directory.parent() {
            Some(parent) => directory = parent.to_owned(),
            None => return directory,
        }
    }
}

/// The mount point, filesystem type and read-only flag of the mount holding `directory`.
fn mount_of(directory: &Path) -> Option<(PathBuf, String, bool)> {
    let mounts = procfs::process::Process::myself().ok()?.mountinfo().ok()?;
    // The longest mount point containing the directory; of equal ones the last mounted,
    // which hides the others.
    let mut best: Option<&procfs::process::MountInfo> = None;
    for mount in &mounts.0 {
        if directory.starts_with(&mount.mount_point)
            && best.is_none_or(|b| {
                mount.mount_point.as_os_str().len() >= b.mount_point.as_os_str().len()
            })
        {
            best = Some(mount);
        }
    }
    let mount = best?;
    let read_only = mount.mount_options.contains_key("ro");
    Some((mount.mount_point.clone(), mount.fs_type.clone(), read_only))
}

/// A byte count in the largest binary unit that keeps it at least 1.
fn bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    #[allow(clippy::cast_precision_loss)] // a message, not arithmetic
    let mut value = n as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1} {}", UNITS[unit])
}

#[cfg(test)]
mod tests {
    use super::{bytes, describe};

    #[test]
    fn byte_counts_read_as_an_operator_expects() {
        assert_eq!(bytes(0), "0 B");
        assert_eq!(bytes(1023), "1023 B");
        assert_eq!(bytes(1536), "1.5 KiB");
        assert_eq!(bytes(4 * 1024 * 1024), "4.0 MiB");
    }

    #[test]
    fn a_description_names_the_mount_point_and_the_free_space() {
        let dir = tempfile::tempdir().expect("temp dir");
        let text = describe(&dir.path().join("not-yet/state.redb"));
        assert!(text.starts_with("filesystem /"), "{text}");
        assert!(text.contains(" free of "), "{text}");
    }
}
