//! Phase 2: full List latency next to the time prost needs to encode the same list.

use crate::results::say;
use std::time::{Duration, Instant};

use bigfleet_libvirt_domain::ListQuery;
use bigfleet_libvirt_proto::v1alpha1 as pb;
use prost::Message;

use super::*;
use crate::clients::{RawClient, client, connect, list_filter};
use crate::server::{ServerSteps, start_provider};

pub(crate) struct ListRow {
    fleet: usize,
    bytes: usize,
    decoded_client: Samples,
    raw_wire: Samples,
    encode: Samples,
    decode: Samples,
    steps: ServerSteps,
}

pub(crate) fn median_steps(mut runs: Vec<ServerSteps>) -> ServerSteps {
    let mid = |f: fn(&ServerSteps) -> Duration, runs: &mut Vec<ServerSteps>| {
        runs.sort_by_key(f);
        f(&runs[runs.len() / 2])
    };
    ServerSteps {
        list: mid(|s| s.list, &mut runs),
        convert: mid(|s| s.convert, &mut runs),
        encode: mid(|s| s.encode, &mut runs),
        drop: mid(|s| s.drop, &mut runs),
    }
}

pub(crate) async fn measure_list(fleet: usize, reps: usize) -> Result<ListRow, BoxError> {
    let (running, probe) = start_provider(fleet).await?;
    let channel = connect(running.addr).await?;
    let mut generated = client(&channel);
    let mut raw = RawClient::new(&channel);
    let full = || list_filter(&[], 0, Vec::new());
    // Warm up both paths (connection, allocator, HTTP/2 windows).
    let mut last = generated.list(full()).await?.into_inner();
    if last.machines.len() != fleet {
        return Err(format!(
            "List returned {} machines, expected {fleet}",
            last.machines.len()
        )
        .into());
    }
    let mut last_raw = raw.list(full()).await?;
    let mut decoded = Vec::with_capacity(reps);
    let mut wire = Vec::with_capacity(reps);
    let mut steps = Vec::with_capacity(reps);
    for _ in 0..reps {
        // Each answer replaces the previous one only after the clock stops, so freeing the
        // old list is not timed.
        let t = Instant::now();
        let answer = generated.list(full()).await?.into_inner();
        decoded.push(t.elapsed());
        last = answer;
        let t = Instant::now();
        let answer = raw.list(full()).await?;
        wire.push(t.elapsed());
        last_raw = answer;
        steps.push(probe.run(ListQuery::default()).await?);
    }
    let encode_reps = reps.max(5);
    let mut encode = Vec::with_capacity(encode_reps);
    let mut decode = Vec::with_capacity(encode_reps);
    let mut bytes = 0;
    for _ in 0..encode_reps {
        let t = Instant::now();
        let encoded = last.encode_to_vec();
        encode.push(t.elapsed());
        bytes = encoded.len();
        drop(encoded);
        let t = Instant::now();
        let back = pb::MachineList::decode(last_raw.clone())?;
        decode.push(t.elapsed());
        drop(back);
    }
    if bytes != last_raw.len() {
        eprintln!(
            "note: re-encoded list is {bytes} bytes, wire body {} bytes",
            last_raw.len()
        );
    }
    let steps = median_steps(steps);
    drop(generated);
    drop(raw);
    drop(channel);
    running.shutdown().await?;
    Ok(ListRow {
        fleet,
        bytes,
        decoded_client: Samples::new(decoded),
        raw_wire: Samples::new(wire),
        encode: Samples::new(encode),
        decode: Samples::new(decode),
        steps,
    })
}

pub(crate) fn print_list_table(rows: &[ListRow], reps: usize, verdicts: &mut Vec<Verdict>) {
    say!();
    say!(
        "== 2. Full List vs prost encode of the same MachineList ({reps} calls per client; encode/decode = median) =="
    );
    say!(
        "{:>8} {:>9} {:>10} | {:>10} {:>10} {:>7} {:>5} | {:>10} {:>10} {:>7} {:>5} | {:>10}",
        "machines",
        "bytes",
        "encode",
        "(a) p50",
        "(a) p99",
        "(a)/enc",
        "",
        "(b) p50",
        "(b) p99",
        "(b)/enc",
        "",
        "decode",
    );
    for row in rows {
        let enc = row.encode.p50();
        let ra = ratio(row.decoded_client.p50(), enc);
        let rb = ratio(row.raw_wire.p50(), enc);
        say!(
            "{:>8} {:>9} {:>10} | {:>10} {:>10} {:>6.2}x {:>5} | {:>10} {:>10} {:>6.2}x {:>5} | {:>10}",
            row.fleet,
            fmt_bytes(row.bytes),
            fmt_d(enc),
            fmt_d(row.decoded_client.p50()),
            fmt_d(row.decoded_client.p99()),
            ra,
            verdict(ra <= LIST_RATIO_TARGET),
            fmt_d(row.raw_wire.p50()),
            fmt_d(row.raw_wire.p99()),
            rb,
            verdict(rb <= LIST_RATIO_TARGET),
            fmt_d(row.decode.p50()),
        );
        verdicts.push(Verdict {
            what: format!("List {} (a) generated client, p50", row.fleet),
            measured: format!("{ra:.2}x encode"),
            target: format!("<= {LIST_RATIO_TARGET:.0}x encode"),
            pass: ra <= LIST_RATIO_TARGET,
        });
        let slowest = row.decoded_client.pct(100.0);
        verdicts.push(Verdict {
            what: format!("List {} (a) p99 (B1106 budget)", row.fleet),
            measured: fmt_d(row.decoded_client.p99()),
            target: format!("<= {}", fmt_d(CERT_LIST_P99)),
            pass: row.decoded_client.p99() <= CERT_LIST_P99,
        });
        verdicts.push(Verdict {
            what: format!("List {} (a) slowest (B1107 budget)", row.fleet),
            measured: fmt_d(slowest),
            target: format!("<= {}", fmt_d(CERT_ONE_LIST)),
            pass: slowest <= CERT_ONE_LIST,
        });
        verdicts.push(Verdict {
            what: format!("List {} (b) raw wire, p50", row.fleet),
            measured: format!("{rb:.2}x encode"),
            target: format!("<= {LIST_RATIO_TARGET:.0}x encode"),
            pass: rb <= LIST_RATIO_TARGET,
        });
    }
    say!(
        "((a) = generated client, includes client decode; (b) = raw-bytes codec, no decode; target: List p50 <= {LIST_RATIO_TARGET:.0}x encode)"
    );
    say!(
        "server-side work of one full List, timed in-process on the provider between the calls above (median):"
    );
    for row in rows {
        let s = row.steps;
        let sum = s.list + s.convert + s.encode + s.drop;
        say!(
            "  {:>7}: Provider::list {}  memoised encodings x{} {}  splice {}  drop {}  = {} ({:.2}x encode; wire (b) p50 {})",
            row.fleet,
            fmt_d(s.list),
            row.fleet,
            fmt_d(s.convert),
            fmt_d(s.encode),
            fmt_d(s.drop),
            fmt_d(sum),
            ratio(sum, row.encode.p50()),
            fmt_d(row.raw_wire.p50()),
        );
    }
}
