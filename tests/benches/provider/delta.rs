//! Phase 3: `since_revision` delta List latency for a few changed machines in a big fleet.

use crate::results::say;
use std::sync::Arc;
use std::sync::atomic::AtomicI64;
use std::time::Instant;

use bigfleet_libvirt_domain::ListQuery;
use bigfleet_libvirt_proto::v1alpha1 as pb;
use prost::Message;
use tonic::transport::Channel;

use super::*;
use crate::clients::{RawClient, Rpc, client, list_filter, run_batch, settle};
use crate::list::median_steps;
use crate::server::{ServerSteps, StepsProbe};

pub(crate) struct DeltaResult {
    fleet: usize,
    changed: usize,
    returned: usize,
    bytes: usize,
    decoded_client: Samples,
    raw_wire: Samples,
    steps: ServerSteps,
}

#[allow(clippy::too_many_arguments)]
pub(crate) async fn measure_delta(
    channel: &Channel,
    probe: &StepsProbe,
    fleet: usize,
    ids: &[String],
    reps: usize,
    sequence: &Arc<AtomicI64>,
    blob: &Arc<Vec<u8>>,
) -> Result<DeltaResult, BoxError> {
    let mut c = client(channel);
    let mut raw = RawClient::new(channel);
    let revision = c
        .list(list_filter(&[], 1, Vec::new()))
        .await?
        .into_inner()
        .revision;
    let chunks = vec![ids.to_vec()];
    let created = run_batch(channel, Rpc::Create, &chunks, sequence, blob).await?;
    if let Some(error) = created.first_error {
        return Err(format!("delta setup Create failed: {error}").into());
    }
    settle(&mut c, ids, pb::MachineState::Idle).await?;
    let delta = || list_filter(&[], 0, revision.clone());
    let warm = c.list(delta()).await?.into_inner();
    raw.list(delta()).await?;
    let returned = warm.machines.len();
    let bytes = warm.encoded_len();
    let query = ListQuery {
        since_revision: bigfleet_libvirt_domain::parse_cursor(&revision),
        ..ListQuery::default()
    };
    let mut decoded = Vec::with_capacity(reps);
    let mut wire = Vec::with_capacity(reps);
    let mut steps = Vec::with_capacity(reps);
    for _ in 0..reps {
        let t = Instant::now();
        let page = c.list(delta()).await?;
        decoded.push(t.elapsed());
        drop(page);
        let t = Instant::now();
        let page = raw.list(delta()).await?;
        wire.push(t.elapsed());
        drop(page);
        steps.push(probe.run(query.clone()).await?);
    }
    Ok(DeltaResult {
        fleet,
        changed: ids.len(),
        returned,
        bytes,
        decoded_client: Samples::new(decoded),
        raw_wire: Samples::new(wire),
        steps: median_steps(steps),
    })
}

pub(crate) fn print_delta(d: &DeltaResult, verdicts: &mut Vec<Verdict>) {
    say!();
    say!(
        "== 3. List(since_revision) delta: {} changed among {} machines, {} calls per client ==",
        d.changed,
        d.fleet,
        d.decoded_client.len()
    );
    say!(
        "{:<22} {:>8} {:>9} | {:>10} {:>10} {:>10} | {:>7} | {:>6} {:>6}",
        "client",
        "returned",
        "bytes",
        "p50",
        "p99",
        "max",
        "target",
        "p50",
        "p99"
    );
    for (label, samples) in [
        ("(a) generated client", &d.decoded_client),
        ("(b) raw wire", &d.raw_wire),
    ] {
        let p50 = samples.p50();
        let p99 = samples.p99();
        say!(
            "{:<22} {:>8} {:>9} | {:>10} {:>10} {:>10} | {:>7} | {:>6} {:>6}",
            label,
            d.returned,
            fmt_bytes(d.bytes),
            fmt_d(p50),
            fmt_d(p99),
            fmt_d(samples.pct(100.0)),
            fmt_d(DELTA_TARGET),
            verdict(p50 <= DELTA_TARGET),
            verdict(p99 <= DELTA_TARGET),
        );
        let short = &label[..3];
        for (pct, value) in [("p50", p50), ("p99", p99)] {
            verdicts.push(Verdict {
                what: format!("delta {} of {} {short} {pct}", d.changed, d.fleet),
                measured: fmt_d(value),
                target: format!("<= {}", fmt_d(DELTA_TARGET)),
                pass: value <= DELTA_TARGET,
            });
        }
    }
    let s = d.steps;
    say!(
        "server-side work of one delta, in-process (median): Provider::list {}  memoised encodings {}  splice {}  drop {}  = {}",
        fmt_d(s.list),
        fmt_d(s.convert),
        fmt_d(s.encode),
        fmt_d(s.drop),
        fmt_d(s.list + s.convert + s.encode + s.drop),
    );
    if d.returned != d.changed {
        say!(
            "note: the delta returned {} machines for {} changed",
            d.returned,
            d.changed
        );
    }
}
