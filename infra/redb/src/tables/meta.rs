//! `meta`: small named integers.
//!
//! Key: `&str` name. Value: `i64`. Records are updatable, never deleted.
//! - `schema_version`: the layout version of every table. This build writes 2 (protobuf
//!   machine records) and migrates 1 (JSON machine records) to it on open.
//! - `revision`: the List revision counter.
//! - `next_operation`: the last operation-id counter value used.

use redb::TableDefinition;

/// The table.
pub const TABLE: TableDefinition<&str, i64> = TableDefinition::new("meta");

/// The schema version this build writes.
pub const SCHEMA_VERSION: i64 = 2;

/// The older schema this build migrates on open: the same tables, machine records as JSON.
pub const MIGRATES_FROM: i64 = 1;

/// Key of the schema version.
pub const SCHEMA_VERSION_KEY: &str = "schema_version";
/// Key of the revision counter.
pub const REVISION_KEY: &str = "revision";
/// Key of the operation-id counter.
pub const NEXT_OPERATION_KEY: &str = "next_operation";
