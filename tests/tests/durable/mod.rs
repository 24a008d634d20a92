//! Durability & restart recovery (docs/conformance.md §3.9 and §5, B1001–B1007) against our own
//! binary with `--state` (a redb file), plus the properties behind them under load: the
//! process is SIGKILLed mid-traffic and restarted on the same file (always on a new port),
//! and everything it acknowledged must still be there — fence marks, operation ids,
//! bindings and metadata, the op-id and revision counters — while every transition cut off
//! by the kill comes back FAILED with a "needs re-drive" last_error.
//!
//! Random choices come from `Xoshiro256PlusPlus` with a fixed seed that is printed
//! (override: `BIGFLEET_TEST_SEED`). Kill timing still depends on the scheduler, so the
//! model accepts every outcome an acknowledged history allows, and nothing else.
//!
//! One module per section of the lane; this one holds what they share.

mod choreography;
mod cursors;
mod exit;
mod load;
mod mid_traffic;
mod migrate;
mod refused;
mod restored;
mod strong_b1006;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::Duration;

use bigfleet_libvirt_proto::v1alpha1 as pb;
use pb::MachineState as S;
use rand_core::{RngCore, SeedableRng};
use rand_xoshiro::Xoshiro256PlusPlus;
use tonic::Code;

use crate::harness::*;

/// The lane's walk deadline (docs/conformance.md §5.1: 20 s per reach).
const WALK: Duration = Duration::from_secs(20);
/// The part of every restart-recovery last_error the lane relies on.
const INTERRUPTED: &str = "interrupted by a provider restart";
/// The metadata B1003 checks.
const DUR_MD: [(&str, &str); 2] = [("d/k", "v"), ("d/k2", "v2")];
/// Out-of-position calls: this provider answers ABORTED (see errors.rs), never
/// FAILED_PRECONDITION.
const OUT_OF_POSITION: Code = Code::Aborted;
/// Fast fake latencies, as the core profile uses.
const FAST: [&str; 2] = ["--fake-delay-min=5ms", "--fake-delay-max=40ms"];

// ---------------------------------------------------------------------------------------
// Shared helpers
// ---------------------------------------------------------------------------------------

/// The durable-lane launch flags on `state` with `seed_count` slots, plus `extra`.
fn lane_args(state: &Path, seed_count: usize, extra: &[&str]) -> Vec<String> {
    let mut args: Vec<String> = vec![
        "--use-fake-backend".into(),
        "--provider=certify".into(),
        format!("--seed-count={seed_count}"),
        format!("--state={}", state.display()),
    ];
    args.extend(FAST.iter().map(|s| (*s).to_owned()));
    args.extend(extra.iter().map(|s| (*s).to_owned()));
    args
}

/// Starts (or restarts) the binary with `args`; every start gets a fresh loopback port.
fn boot(args: &[String]) -> Server {
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    Server::start(&refs)
}

/// SIGKILLs the provider and waits for it (the harness's `kill` does both).
fn sigkill(server: &mut Server) {
    server.kill();
}

/// The contract's restart-recovery message for `kind` (docs/contract.md §5).
fn interrupted(kind: &str) -> String {
    format!("{kind} transition interrupted by a provider restart; needs re-drive")
}

/// Whether a last_error is the restart-recovery message for `kind`.
fn is_interrupted(last_error: &str, kind: &str) -> bool {
    last_error.contains(INTERRUPTED) && last_error.starts_with(&format!("{kind} transition"))
}

fn transitional(s: S) -> bool {
    matches!(s, S::Creating | S::Configuring | S::Draining | S::Deleting)
}

/// The List revision as the contract's decimal counter.
fn decimal(revision: &[u8]) -> i64 {
    let text = std::str::from_utf8(revision).expect("revision is ASCII");
    text.parse()
        .unwrap_or_else(|_| panic!("revision {text:?} is not the decimal counter"))
}

/// id → state of an unfiltered List.
async fn inventory(c: &mut Client) -> BTreeMap<String, S> {
    list_all(c)
        .await
        .machines
        .iter()
        .map(|m| (m.id.clone(), state(m)))
        .collect()
}

/// The first Speculative, non-fault-labelled machine not in `exclude` (a full List).
async fn pick_excluding(c: &mut Client, exclude: &BTreeSet<String>) -> String {
    list(c, &[S::Speculative], 0, b"")
        .await
        .machines
        .into_iter()
        .filter(|m| !m.labels.contains_key(FAULT_LABEL))
        .map(|m| m.id)
        .find(|id| !exclude.contains(id))
        .expect("a fresh Speculative machine")
}

/// The numeric part of a `<prefix>-<n>` operation id.
fn op_number(op: &str) -> u64 {
    op.rsplit('-')
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("operation id {op:?} is not <prefix>-<n>"))
}

fn seeded_rng(test: &str, default: u64) -> Xoshiro256PlusPlus {
    let seed = std::env::var("BIGFLEET_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default);
    println!("{test}: seed {seed} (override with BIGFLEET_TEST_SEED)");
    Xoshiro256PlusPlus::seed_from_u64(seed)
}

fn below(rng: &mut Xoshiro256PlusPlus, n: u64) -> u64 {
    rng.next_u64() % n
}

/// The fields a restart must preserve, for exact comparisons.
fn durable_view(
    m: &pb::Machine,
) -> (
    S,
    Option<pb::HostRef>,
    String,
    BTreeMap<String, String>,
    String,
) {
    (
        state(m),
        m.host.clone(),
        m.cluster.clone(),
        m.shard_metadata.clone().into_iter().collect(),
        m.last_error.clone(),
    )
}

/// Slots: enough for every round's parked machines (FAILED ones, and Configured ones the
/// fake can no longer drain after a restart — see the ignored test below) plus a reserve
/// no task ever touches.
const LOAD_SEED_COUNT: usize = 256;
const LOAD_ROUNDS: usize = 24;
const LOAD_TASKS: usize = 4;
/// Machines each task works on at a time.
const POOL: usize = 3;
