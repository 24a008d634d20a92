//! The doctor's report: how a check came out, the checks and the verdict, the exit code,
//! and the table a person reads (JSON is the report's own serialization).

use std::fmt::Write as _;

use serde::Serialize;

/// How one check came out. Ordered by severity.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    /// Fine.
    Ok,
    /// Not checked (named why); does not affect the verdict.
    Skip,
    /// Works, but worth a look.
    Warn,
    /// The provider would fail here.
    Block,
}

impl Status {
    fn shown(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::Skip => "skip",
            Self::Warn => "WARN",
            Self::Block => "BLOCK",
        }
    }
}

/// One line of the report.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Check {
    /// The zone (one libvirt host), or `-` for the configuration as a whole.
    pub zone: String,
    /// What was checked.
    pub check: &'static str,
    /// The outcome.
    pub status: Status,
    /// What was found.
    pub detail: String,
    /// How to fix it; empty when nothing needs fixing.
    pub fix: String,
}

/// Every check and the verdict.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Report {
    /// The checks, configuration first, then zone by zone.
    pub checks: Vec<Check>,
    /// How many checks block.
    pub blockers: usize,
    /// How many checks warn.
    pub warnings: usize,
    /// `ok`, `warnings` or `blocked`.
    pub verdict: &'static str,
}

impl Report {
    pub(super) fn new(checks: Vec<Check>) -> Self {
        let count = |s| checks.iter().filter(|c| c.status == s).count();
        let (blockers, warnings) = (count(Status::Block), count(Status::Warn));
        let verdict = match (blockers, warnings) {
            (0, 0) => "ok",
            (0, _) => "warnings",
            _ => "blocked",
        };
        Self {
            checks,
            blockers,
            warnings,
            verdict,
        }
    }

    /// The report of a configuration the provider would refuse at start-up.
    #[must_use]
    pub fn refused_configuration(error: &str) -> Self {
        Self::new(vec![check(
            "-",
            "configuration",
            Status::Block,
            error.to_owned(),
            "correct the flag named above; the provider refuses to start with it",
        )])
    }

    /// 0 when nothing blocks or warns, 1 when something blocks, 2 for warnings only.
    #[must_use]
    pub fn exit_code(&self) -> u8 {
        match (self.blockers, self.warnings) {
            (0, 0) => 0,
            (0, _) => 2,
            _ => 1,
        }
    }
}

pub(super) fn check(
    zone: &str,
    name: &'static str,
    status: Status,
    detail: String,
    fix: &str,
) -> Check {
    Check {
        zone: zone.to_owned(),
        check: name,
        status,
        detail,
        fix: fix.to_owned(),
    }
}

/// The report for a person: one line per check, its fix beneath it, then the verdict.
#[must_use]
pub fn table(report: &Report) -> String {
    let width = |f: fn(&Check) -> usize, title: &str| {
        report
            .checks
            .iter()
            .map(f)
            .max()
            .unwrap_or(0)
            .max(title.len())
    };
    let zone_w = width(|c| c.zone.chars().count(), "ZONE");
    let check_w = width(|c| c.check.len(), "CHECK");
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<zone_w$}  {:<check_w$}  STATUS  DETAIL",
        "ZONE", "CHECK"
    );
    for c in &report.checks {
        let detail: String = c
            .detail
            .chars()
            .map(|ch| {
                if ch.is_control() {
                    ch.escape_debug().collect()
                } else {
                    ch.to_string()
                }
            })
            .collect();
        let _ = writeln!(
            out,
            "{:<zone_w$}  {:<check_w$}  {:<6}  {}",
            c.zone,
            c.check,
            c.status.shown(),
            detail
        );
        if !c.fix.is_empty() {
            let _ = writeln!(
                out,
                "{:<zone_w$}  {:<check_w$}          fix: {}",
                "", "", c.fix
            );
        }
    }
    let verdict = match report.verdict {
        "ok" => "nothing blocks: the provider can serve as configured",
        "warnings" => "nothing blocks, but read the warnings",
        _ => "blocked: the provider would fail as configured; fix the BLOCK lines",
    };
    let plural = |n: usize, word: &str| format!("{n} {word}{}", if n == 1 { "" } else { "s" });
    let _ = writeln!(
        out,
        "\nverdict: {} ({}, {})",
        verdict,
        plural(report.blockers, "blocker"),
        plural(report.warnings, "warning")
    );
    out
}

/// `bytes` in GiB, one decimal, as the checks quote sizes.
pub(super) fn gib(bytes: u64) -> String {
    #[allow(clippy::cast_precision_loss)]
    let value = bytes as f64 / f64::from(1u32 << 30);
    format!("{value:.1} GiB")
}
