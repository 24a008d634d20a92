//! The one way a test may stop early without failing: [`needs`].
//!
//! A test that cannot run on this machine (it needs root to mount a tmpfs or to `chroot`, or
//! tools that could not be installed) fails, saying what it needs, unless the skip variable of
//! its group is set to `1`; only then does it print `SKIPPED (<variable>=1): <reason>` and
//! return. A skipped test therefore always says so, and one that was never asked to skip either
//! ran or failed. CI (`.ci/run`, through `scripts/test.sh`) sets no skip variable, so every test
//! runs there; `tidy/skips.rs` fails on any other early return from a test and on a CI script
//! that names a skip variable.
//!
//! The variables:
//!
//! | Variable | Skips |
//! |---|---|
//! | `BIGFLEET_SKIP_ROOT_TESTS=1` | the tests that need root: `disk_full` and the redb store's full-tmpfs test (tmpfs mounts), `image` (`chroot`), `host_hang` (private libvirtd daemons run as `nobody`) |
//! | `BIGFLEET_SKIP_DEPLOY_TOOLS=1` | the tests that need helm, kubernetes-validate and hadolint (`scripts/install-tools.sh`) |
//!
//! Standard library only: `infra/redb/src/tests.rs` includes this file by path.

/// Skips the tests that need root (tmpfs mounts, `chroot`).
pub const ROOT: &str = "BIGFLEET_SKIP_ROOT_TESTS";
/// Skips the tests that need the deploy tools (`scripts/install-tools.sh`).
pub const DEPLOY_TOOLS: &str = "BIGFLEET_SKIP_DEPLOY_TOOLS";
/// Every skip variable, for the tidy check that CI sets none of them.
pub const ALL: [&str; 2] = [ROOT, DEPLOY_TOOLS];

/// What a test needs, or the reason this machine cannot give it. `Some(value)` when it is
/// there. Otherwise the test fails with `reason`, unless `variable` is `1`: then this prints
/// why the test is skipped and returns `None`, and the test returns at once:
///
/// ```ignore
/// let Some(tmpfs) = skip::needs(skip::ROOT, Tmpfs::mount("3m")) else { return };
/// ```
pub fn needs<T>(variable: &str, needed: Result<T, String>) -> Option<T> {
    let reason = match needed {
        Ok(value) => return Some(value),
        Err(reason) => reason,
    };
    if std::env::var(variable).as_deref() == Ok("1") {
        eprintln!("SKIPPED ({variable}=1): {reason}");
        None
    } else {
        panic!("{reason}\nthis test cannot run here: set {variable}=1 to skip it");
    }
}
