//! `bigfleet-libvirt state inspect`: what a state file holds, as JSON for tools and as a
//! table for a person in the middle of an incident, without starting the provider.
//!
//! The report is built from what [`bigfleet_libvirt_redb::inspect`] read, and the machines are the
//! stored records as they are (the same fields Get and List serve). Secrets are never
//! persisted, so none can be shown. Text from the file (ids, errors, metadata) is escaped
//! in the table so a control character cannot rewrite the operator's terminal.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use bigfleet_libvirt_domain::{Machine, MachineState};
use serde::Serialize;

use bigfleet_libvirt_redb::Inspected;

/// The report, in the shape `--output json` prints.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    /// The state file, as given.
    pub file: String,
    /// The schema version of every table.
    pub schema_version: i64,
    /// False when the provider was stopped without closing the file (what is shown was
    /// read through redb's repair done in memory; the file itself was not changed).
    pub closed_cleanly: bool,
    /// The List revision counter.
    pub revision: i64,
    /// The last operation-id counter value used.
    pub next_operation: u64,
    /// How many stored machines are in each state (only states that occur).
    pub machines_by_state: BTreeMap<&'static str, usize>,
    /// Every stored machine record (each configured slot, once the provider has run), in
    /// id order.
    pub machines: Vec<Machine>,
    /// The highest fencing token accepted per (shard, machine).
    pub fence_marks: Vec<FenceEntry>,
    /// The operation id of each machine's latest call of each kind.
    pub operations: Vec<OperationEntry>,
}

/// One fence mark.
#[derive(Clone, Debug, Serialize)]
pub struct FenceEntry {
    /// The shard.
    pub shard_id: String,
    /// The machine.
    pub machine_id: String,
    /// The highest epoch accepted.
    pub epoch: i64,
    /// The highest sequence accepted within that epoch.
    pub sequence: i64,
}

/// One operation id.
#[derive(Clone, Debug, Serialize)]
pub struct OperationEntry {
    /// The machine.
    pub machine_id: String,
    /// `create`, `configure`, `drain` or `delete`.
    pub kind: &'static str,
    /// The id answered to that call.
    pub operation_id: String,
}

/// Why no report could be made.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    /// `--machine` names no stored machine.
    #[error(
        "--machine: no machine {id} in {file} ({stored} machines stored); run state inspect \
         without --machine to list them"
    )]
    UnknownMachine {
        /// The id asked for, escaped.
        id: String,
        /// The state file.
        file: String,
        /// How many machines it stores.
        stored: usize,
    },
}

/// Builds the report of `inspected` (read from `file`), for one machine when `machine` is
/// set.
///
/// # Errors
/// [`ReportError::UnknownMachine`] when `machine` is not stored.
pub fn report(
    file: &str,
    inspected: Inspected,
    machine: Option<&str>,
) -> Result<Report, ReportError> {
    let snapshot = inspected.snapshot;
    let mut machines = snapshot.machines;
    machines.sort_by(|a, b| a.id.cmp(&b.id));
    let mut fence_marks: Vec<FenceEntry> = snapshot
        .fences
        .into_iter()
        .map(|(key, mark)| FenceEntry {
            shard_id: key.shard_id,
            machine_id: key.machine_id,
            epoch: mark.epoch,
            sequence: mark.sequence,
        })
        .collect();
    fence_marks.sort_by(|a, b| (&a.machine_id, &a.shard_id).cmp(&(&b.machine_id, &b.shard_id)));
    let mut operations: Vec<OperationEntry> = snapshot
        .operations
        .into_iter()
        .map(|(id, kind, op)| OperationEntry {
            machine_id: id.to_string(),
            kind: kind.name(),
            operation_id: op.as_str().to_owned(),
        })
        .collect();
    operations.sort_by(|a, b| (&a.machine_id, a.kind).cmp(&(&b.machine_id, b.kind)));
    if let Some(wanted) = machine {
        if !machines.iter().any(|m| m.id.as_str() == wanted) {
            return Err(ReportError::UnknownMachine {
                id: format!(
                    "\"{}\"",
                    bigfleet_libvirt_domain::authorization::escaped(wanted)
                ),
                file: file.to_owned(),
                stored: machines.len(),
            });
        }
        machines.retain(|m| m.id.as_str() == wanted);
        fence_marks.retain(|f| f.machine_id == wanted);
        operations.retain(|o| o.machine_id == wanted);
    }
    let mut machines_by_state = BTreeMap::new();
    for m in &machines {
        *machines_by_state.entry(m.state.name()).or_insert(0) += 1;
    }
    Ok(Report {
        file: file.to_owned(),
        schema_version: inspected.schema_version,
        closed_cleanly: inspected.closed_cleanly,
        revision: snapshot.revision,
        next_operation: snapshot.next_operation,
        machines_by_state,
        machines,
        fence_marks,
        operations,
    })
}

/// Control characters and the like escaped; `-` for an empty value.
fn shown(text: &str) -> String {
    if text.is_empty() {
        return "-".to_owned();
    }
    text.chars().flat_map(char::escape_debug).collect()
}

/// `rows` as left-aligned columns under `header`, two spaces apart.
fn columns(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let all = std::iter::once(header.iter().map(|h| (*h).to_owned()).collect::<Vec<_>>());
    for row in all.chain(rows.iter().cloned()) {
        let mut line = String::new();
        for (i, (cell, width)) in row.iter().zip(&widths).enumerate() {
            if i + 1 == row.len() {
                line.push_str(cell);
            } else {
                let _ = write!(line, "{cell:<width$}  ");
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

fn host(machine: &Machine) -> String {
    machine
        .host
        .as_ref()
        .filter(|h| h.is_set())
        .map_or_else(|| "-".to_owned(), |h| shown(&h.reference))
}

fn map(values: &BTreeMap<String, String>) -> String {
    if values.is_empty() {
        return "-".to_owned();
    }
    values
        .iter()
        .map(|(k, v)| format!("{}={}", shown(k), shown(v)))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The report for a person: a summary, then machines, fence marks and operation ids.
#[must_use]
pub fn table(report: &Report) -> String {
    let mut out = String::new();
    let counts: Vec<String> = MachineState::ALL
        .iter()
        .filter_map(|s| {
            report
                .machines_by_state
                .get(s.name())
                .map(|n| format!("{} {n}", s.name()))
        })
        .collect();
    let closed = if report.closed_cleanly {
        "cleanly".to_owned()
    } else {
        "NOT cleanly (the provider was killed): repaired in memory to read it, the file is \
         unchanged"
            .to_owned()
    };
    let summary = vec![
        vec!["state file".to_owned(), shown(&report.file)],
        vec!["schema".to_owned(), report.schema_version.to_string()],
        vec!["closed".to_owned(), closed],
        vec!["revision".to_owned(), report.revision.to_string()],
        vec![
            "next operation".to_owned(),
            report.next_operation.to_string(),
        ],
        vec![
            "machines".to_owned(),
            format!(
                "{} stored{}{}",
                report.machines.len(),
                if counts.is_empty() { "" } else { ": " },
                counts.join(", ")
            ),
        ],
    ];
    for row in &summary {
        let _ = writeln!(out, "{:<16}{}", row[0], row[1]);
    }
    out.push_str(&records(report));
    out
}

/// The machines, fence marks and operation ids, one table each.
fn records(report: &Report) -> String {
    let mut out = String::new();
    let machines: Vec<Vec<String>> = report
        .machines
        .iter()
        .map(|m| {
            vec![
                shown(m.id.as_str()),
                m.state.name().to_owned(),
                host(m),
                shown(&m.cluster),
                map(&m.shard_metadata),
                shown(&m.last_error),
            ]
        })
        .collect();
    out.push('\n');
    out.push_str(&columns(
        &[
            "MACHINE",
            "STATE",
            "HOST",
            "CLUSTER",
            "METADATA",
            "LAST ERROR",
        ],
        &machines,
    ));
    let fences: Vec<Vec<String>> = report
        .fence_marks
        .iter()
        .map(|f| {
            vec![
                shown(&f.machine_id),
                shown(&f.shard_id),
                f.epoch.to_string(),
                f.sequence.to_string(),
            ]
        })
        .collect();
    out.push('\n');
    out.push_str(&columns(
        &["FENCE MARK: MACHINE", "SHARD", "EPOCH", "SEQUENCE"],
        &fences,
    ));
    let operations: Vec<Vec<String>> = report
        .operations
        .iter()
        .map(|o| {
            vec![
                shown(&o.machine_id),
                o.kind.to_owned(),
                shown(&o.operation_id),
            ]
        })
        .collect();
    out.push('\n');
    out.push_str(&columns(
        &["OPERATION: MACHINE", "KIND", "OPERATION ID"],
        &operations,
    ));
    out
}
