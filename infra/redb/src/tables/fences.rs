//! `fences`: fence marks per (shard, machine).
//!
//! Key: `(&str shard_id, &str machine_id)`, the machine id exactly as the request sent it
//! (marks exist for ids that are not machines). Value: `(i64 epoch, i64 sequence)`.
//! Records are updatable (a mark only ever moves up) and never deleted.

use redb::TableDefinition;

/// The table.
pub const TABLE: TableDefinition<(&str, &str), (i64, i64)> = TableDefinition::new("fences");
