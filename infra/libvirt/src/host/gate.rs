//! The checks a fresh connection passes before it is installed: the provider's inactive rbd
//! pools started (`host::pools`), and, with `--image-source`, that
//! the golden image is on the host (`storage::golden` does the checking and the upload). The
//! host only runs it on every (re)dial and acts on its outcome: a refused host gets no
//! session, so its slots stay withheld, and the check runs again on the next dial.

use std::sync::Arc;

use virt::connect::Connect;

/// What a fresh connection goes through before it is installed.
#[derive(Clone, Default)]
pub(crate) struct Checks {
    /// The storage pools the provider uses (`--storage-pool`, `--seed-pool`): an inactive
    /// rbd pool among them is started (`host::pools`).
    pub(crate) pools: Vec<String>,
    /// `--image-source`, when set.
    pub(crate) golden: Option<Arc<dyn Gate>>,
}

/// A check run on every fresh connection, on the blocking thread that dialled it.
pub(crate) trait Gate: Send + Sync {
    /// Checks (and, where it can, mends) the host behind `conn`.
    ///
    /// # Errors
    /// Why the host cannot serve until the next dial.
    fn check(&self, conn: &Connect, test_driver: bool, zone: &str) -> Result<Ensured, Refusal>;
}

/// What a passed [`Gate`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Ensured {
    /// A matching volume was there already; nothing was written.
    Present,
    /// The volume was created and the file uploaded.
    Uploaded,
}

/// Why a host's golden image is not in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// A volume of that name exists and does not match the file.
    Mismatch(String),
    /// Creating or uploading failed.
    Failed(String),
}

impl Refusal {
    /// The metric state.
    pub(crate) fn state(&self) -> &'static str {
        match self {
            Refusal::Mismatch(_) => "mismatch",
            Refusal::Failed(_) => "failed",
        }
    }

    /// The reason, for the log and the host's last error.
    pub(crate) fn reason(&self) -> &str {
        match self {
            Refusal::Mismatch(r) | Refusal::Failed(r) => r,
        }
    }
}
