//! Fencing tokens and high-water marks (docs/contract.md §3).
//!
//! One mark is kept per (shard_id, machine_id). A token passes only if it is strictly newer
//! than the mark, comparing (epoch, sequence) lexicographically as signed integers; an equal
//! token is stale. The all-zero token (empty shard, epoch 0, sequence 0) bypasses fencing.

use serde::{Deserialize, Serialize};

/// The fencing token a mutating request carries.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FenceToken {
    /// The shard's id; empty only for unfenced calls.
    pub shard_id: String,
    /// The shard's persisted epoch, bumped on every shard restart.
    pub epoch: i64,
    /// The shard's per-process sequence, re-stamped on every call attempt.
    pub sequence: i64,
}

impl FenceToken {
    /// Whether this is the all-zero token that skips fencing entirely.
    #[must_use]
    pub fn is_unfenced(&self) -> bool {
        self.shard_id.is_empty() && self.epoch == 0 && self.sequence == 0
    }

    /// The (epoch, sequence) pair this token would record as a mark.
    #[must_use]
    pub fn mark(&self) -> FenceMark {
        FenceMark {
            epoch: self.epoch,
            sequence: self.sequence,
        }
    }
}

/// The highest (epoch, sequence) accepted for one (shard, machine) pair. The derived order
/// is the lexicographic signed order the contract requires (field order matters).
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
pub struct FenceMark {
    /// Shard epoch.
    pub epoch: i64,
    /// Sequence within the epoch.
    pub sequence: i64,
}

/// The scope of one mark: a shard and a machine id (which need not exist).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct FenceKey {
    /// The shard id (possibly empty for a non-zero token without a shard).
    pub shard_id: String,
    /// The machine id exactly as sent.
    pub machine_id: String,
}
