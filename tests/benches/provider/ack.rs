//! Phase 1: ack latency of each RPC at concurrency 1 and N, next to the echo yardstick.

use crate::results::say;
use std::sync::Arc;
use std::sync::atomic::AtomicI64;
use std::time::Duration;

use bigfleet_libvirt_proto::v1alpha1 as pb;
use tonic::transport::Channel;

use super::*;
use crate::clients::{Rpc, Run, client, run_batch, settle};

pub(crate) struct AckRow {
    pub(crate) rpc: Rpc,
    pub(crate) concurrency: usize,
    provider: Run,
    echo: Run,
    settle: Option<Duration>,
}

impl Run {
    /// Both runs' calls as one sample (wall times add up: the runs were sequential).
    fn merge(self, other: Run) -> Run {
        let mut all = self.samples.0;
        all.extend(other.samples.0);
        Run {
            samples: Samples::new(all),
            wall: self.wall + other.wall,
            errors: self.errors + other.errors,
            first_error: self.first_error.or(other.first_error),
        }
    }
}

/// One (rpc, concurrency) pair, in `rounds` rounds over disjoint slices of every worker's
/// ids so that load from outside the benchmark hits both servers alike. Each round runs the
/// echo, then the provider with the same requests, then (for mutating calls) waits until
/// the provider's transitions land in `target`, so they do not overlap the next echo round.
#[allow(clippy::too_many_arguments)]
async fn measure_ack(
    provider: &Channel,
    echo: &Channel,
    waiter: &mut Client,
    rpc: Rpc,
    chunks: &[Vec<String>],
    rounds: usize,
    target: Option<pb::MachineState>,
    sequence: &Arc<AtomicI64>,
    blob: &Arc<Vec<u8>>,
) -> Result<AckRow, BoxError> {
    let mut echo_run: Option<Run> = None;
    let mut provider_run: Option<Run> = None;
    let mut settled: Option<Duration> = None;
    for round in 0..rounds {
        let slices: Vec<Vec<String>> = chunks
            .iter()
            .map(|c| c[round * c.len() / rounds..(round + 1) * c.len() / rounds].to_vec())
            .collect();
        if slices.iter().all(Vec::is_empty) {
            continue;
        }
        let e = run_batch(echo, rpc, &slices, sequence, blob).await?;
        let p = run_batch(provider, rpc, &slices, sequence, blob).await?;
        echo_run = Some(match echo_run {
            Some(acc) => acc.merge(e),
            None => e,
        });
        provider_run = Some(match provider_run {
            Some(acc) => acc.merge(p),
            None => p,
        });
        if let Some(target) = target {
            let ids: Vec<String> = slices.into_iter().flatten().collect();
            let waited = settle(waiter, &ids, target).await?;
            settled = Some(settled.map_or(waited, |d| d.max(waited)));
        }
    }
    let (Some(echo_run), Some(provider_run)) = (echo_run, provider_run) else {
        return Err("no calls to measure".into());
    };
    if let Some(error) = &provider_run.first_error {
        eprintln!(
            "warning: {} of {} provider {} calls failed; first: {error}",
            provider_run.errors,
            chunks.iter().map(Vec::len).sum::<usize>(),
            rpc.name()
        );
    }
    Ok(AckRow {
        rpc,
        concurrency: chunks.len(),
        provider: provider_run,
        echo: echo_run,
        settle: settled,
    })
}

/// Walks `ids` through Create, Get, Configure, Drain and Delete at one concurrency.
pub(crate) async fn ack_lifecycle(
    provider: &Channel,
    echo: &Channel,
    chunks: &[Vec<String>],
    rounds: usize,
    sequence: &Arc<AtomicI64>,
    blob: &Arc<Vec<u8>>,
) -> Result<Vec<AckRow>, BoxError> {
    use pb::MachineState as S;
    let mut waiter = client(provider);
    let steps = [
        (Rpc::Create, Some(S::Idle)),
        (Rpc::Get, None),
        (Rpc::Configure, Some(S::Configured)),
        (Rpc::Drain, Some(S::Idle)),
        (Rpc::Delete, Some(S::Speculative)),
    ];
    let mut rows = Vec::new();
    for (rpc, target) in steps {
        let row = measure_ack(
            provider,
            echo,
            &mut waiter,
            rpc,
            chunks,
            rounds,
            target,
            sequence,
            blob,
        )
        .await?;
        rows.push(row);
    }
    Ok(rows)
}

pub(crate) fn print_ack_table(rows: &[AckRow], rounds: usize, verdicts: &mut Vec<Verdict>) {
    say!();
    say!(
        "== 1. Ack latency: provider vs bare tonic echo (same service, same requests, same channel setup; {rounds} interleaved rounds) =="
    );
    say!(
        "{:<10} {:>4} {:>6} | {:>10} {:>10} {:>9} | {:>10} {:>10} {:>9} | {:>7} {:>7} | {:>6} {:>6}",
        "rpc",
        "conc",
        "calls",
        "prov p50",
        "prov p99",
        "prov/s",
        "echo p50",
        "echo p99",
        "echo/s",
        "x p50",
        "x p99",
        "p50",
        "p99",
    );
    for row in rows {
        let p = &row.provider.samples;
        let e = &row.echo.samples;
        let r50 = ratio(p.p50(), e.p50());
        let r99 = ratio(p.p99(), e.p99());
        let rate = |run: &Run| run.samples.len() as f64 / run.wall.as_secs_f64().max(1e-9);
        let (v50, v99) = if row.rpc.mutating() {
            (
                verdict(r50 <= ACK_RATIO_TARGET),
                verdict(r99 <= ACK_RATIO_TARGET),
            )
        } else {
            ("info", "info")
        };
        let errors = if row.provider.errors > 0 {
            format!("  ({} errors)", row.provider.errors)
        } else {
            String::new()
        };
        say!(
            "{:<10} {:>4} {:>6} | {:>10} {:>10} {:>9.0} | {:>10} {:>10} {:>9.0} | {:>6.2}x {:>6.2}x | {:>6} {:>6}{errors}",
            row.rpc.name(),
            row.concurrency,
            p.len(),
            fmt_d(p.p50()),
            fmt_d(p.p99()),
            rate(&row.provider),
            fmt_d(e.p50()),
            fmt_d(e.p99()),
            rate(&row.echo),
            r50,
            r99,
            v50,
            v99,
        );
        if row.concurrency == 1 && matches!(row.rpc, Rpc::Get | Rpc::Create) {
            verdicts.push(Verdict {
                what: format!("{} p99 @ c=1 (B1106 budget)", row.rpc.name()),
                measured: fmt_d(p.p99()),
                target: format!("<= {}", fmt_d(CERT_CALL_P99)),
                pass: p.p99() <= CERT_CALL_P99 && row.provider.errors == 0,
            });
        }
        if row.rpc.mutating() {
            for (label, value) in [("p50", r50), ("p99", r99)] {
                verdicts.push(Verdict {
                    what: format!("{} ack {label} @ c={}", row.rpc.name(), row.concurrency),
                    measured: format!("{value:.2}x echo"),
                    target: format!("<= {ACK_RATIO_TARGET:.0}x echo"),
                    pass: value <= ACK_RATIO_TARGET && row.provider.errors == 0,
                });
            }
        }
    }
    let settles: Vec<String> = rows
        .iter()
        .filter_map(|r| {
            r.settle
                .map(|d| format!("{}@c{}={}", r.rpc.name(), r.concurrency, fmt_d(d)))
        })
        .collect();
    say!(
        "(x = provider/echo; target for mutating calls: <= {ACK_RATIO_TARGET:.0}x echo; Get is informational)"
    );
    say!(
        "(longest wait, per round, until all transitions landed after the last ack: {})",
        settles.join(", ")
    );
}

/// Sorts the rows as the table shows them: by RPC in lifecycle order, then concurrency.
pub(crate) fn in_table_order(rows: &mut [AckRow]) {
    let order = [
        Rpc::Create,
        Rpc::Configure,
        Rpc::Drain,
        Rpc::Delete,
        Rpc::Get,
    ];
    rows.sort_by_key(|r| (order.iter().position(|o| *o == r.rpc), r.concurrency));
}
