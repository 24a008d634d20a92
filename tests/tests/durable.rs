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

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

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

// ---------------------------------------------------------------------------------------
// 1. The choreography (docs/conformance.md §5.1)
// ---------------------------------------------------------------------------------------

/// The lane's Configure of C (docs/conformance.md §5.1), sent again verbatim for B1002.
async fn configure_c(c: &mut Client, id: &str) -> Result<pb::TransitionAck, tonic::Status> {
    configure_map(
        c,
        id,
        "durable-cluster",
        md(&DUR_MD),
        b"# durable\n".to_vec(),
        None,
    )
    .await
}

/// B1001–B1007 in the lane's order: fence F with (durA, 3, 7), configure C with
/// `durable-cluster` and {d/k: v, d/k2: v2}, snapshot the inventory, SIGKILL, restart on the
/// same state file (new port), then: the equal token is still fenced (B1001), the Configure
/// retry returns the pre-restart op id (B1002), C keeps its binding (B1003), the inventory is
/// identical (B1004), the cursor is non-empty and a new op id is fresh (B1005), nothing is
/// left transitional except what new traffic started (B1006, weak), and a brand-new shard's
/// first token is accepted (B1007).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn b1001_to_b1007_durability_lane() {
    let dir = tempfile::tempdir().expect("temp dir");
    let args = lane_args(&dir.path().join("durable-state.redb"), 64, &[]);
    let mut server = boot(&args);
    let mut c = server.client().await;

    // 3a: fence F.
    let f = pick(&server, &mut c).await;
    let create_f = create(&mut c, &f, tok("durA", 3, 7))
        .await
        .expect("fenced Create(F, durA, 3, 7)");
    reach(&mut c, &f, S::Idle, WALK).await;
    // 3b: configure C.
    let cm = pick(&server, &mut c).await;
    let create_c = create(&mut c, &cm, None).await.expect("Create(C)");
    reach(&mut c, &cm, S::Idle, WALK).await;
    let cfg = configure_c(&mut c, &cm).await.expect("Configure(C)");
    let cfg_op = cfg.operation_id.clone();
    assert!(!cfg_op.is_empty(), "Configure(C) ack has an empty op id");
    reach(&mut c, &cm, S::Configured, WALK).await;
    let pre_ops: BTreeSet<String> = [
        create_f.operation_id.clone(),
        create_c.operation_id.clone(),
        cfg_op.clone(),
    ]
    .into();
    assert_eq!(
        pre_ops.len(),
        3,
        "three accepted transitions, three op ids: {pre_ops:?}"
    );
    // 3c: inventory snapshot.
    let snapshot = inventory(&mut c).await;
    assert_eq!(snapshot.get(&f), Some(&S::Idle));
    assert_eq!(snapshot.get(&cm), Some(&S::Configured));

    // 4–5: SIGKILL, re-boot on the same file and a new port.
    let old_addr = server.addr;
    drop(c);
    sigkill(&mut server);
    let server = boot(&args);
    assert_ne!(
        server.addr, old_addr,
        "the restart must serve on a different port"
    );
    let mut c = server.client().await;

    // B1001: the equal (not newer) token is still stale.
    let replay = create(&mut c, &f, tok("durA", 3, 7)).await;
    assert_eq!(
        code(&replay),
        Code::FailedPrecondition,
        "B1001: the pre-restart mark (durA, 3, 7) on {f} was lost: {replay:?}"
    );
    // B1002: the identical Configure retry returns cfgOp.
    let again = configure_c(&mut c, &cm)
        .await
        .expect("B1002: the Configure retry must succeed");
    assert!(!again.operation_id.is_empty(), "B1002: empty op id");
    assert_eq!(
        again.operation_id, cfg_op,
        "B1002: the retry minted a new op id"
    );
    // B1003: C keeps its cluster and exact metadata.
    let got = get(&mut c, &cm).await.expect("B1003: Get(C)");
    assert_eq!(got.cluster, "durable-cluster", "B1003: cluster lost");
    assert_eq!(got.shard_metadata, md(&DUR_MD), "B1003: metadata changed");
    // B1004: identical id → state inventory.
    let after = inventory(&mut c).await;
    assert_eq!(after.len(), snapshot.len(), "B1004: inventory size changed");
    for (id, s) in &snapshot {
        assert_eq!(
            after.get(id),
            Some(s),
            "B1004: {id} missing or changed state"
        );
    }
    let extra: Vec<&String> = after
        .keys()
        .filter(|id| !snapshot.contains_key(*id))
        .collect();
    assert!(
        extra.is_empty(),
        "B1004: extra ids after restart: {extra:?}"
    );
    // B1005: a non-empty cursor, and a new op id that repeats no pre-restart id.
    let listed = list_all(&mut c).await;
    assert!(
        !listed.revision.is_empty(),
        "B1005: empty List revision after restart"
    );
    let mut used: BTreeSet<String> = [f.clone(), cm.clone()].into();
    let fresh = pick_excluding(&mut c, &used).await;
    let ack = create(&mut c, &fresh, None)
        .await
        .expect("B1005: Create on a fresh machine");
    assert!(!ack.operation_id.is_empty(), "B1005: empty op id");
    assert!(
        !pre_ops.contains(&ack.operation_id),
        "B1005: post-restart op id {} repeats a pre-restart id {pre_ops:?}",
        ack.operation_id
    );
    used.insert(fresh.clone());
    // B1006 (weak): nothing transitional, except the machine B1005 just started.
    let stuck: Vec<(String, S)> = list_all(&mut c)
        .await
        .machines
        .iter()
        .filter(|m| m.id != fresh && transitional(state(m)))
        .map(|m| (m.id.clone(), state(m)))
        .collect();
    assert!(
        stuck.is_empty(),
        "B1006 (weak): transitional after restart: {stuck:?}"
    );
    // B1007: the first token of a brand-new shard is accepted.
    let other = pick_excluding(&mut c, &used).await;
    let first = create(&mut c, &other, tok("durB", 1, 1)).await;
    assert_eq!(
        code(&first),
        Code::Ok,
        "B1007: first token (durB, 1, 1) refused after restart: {first:?}"
    );
}

// ---------------------------------------------------------------------------------------
// 2. Strong B1006
// ---------------------------------------------------------------------------------------

/// docs/conformance.md §5.2 against our own binary: a Configure held open by the `fault-timeout`
/// hook (30 s deadline) is cut off by SIGKILL; after the restart a single Get shows FAILED with the
/// restart-recovery last_error, and the record keeps its cluster, metadata and host.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn b1006_strong_interrupted_configure_comes_back_failed() {
    let dir = tempfile::tempdir().expect("temp dir");
    let args = lane_args(
        &dir.path().join("fault-state.redb"),
        64,
        &["--fake-fault-hooks", "--transition-timeout=30s"],
    );
    let mut server = boot(&args);
    let mut c = server.client().await;
    let id = pick(&server, &mut c).await;
    create(&mut c, &id, None).await.expect("Create ack");
    let idle = reach(&mut c, &id, S::Idle, WALK).await;
    let ack = configure_map(
        &mut c,
        &id,
        "fault-timeout",
        md(&[("b1006/k", "v")]),
        b"# b1006\n".to_vec(),
        None,
    )
    .await
    .expect("the fault-timeout Configure ack must succeed");
    assert!(!ack.operation_id.is_empty());
    let seen = reach(&mut c, &id, S::Configuring, Duration::from_secs(5)).await;
    assert_eq!(seen.cluster, "fault-timeout");
    sigkill(&mut server);

    let server = boot(&args);
    let mut c = server.client().await;
    let m = get(&mut c, &id).await.expect("Get after restart");
    assert_eq!(
        state(&m),
        S::Failed,
        "B1006: not FAILED after restart: {m:?}"
    );
    assert!(
        !m.last_error.is_empty(),
        "B1006: FAILED with an empty last_error"
    );
    assert!(
        is_interrupted(&m.last_error, "configure"),
        "B1006: last_error {:?} is not the configure restart-recovery message ({:?})",
        m.last_error,
        interrupted("configure")
    );
    assert_eq!(
        m.cluster, "fault-timeout",
        "the FAILED record lost its cluster"
    );
    assert_eq!(
        m.shard_metadata,
        md(&[("b1006/k", "v")]),
        "the FAILED record lost its metadata"
    );
    assert_eq!(
        m.host, idle.host,
        "the FAILED record lost or changed its host"
    );
    // Recovery is not a transition the shard can re-drive: the same Configure is refused.
    let retry = configure_map(
        &mut c,
        &id,
        "fault-timeout",
        md(&[("b1006/k", "v")]),
        b"# b1006\n".to_vec(),
        None,
    )
    .await;
    assert_eq!(
        code(&retry),
        OUT_OF_POSITION,
        "FAILED must be terminal: {retry:?}"
    );
}

// ---------------------------------------------------------------------------------------
// 3. Revision cursors across a restart
// ---------------------------------------------------------------------------------------

/// A cursor taken before the kill re-lists everything after the restart; a cursor at the
/// post-restart head yields nothing; the head never goes backwards; a transition cut off by
/// the kill shows up in the delta from the pre-kill head (its recovery bumps the revision);
/// later changes show up in deltas from the new head.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn revision_cursors_survive_restart() {
    let dir = tempfile::tempdir().expect("temp dir");
    // Fault hooks only so that one transition can be held open across the second kill.
    let args = lane_args(
        &dir.path().join("cursor-state.redb"),
        64,
        &["--fake-fault-hooks", "--transition-timeout=30s"],
    );
    let mut server = boot(&args);
    let mut c = server.client().await;
    let boot_list = list_all(&mut c).await;
    let total = boot_list.machines.len();
    let old_cursor = boot_list.revision.clone();
    let a = walk_to_idle(&server, &mut c).await;
    let b = walk_to_configured(&server, &mut c, "cursor-cluster", &[("c/k", "v")]).await;
    let head_before = list_all(&mut c).await.revision;
    assert!(
        decimal(&head_before) > decimal(&old_cursor),
        "mutations did not advance the revision"
    );
    let mut claimed: BTreeSet<String> = [a.clone(), b.clone()].into();
    sigkill(&mut server);

    let mut server = boot(&args);
    let mut c = server.client().await;
    let full = list_all(&mut c).await;
    let head = full.revision.clone();
    assert!(
        decimal(&head) >= decimal(&head_before),
        "head went backwards across the restart: {:?} -> {:?}",
        String::from_utf8_lossy(&head_before),
        String::from_utf8_lossy(&head)
    );
    let relist = list(&mut c, &[], 0, &old_cursor).await;
    assert_eq!(
        relist.machines.len(),
        total,
        "a pre-restart cursor must re-list every machine"
    );
    let full_view: BTreeMap<String, _> = full
        .machines
        .iter()
        .map(|m| (m.id.clone(), durable_view(m)))
        .collect();
    for m in &relist.machines {
        assert_eq!(
            full_view.get(&m.id),
            Some(&durable_view(m)),
            "re-listed {} differs",
            m.id
        );
    }
    assert_eq!(
        state(
            relist
                .machines
                .iter()
                .find(|m| m.id == b)
                .expect("b re-listed")
        ),
        S::Configured
    );
    let at_head = list(&mut c, &[], 0, &head).await;
    assert!(
        at_head.machines.is_empty(),
        "List(since=head) right after the restart returned {:?}",
        at_head.machines.iter().map(|m| &m.id).collect::<Vec<_>>()
    );
    let at_old_head = list(&mut c, &[], 0, &head_before).await;
    assert!(
        at_old_head.machines.is_empty(),
        "quiescent kill: nothing changed after the pre-kill head, yet got {:?}",
        at_old_head
            .machines
            .iter()
            .map(|m| &m.id)
            .collect::<Vec<_>>()
    );

    // A post-restart change shows in the delta from the new head, and only it.
    let fresh = pick_excluding(&mut c, &claimed).await;
    claimed.insert(fresh.clone());
    create(&mut c, &fresh, None)
        .await
        .expect("post-restart Create");
    let delta = list(&mut c, &[], 0, &head).await;
    let ids: BTreeSet<&str> = delta.machines.iter().map(|m| m.id.as_str()).collect();
    assert!(
        ids.contains(fresh.as_str()),
        "the post-restart Create is missing from the delta"
    );
    assert!(
        ids.len() == 1,
        "the delta holds more than the one change: {ids:?}"
    );
    assert!(
        decimal(&delta.revision) > decimal(&head),
        "the head did not advance"
    );
    reach(&mut c, &fresh, S::Idle, WALK).await;

    // Second kill with a transition held open: its recovery shows in the delta from the
    // pre-kill head, and the head still does not go backwards.
    let held = pick_excluding(&mut c, &claimed).await;
    create(&mut c, &held, None).await.expect("Create");
    reach(&mut c, &held, S::Idle, WALK).await;
    configure(&mut c, &held, "fault-timeout", &[("h/k", "v")], None)
        .await
        .expect("held Configure ack");
    reach(&mut c, &held, S::Configuring, Duration::from_secs(5)).await;
    let head_before = list_all(&mut c).await.revision;
    sigkill(&mut server);

    let server = boot(&args);
    let mut c = server.client().await;
    let head = list_all(&mut c).await.revision;
    assert!(
        decimal(&head) > decimal(&head_before),
        "restart recovery must bump the revision: {:?} -> {:?}",
        String::from_utf8_lossy(&head_before),
        String::from_utf8_lossy(&head)
    );
    let delta = list(&mut c, &[], 0, &head_before).await;
    let ids: Vec<&str> = delta.machines.iter().map(|m| m.id.as_str()).collect();
    assert_eq!(ids, vec![held.as_str()], "delta from the pre-kill head");
    assert_eq!(state(&delta.machines[0]), S::Failed);
    assert!(is_interrupted(&delta.machines[0].last_error, "configure"));
    let relist = list(&mut c, &[], 0, &old_cursor).await;
    assert_eq!(
        relist.machines.len(),
        total,
        "the oldest cursor must still re-list everything"
    );
}

// ---------------------------------------------------------------------------------------
// 4. SIGKILL under concurrent load
// ---------------------------------------------------------------------------------------

/// Slots: enough for every round's parked machines (FAILED ones, and Configured ones the
/// fake can no longer drain after a restart — see the ignored test below) plus a reserve
/// no task ever touches.
const LOAD_SEED_COUNT: usize = 256;
const LOAD_ROUNDS: usize = 24;
const LOAD_TASKS: usize = 4;
/// Machines each task works on at a time.
const POOL: usize = 3;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Kind {
    Create,
    Configure,
    Drain,
    Delete,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Create => "create",
            Kind::Configure => "configure",
            Kind::Drain => "drain",
            Kind::Delete => "delete",
        }
    }
    fn transitional(self) -> S {
        match self {
            Kind::Create => S::Creating,
            Kind::Configure => S::Configuring,
            Kind::Drain => S::Draining,
            Kind::Delete => S::Deleting,
        }
    }
    fn target(self) -> S {
        match self {
            Kind::Create | Kind::Drain => S::Idle,
            Kind::Configure => S::Configured,
            Kind::Delete => S::Speculative,
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
struct Binding {
    cluster: String,
    md: HashMap<String, String>,
}

/// What the acknowledged history says about a machine.
#[derive(Clone, Debug)]
enum Base {
    /// Known stable and durable (verified after a restart, or implied by a later ack).
    Settled { state: S, binding: Option<Binding> },
    /// Accepted (the ack was received); its completion is not known to be durable yet.
    /// `binding` is the binding the record had at acceptance.
    Pending {
        kind: Kind,
        binding: Option<Binding>,
    },
}

#[derive(Clone, Debug)]
struct LastAck {
    kind: Kind,
    op: String,
    /// For Configure: the binding that was accepted (retries resend it).
    binding: Option<Binding>,
    lifetime: usize,
}

/// A call whose outcome the kill made unknown.
#[derive(Clone, Debug)]
struct Indefinite {
    kind: Kind,
    /// Sent as a fresh transition from its source state (so it may have been accepted).
    fresh: bool,
    /// The binding the record would carry once accepted (Configure: the one sent; Drain:
    /// the current one).
    binding: Option<Binding>,
    /// The highest op number acknowledged before the call was sent.
    op_floor: u64,
}

#[derive(Clone, Debug)]
struct Model {
    id: String,
    shard: String,
    base: Base,
    last_ack: Option<LastAck>,
    cycle: u32,
    indefinite: Option<Indefinite>,
    /// The newest fenced token that got a definite answer (OK or a rejection other than
    /// FAILED_PRECONDITION): the mark for (shard, id) is at least this.
    mark: Option<(i64, i64)>,
    /// Whether the fake holds this machine's domain in the current process lifetime.
    domain_here: bool,
}

impl Model {
    fn bound(&self) -> Option<Binding> {
        match &self.base {
            Base::Settled { binding, .. } | Base::Pending { binding, .. } => binding.clone(),
        }
    }
}

#[derive(Clone, Copy, Debug, Default)]
struct Stats {
    fresh: u64,
    retries: u64,
    cross_restart_retries: u64,
    probes: u64,
    indefinite: u64,
}

impl Stats {
    fn add(&mut self, o: Stats) {
        self.fresh += o.fresh;
        self.retries += o.retries;
        self.cross_restart_retries += o.cross_restart_retries;
        self.probes += o.probes;
        self.indefinite += o.indefinite;
    }
}

struct Task {
    index: usize,
    shard: String,
    seq: i64,
    lifetime: usize,
    rng: Xoshiro256PlusPlus,
    pool: Vec<Model>,
    stats: Stats,
    clusters: u64,
}

struct Shared {
    /// Set just before SIGKILL: errors after this are indefinite, and no new call starts.
    killed: AtomicBool,
    /// Set to let tasks finish their current call and stop (partial quiescence).
    stop: AtomicBool,
    /// Highest op number ever acknowledged.
    max_op: AtomicU64,
    /// Every op id ever learned → (machine, kind, cycle).
    ops: Mutex<HashMap<String, (String, Kind, u32)>>,
}

impl Shared {
    /// Records a freshly minted op id; it must be new and above `floor`.
    fn mint(&self, op: &str, floor: u64, identity: (String, Kind, u32)) {
        let n = op_number(op);
        assert!(
            n > floor,
            "(d) op id {op} for {identity:?} is not above {floor}, the highest op number \
             acknowledged before it was requested: the op-id counter went back"
        );
        let mut ops = self.ops.lock().unwrap();
        if let Some(previous) = ops.get(op) {
            panic!("(d) op id {op} reused: first {previous:?}, now {identity:?}");
        }
        ops.insert(op.to_owned(), identity);
        drop(ops);
        self.max_op.fetch_max(n, Ordering::SeqCst);
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Action {
    Fresh,
    Retry,
    Probe,
}

fn random_binding(rng: &mut Xoshiro256PlusPlus, task: usize, n: u64) -> Binding {
    const VALUES: [&str; 6] = ["v", "", "élan", "a\u{0}b", "✓ ok", "line\nbreak"];
    let entries = below(rng, 4);
    let md = (0..entries)
        .map(|i| {
            let value = VALUES[below(rng, VALUES.len() as u64) as usize];
            (
                format!("dur/t{task}/k{i}"),
                format!("{value}{}", below(rng, 1000)),
            )
        })
        .collect();
    Binding {
        cluster: format!("load-t{task}-{n}"),
        md,
    }
}

async fn send(
    c: &mut Client,
    kind: Kind,
    id: &str,
    binding: Option<&Binding>,
    token: Token,
) -> Result<pb::TransitionAck, tonic::Status> {
    match kind {
        Kind::Create => create(c, id, token).await,
        Kind::Configure => {
            let b = binding.expect("a Configure carries a binding");
            configure_map(c, id, &b.cluster, b.md.clone(), b"# load\n".to_vec(), token).await
        }
        Kind::Drain => drain(c, id, 5, token).await,
        Kind::Delete => delete(c, id, token).await,
    }
}

fn binding_of(m: &pb::Machine) -> Option<Binding> {
    (!m.cluster.is_empty() || !m.shard_metadata.is_empty()).then(|| Binding {
        cluster: m.cluster.clone(),
        md: m.shard_metadata.clone(),
    })
}

/// During load (no restart in between) Get must agree with the acknowledged history.
fn check_live(model: &Model, m: &pb::Machine) {
    let s = state(m);
    let ok = match &model.base {
        Base::Settled { state, .. } => s == *state,
        Base::Pending { kind, .. } => s == kind.transitional() || s == kind.target(),
    };
    assert!(
        ok,
        "during load {} is {s:?}, but the acknowledged history says {:?}",
        model.id, model.base
    );
}

/// One task's traffic until the kill (or the stop flag).
async fn run_task(mut t: Task, mut c: Client, shared: Arc<Shared>) -> Task {
    let epoch = i64::try_from(t.lifetime).expect("small") + 1;
    while !shared.stop.load(Ordering::SeqCst) && !shared.killed.load(Ordering::SeqCst) {
        let i = below(&mut t.rng, t.pool.len() as u64) as usize;
        let roll = below(&mut t.rng, 100);
        let action = if roll < 15 && t.pool[i].last_ack.is_some() {
            Action::Retry
        } else if roll < 22 {
            Action::Probe
        } else {
            Action::Fresh
        };
        let (kind, binding) = if action == Action::Retry {
            let la = t.pool[i].last_ack.clone().expect("retry of an acked call");
            let mut binding = la.binding.clone();
            if la.kind == Kind::Configure && below(&mut t.rng, 2) == 0 {
                // Same intent, different request contents: they must be ignored.
                t.clusters += 1;
                binding = Some(random_binding(&mut t.rng, t.index, t.clusters));
            }
            (la.kind, binding)
        } else {
            let Ok(current) = get(&mut c, &t.pool[i].id).await else {
                break;
            };
            check_live(&t.pool[i], &current);
            let s = state(&current);
            assert_ne!(
                s,
                S::Failed,
                "{} FAILED during load: {current:?}",
                t.pool[i].id
            );
            let domain = t.pool[i].domain_here;
            let pick = below(&mut t.rng, 10);
            let kind = match (action, s) {
                (Action::Fresh, S::Speculative) => Some(Kind::Create),
                // The fake lost the domain of a machine restored Idle: only Delete works.
                (Action::Fresh, S::Idle) if domain && pick < 7 => Some(Kind::Configure),
                (Action::Fresh, S::Idle) => Some(Kind::Delete),
                (Action::Fresh, S::Configured) if domain => Some(Kind::Drain),
                // Always out of position (no record makes them idempotent).
                (Action::Probe, S::Speculative) if pick < 5 => Some(Kind::Configure),
                (Action::Probe, S::Speculative) => Some(Kind::Drain),
                (Action::Probe, S::Configured) if pick < 5 => Some(Kind::Create),
                (Action::Probe, S::Configured) => Some(Kind::Delete),
                _ => None,
            };
            let Some(kind) = kind else {
                tokio::time::sleep(Duration::from_millis(2)).await;
                continue;
            };
            let binding = match kind {
                Kind::Configure => {
                    t.clusters += 1;
                    Some(random_binding(&mut t.rng, t.index, t.clusters))
                }
                Kind::Drain => t.pool[i].bound(),
                _ => None,
            };
            (kind, binding)
        };
        let fenced = below(&mut t.rng, 100) < 60;
        let token: Token = fenced.then(|| {
            t.seq += 1;
            (t.shard.clone(), epoch, t.seq)
        });
        if shared.killed.load(Ordering::SeqCst) {
            break;
        }
        let floor = shared.max_op.load(Ordering::SeqCst);
        let id = t.pool[i].id.clone();
        let result = send(&mut c, kind, &id, binding.as_ref(), token.clone()).await;
        let killed = shared.killed.load(Ordering::SeqCst);
        let m = &mut t.pool[i];
        match result {
            Ok(ack) => {
                if let Some((_, e, s)) = &token {
                    m.mark = Some((*e, *s));
                }
                let snap = ack.machine.clone().unwrap_or_default();
                match action {
                    Action::Fresh => {
                        m.cycle += 1;
                        shared.mint(&ack.operation_id, floor, (id.clone(), kind, m.cycle));
                        assert_eq!(
                            state(&snap),
                            kind.transitional(),
                            "a fresh {kind:?} ack on {id} is not transitional: {ack:?}"
                        );
                        let at_accept = match kind {
                            Kind::Configure | Kind::Drain => binding.clone(),
                            _ => None,
                        };
                        if kind == Kind::Configure {
                            assert_eq!(binding_of(&snap), at_accept, "Configure ack binding");
                        }
                        m.base = Base::Pending {
                            kind,
                            binding: at_accept,
                        };
                        m.last_ack = Some(LastAck {
                            kind,
                            op: ack.operation_id.clone(),
                            binding: if kind == Kind::Configure {
                                binding
                            } else {
                                None
                            },
                            lifetime: t.lifetime,
                        });
                        m.domain_here =
                            kind == Kind::Create || (m.domain_here && kind != Kind::Delete);
                        t.stats.fresh += 1;
                    }
                    Action::Retry => {
                        let la = m.last_ack.clone().expect("retry of an acked call");
                        assert_eq!(
                            ack.operation_id, la.op,
                            "(d) an idempotent {kind:?} retry on {id} returned a different op id \
                             (recorded in lifetime {}, now lifetime {})",
                            la.lifetime, t.lifetime
                        );
                        if kind == Kind::Configure {
                            assert_eq!(
                                binding_of(&snap),
                                la.binding,
                                "a Configure retry with other contents changed the binding"
                            );
                        }
                        if fenced && state(&snap) == kind.target() {
                            // The retry's mark was made durable after the completion it saw.
                            m.base = Base::Settled {
                                state: kind.target(),
                                binding: if kind == Kind::Configure {
                                    la.binding
                                } else {
                                    None
                                },
                            };
                        }
                        if la.lifetime < t.lifetime {
                            t.stats.cross_restart_retries += 1;
                        }
                        t.stats.retries += 1;
                    }
                    Action::Probe => {
                        panic!("out-of-position {kind:?} on {id} was accepted: {ack:?}")
                    }
                }
                shared
                    .max_op
                    .fetch_max(op_number(&ack.operation_id), Ordering::SeqCst);
            }
            Err(_) if killed => {
                // Sent before the kill, answered (or broken) after it: unknown outcome.
                m.indefinite = Some(Indefinite {
                    kind,
                    fresh: action == Action::Fresh,
                    binding: match kind {
                        Kind::Configure | Kind::Drain => binding,
                        _ => None,
                    },
                    op_floor: floor,
                });
                t.stats.indefinite += 1;
                break;
            }
            Err(status) => {
                assert_ne!(
                    status.code(),
                    Code::FailedPrecondition,
                    "a strictly newer token {token:?} was fenced on {id}: {status:?}"
                );
                assert!(
                    action == Action::Probe && status.code() == OUT_OF_POSITION,
                    "{action:?} {kind:?} on {id} failed before any kill: {status:?}"
                );
                if let Some((_, e, s)) = &token {
                    m.mark = Some((*e, *s));
                }
                t.stats.probes += 1;
            }
        }
    }
    t
}

/// One expected post-restart shape.
#[derive(Clone, Debug)]
struct Outcome {
    state: S,
    binding: Option<Binding>,
    host: bool,
    /// The kind whose restart-recovery message last_error must be.
    interrupted: Option<Kind>,
    /// Whether it means the indefinite call was applied.
    applied: bool,
}

fn settled(state: S, binding: Option<Binding>) -> Outcome {
    Outcome {
        state,
        binding,
        host: matches!(state, S::Idle | S::Configured),
        interrupted: None,
        applied: false,
    }
}

/// Where an accepted `kind` can be after a restart: finished, or cut off.
fn accepted(kind: Kind, at_accept: Option<Binding>, applied: bool) -> [Outcome; 2] {
    let done_binding = if kind == Kind::Configure {
        at_accept.clone()
    } else {
        None
    };
    let done = Outcome {
        applied,
        ..settled(kind.target(), done_binding)
    };
    let cut = Outcome {
        state: S::Failed,
        binding: match kind {
            Kind::Configure | Kind::Drain => at_accept,
            _ => None,
        },
        host: kind != Kind::Create,
        interrupted: Some(kind),
        applied,
    };
    [done, cut]
}

/// (b) Every shape the acknowledged history (plus an indefinite call) allows.
fn allowed(model: &Model) -> Vec<Outcome> {
    let mut out = match &model.base {
        Base::Settled { state, binding } => vec![settled(*state, binding.clone())],
        Base::Pending { kind, binding } => accepted(*kind, binding.clone(), false).to_vec(),
    };
    if let Some(ind) = model.indefinite.as_ref().filter(|i| i.fresh) {
        out.extend(accepted(ind.kind, ind.binding.clone(), true));
    }
    out
}

fn matches(o: &Outcome, m: &pb::Machine) -> bool {
    let binding_ok = match &o.binding {
        Some(b) => m.cluster == b.cluster && m.shard_metadata == b.md,
        None => m.cluster.is_empty() && m.shard_metadata.is_empty(),
    };
    let error_ok = match o.interrupted {
        Some(kind) => is_interrupted(&m.last_error, kind.name()),
        None => m.last_error.is_empty(),
    };
    state(m) == o.state && host_set(m) == o.host && binding_ok && error_ok
}

/// A machine no longer worked on; its record must never change again.
struct Parked {
    model: Model,
    record: pb::Machine,
}

#[derive(Debug, Default)]
struct Verdict {
    failed_by_restart: usize,
    applied_indefinite: usize,
    parked_now: usize,
    head: i64,
}

/// After a restart: checks (a)–(f) for every machine, learns the op ids of indefinite calls
/// that were applied, and parks FAILED / Configured machines.
#[allow(clippy::too_many_arguments)]
async fn verify_restart(
    c: &mut Client,
    tasks: &mut [Task],
    parked: &mut BTreeMap<String, Parked>,
    touched: &BTreeSet<String>,
    shared: &Shared,
    prev_head: i64,
    fresh_acked: u64,
    lifetime: usize,
) -> Verdict {
    let listed = list_all(c).await;
    assert_eq!(
        listed.machines.len(),
        LOAD_SEED_COUNT,
        "inventory size changed"
    );
    let by_id: BTreeMap<String, pb::Machine> = listed
        .machines
        .iter()
        .map(|m| (m.id.clone(), m.clone()))
        .collect();
    assert_eq!(by_id.len(), LOAD_SEED_COUNT, "duplicate ids in List");
    // (f) Nothing transitional right after the restart (no traffic yet).
    let stuck: Vec<(&String, S)> = by_id
        .values()
        .filter(|m| transitional(state(m)))
        .map(|m| (&m.id, state(m)))
        .collect();
    assert!(
        stuck.is_empty(),
        "(f) transitional right after restart: {stuck:?}"
    );
    // (e) Untouched machines are pristine.
    for m in by_id.values().filter(|m| !touched.contains(&m.id)) {
        assert!(
            state(m) == S::Speculative
                && !host_set(m)
                && m.cluster.is_empty()
                && m.shard_metadata.is_empty()
                && m.last_error.is_empty(),
            "(e) {} was never touched but is {m:?}",
            m.id
        );
    }
    // Parked machines never change.
    for p in parked.values() {
        let now = &by_id[&p.model.id];
        assert_eq!(
            durable_view(now),
            durable_view(&p.record),
            "parked machine {} changed across a restart",
            p.model.id
        );
    }
    let mut v = Verdict::default();
    // (b)/(c) Every worked-on machine against its history.
    for t in tasks.iter_mut() {
        for model in &mut t.pool {
            let now = &by_id[&model.id];
            let options = allowed(model);
            let Some(hit) = options.iter().find(|o| matches(o, now)) else {
                panic!(
                    "(b)/(c) {} after restart is\n  {now:?}\nbut its acknowledged history \
                     {:?} (last ack {:?}, indefinite {:?}) allows only\n  {options:#?}",
                    model.id, model.base, model.last_ack, model.indefinite
                );
            };
            if hit.interrupted.is_some() {
                v.failed_by_restart += 1;
            }
            if hit.applied {
                v.applied_indefinite += 1;
                let ind = model.indefinite.clone().expect("applied indefinite call");
                model.cycle += 1;
                if hit.interrupted.is_none() {
                    // (d) Learn its op id with an idempotent retry: never seen before, and
                    // above everything acknowledged before it was sent.
                    let ack = send(c, ind.kind, &model.id, ind.binding.as_ref(), None)
                        .await
                        .unwrap_or_else(|e| {
                            panic!(
                                "retry of the applied indefinite {:?} on {}: {e:?}",
                                ind.kind, model.id
                            )
                        });
                    shared.mint(
                        &ack.operation_id,
                        ind.op_floor,
                        (model.id.clone(), ind.kind, model.cycle),
                    );
                    model.last_ack = Some(LastAck {
                        kind: ind.kind,
                        op: ack.operation_id,
                        binding: if ind.kind == Kind::Configure {
                            ind.binding.clone()
                        } else {
                            None
                        },
                        lifetime,
                    });
                }
            }
            model.base = Base::Settled {
                state: state(now),
                binding: binding_of(now),
            };
            model.indefinite = None;
            model.domain_here = false;
        }
    }
    // (a) Every acknowledged fence mark survived: the exact last answered token is stale.
    let all_models = tasks
        .iter()
        .flat_map(|t| t.pool.iter())
        .chain(parked.values().map(|p| &p.model));
    for model in all_models {
        if let Some((e, s)) = model.mark {
            let replay = create(c, &model.id, tok(&model.shard, e, s)).await;
            assert_eq!(
                code(&replay),
                Code::FailedPrecondition,
                "(a) the mark ({}, {e}, {s}) on {} was lost across the restart: {replay:?}",
                model.shard,
                model.id
            );
        }
    }
    // Revision: every acknowledged accept and every recovered machine bumped it durably.
    let head = decimal(&listed.revision);
    let floor =
        prev_head + fresh_acked as i64 + v.applied_indefinite as i64 + v.failed_by_restart as i64;
    assert!(
        head >= floor,
        "the revision went back: head {head} after restart, but the previous head {prev_head} \
         plus {fresh_acked} acknowledged accepts, {} applied indefinite calls and {} recovered \
         machines needs at least {floor}",
        v.applied_indefinite,
        v.failed_by_restart
    );
    v.head = head;
    // Park FAILED machines (terminal) and Configured ones (the fake lost their domain).
    for t in tasks.iter_mut() {
        let (keep, park): (Vec<Model>, Vec<Model>) = std::mem::take(&mut t.pool)
            .into_iter()
            .partition(|m| !matches!(state(&by_id[&m.id]), S::Failed | S::Configured));
        t.pool = keep;
        for model in park {
            v.parked_now += 1;
            let record = by_id[&model.id].clone();
            parked.insert(model.id.clone(), Parked { model, record });
        }
    }
    v
}

/// The main durability property: at least 20 rounds of concurrent fenced and unfenced
/// traffic, each cut off by SIGKILL at a random point, then verified against a model built
/// only from acknowledged responses (see the module docs and the checks (a)–(f) in
/// `verify_restart`).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigkill_under_concurrent_load_loses_nothing_acknowledged() {
    let started = Instant::now();
    let mut rng = seeded_rng("sigkill_under_concurrent_load", 0x00D0_0AB1_E5EE_D001);
    let dir = tempfile::tempdir().expect("temp dir");
    let args = lane_args(&dir.path().join("load-state.redb"), LOAD_SEED_COUNT, &[]);
    let mut server = boot(&args);
    let mut c = server.client().await;
    let first = list_all(&mut c).await;
    assert_eq!(first.machines.len(), LOAD_SEED_COUNT);
    let mut head = decimal(&first.revision);
    let mut free: Vec<String> = first
        .machines
        .iter()
        .filter(|m| state(m) == S::Speculative && !m.labels.contains_key(FAULT_LABEL))
        .map(|m| m.id.clone())
        .collect();
    free.sort();
    free.reverse();
    let mut touched: BTreeSet<String> = BTreeSet::new();
    let mut parked: BTreeMap<String, Parked> = BTreeMap::new();
    let shared = Arc::new(Shared {
        killed: AtomicBool::new(false),
        stop: AtomicBool::new(false),
        max_op: AtomicU64::new(0),
        ops: Mutex::new(HashMap::new()),
    });
    let mut tasks: Vec<Task> = (0..LOAD_TASKS)
        .map(|index| Task {
            index,
            shard: format!("dur-load-t{index}"),
            seq: 0,
            lifetime: 0,
            rng: Xoshiro256PlusPlus::seed_from_u64(rng.next_u64()),
            pool: Vec::new(),
            stats: Stats::default(),
            clusters: 0,
        })
        .collect();
    let mut total = Stats::default();
    let (mut total_failed, mut total_applied) = (0, 0);

    for round in 0..LOAD_ROUNDS {
        let round_started = Instant::now();
        // Top the pools up with machines nobody has touched.
        for t in &mut tasks {
            while t.pool.len() < POOL {
                let id = free
                    .pop()
                    .expect("LOAD_SEED_COUNT too small for this many rounds");
                touched.insert(id.clone());
                t.pool.push(Model {
                    id,
                    shard: t.shard.clone(),
                    base: Base::Settled {
                        state: S::Speculative,
                        binding: None,
                    },
                    last_ack: None,
                    cycle: 0,
                    indefinite: None,
                    mark: None,
                    domain_here: false,
                });
            }
            t.lifetime = round;
            t.stats = Stats::default();
        }
        shared.killed.store(false, Ordering::SeqCst);
        shared.stop.store(false, Ordering::SeqCst);
        let mut handles = Vec::new();
        for t in std::mem::take(&mut tasks) {
            let client = server.client().await;
            handles.push(tokio::spawn(run_task(t, client, Arc::clone(&shared))));
        }
        let run_for = Duration::from_millis(50 + below(&mut rng, 351));
        tokio::time::sleep(run_for).await;
        // Every fourth round lets the calls in flight finish first (transitions still run).
        let quiesce = round % 4 == 3;
        if quiesce {
            shared.stop.store(true, Ordering::SeqCst);
            for h in handles.drain(..) {
                tasks.push(h.await.expect("load task panicked"));
            }
        }
        shared.killed.store(true, Ordering::SeqCst);
        drop(c);
        sigkill(&mut server);
        for h in handles {
            tasks.push(h.await.expect("load task panicked"));
        }
        tasks.sort_by_key(|t| t.index);
        let mut stats = Stats::default();
        for t in &tasks {
            stats.add(t.stats);
        }

        server = boot(&args);
        c = server.client().await;
        let v = verify_restart(
            &mut c,
            &mut tasks,
            &mut parked,
            &touched,
            &shared,
            head,
            stats.fresh,
            round + 1,
        )
        .await;
        head = v.head;
        total.add(stats);
        total_failed += v.failed_by_restart;
        total_applied += v.applied_indefinite;
        println!(
            "round {round:2}: kill after {:3} ms{}: acked {:3} (fresh {:3}, retries {:2}, \
             across restart {:2}), rejected probes {:2}, indefinite {} (applied {}), \
             failed-by-restart {}, parked {} (total {}), head {head}, {} ms",
            run_for.as_millis(),
            if quiesce { " (calls drained)" } else { "" },
            stats.fresh + stats.retries,
            stats.fresh,
            stats.retries,
            stats.cross_restart_retries,
            stats.probes,
            stats.indefinite,
            v.applied_indefinite,
            v.failed_by_restart,
            v.parked_now,
            parked.len(),
            round_started.elapsed().as_millis()
        );
    }
    println!(
        "total: {} fresh, {} retries ({} across a restart), {} probes, {} indefinite \
         ({total_applied} applied), {total_failed} failed by restart, {} op ids, {:.1} s",
        total.fresh,
        total.retries,
        total.cross_restart_retries,
        total.probes,
        total.indefinite,
        shared.ops.lock().unwrap().len(),
        started.elapsed().as_secs_f64()
    );
    // Non-vacuity: the kills really landed mid-traffic and the checks had work to do.
    assert!(
        total.fresh >= 10 * LOAD_ROUNDS as u64,
        "too little traffic: {total:?}"
    );
    assert!(
        total.retries > 0 && total.cross_restart_retries > 0,
        "no retries: {total:?}"
    );
    assert!(total.indefinite > 0, "no call was ever cut off by a kill");
    assert!(total_failed > 0, "no transition was ever cut off by a kill");
}

// ---------------------------------------------------------------------------------------
// 5. Cursors taken mid-traffic
// ---------------------------------------------------------------------------------------

/// A shard that keeps a List view and its cursor must never miss a change. After a SIGKILL
/// mid-traffic and a restart, for a cursor the provider served before the kill:
/// - every machine whose record differs from the pre-kill List view is in
///   `List(since = that view's revision)`;
/// - every machine the restart recovered to FAILED is in the delta from any pre-kill cursor
///   (no pre-kill List can have shown it FAILED);
/// - a change made after the restart is in the delta too (the counter did not fall back
///   below a cursor already handed out).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn list_cursor_taken_mid_traffic_misses_nothing_after_restart() {
    const SEEDS: usize = 256;
    const ROUNDS: usize = 20;
    let mut rng = seeded_rng("list_cursor_mid_traffic", 0x0C05_0502);
    let dir = tempfile::tempdir().expect("temp dir");
    let args = lane_args(&dir.path().join("cursor-load.redb"), SEEDS, &[]);
    let mut server = boot(&args);
    let mut c = server.client().await;
    let mut free: Vec<String> = list_all(&mut c)
        .await
        .machines
        .into_iter()
        .map(|m| m.id)
        .collect();
    free.sort();
    free.reverse();
    let mut pools: Vec<Vec<String>> = vec![Vec::new(); LOAD_TASKS];
    let mut known_failed: BTreeSet<String> = BTreeSet::new();
    let mut misses = Vec::new();
    for round in 0..ROUNDS {
        for pool in &mut pools {
            while pool.len() < 3 {
                pool.push(free.pop().expect("enough slots"));
            }
        }
        let killed = Arc::new(AtomicBool::new(false));
        let mut churn = Vec::new();
        for pool in pools.clone() {
            let (killed, mut c) = (Arc::clone(&killed), server.client().await);
            churn.push(tokio::spawn(async move {
                let mut n = 0usize;
                while !killed.load(Ordering::SeqCst) {
                    let id = &pool[n % pool.len()];
                    n += 1;
                    let Ok(m) = get(&mut c, id).await else { break };
                    // Create/Delete only: the fake keeps no domains across restarts.
                    let _ = match state(&m) {
                        S::Speculative => create(&mut c, id, None).await,
                        S::Idle => delete(&mut c, id, None).await,
                        _ => {
                            tokio::time::sleep(Duration::from_millis(1)).await;
                            continue;
                        }
                    };
                }
            }));
        }
        // The lister alternates full Lists (a view and its cursor) and one-record Lists (a
        // cursor only, served fast). Once armed it fires the kill the moment its next List
        // is served, so the cursors are as fresh as possible when the process dies.
        let full_view: Arc<Mutex<Option<pb::MachineList>>> = Arc::default();
        let last_cursor: Arc<Mutex<Option<Vec<u8>>>> = Arc::default();
        let armed = Arc::new(AtomicBool::new(false));
        let (fire, fired) = tokio::sync::oneshot::channel::<()>();
        let lister = {
            let (killed, armed, mut c) = (
                Arc::clone(&killed),
                Arc::clone(&armed),
                server.client().await,
            );
            let (full_view, last_cursor) = (Arc::clone(&full_view), Arc::clone(&last_cursor));
            tokio::spawn(async move {
                let mut fire = Some(fire);
                let mut n = 0u64;
                while !killed.load(Ordering::SeqCst) {
                    n += 1;
                    let full = n % 2 == 1;
                    let filter = pb::ListFilter {
                        max_results: if full { 0 } else { 1 },
                        ..Default::default()
                    };
                    let Ok(r) = c.list(filter).await else { break };
                    let r = r.into_inner();
                    *last_cursor.lock().unwrap() = Some(r.revision.clone());
                    if full {
                        *full_view.lock().unwrap() = Some(r);
                    }
                    if armed.load(Ordering::SeqCst) && !full {
                        if let Some(fire) = fire.take() {
                            let _ = fire.send(());
                        }
                    }
                }
            })
        };
        tokio::time::sleep(Duration::from_millis(80 + below(&mut rng, 221))).await;
        armed.store(true, Ordering::SeqCst);
        tokio::time::timeout(Duration::from_secs(10), fired)
            .await
            .expect("the lister serves a List")
            .expect("the lister fires");
        killed.store(true, Ordering::SeqCst);
        sigkill(&mut server);
        for h in churn {
            h.await.expect("churn task");
        }
        lister.await.expect("lister");
        let view = full_view
            .lock()
            .unwrap()
            .take()
            .expect("a full List before the kill");
        let cursor = last_cursor
            .lock()
            .unwrap()
            .take()
            .expect("a cursor before the kill");

        server = boot(&args);
        c = server.client().await;
        let now = list_all(&mut c).await;
        let show = |r: &[u8]| String::from_utf8_lossy(r).into_owned();
        // The full view's delta covers every record that differs from the view.
        let delta = list(&mut c, &[], 0, &view.revision).await;
        let in_delta: BTreeSet<&str> = delta.machines.iter().map(|m| m.id.as_str()).collect();
        let before: BTreeMap<&str, &pb::Machine> =
            view.machines.iter().map(|m| (m.id.as_str(), m)).collect();
        let mut changed = 0;
        for m in &now.machines {
            let old = before.get(m.id.as_str()).map(|o| durable_view(o));
            if old.as_ref() != Some(&durable_view(m)) {
                changed += 1;
                if !in_delta.contains(m.id.as_str()) {
                    misses.push(format!(
                        "round {round}: {} was {:?} in the List at revision {}, is {:?} after \
                         the restart (head {}), but List(since={}) omits it",
                        m.id,
                        old.map(|o| o.0),
                        show(&view.revision),
                        state(m),
                        show(&now.revision),
                        show(&view.revision),
                    ));
                }
            }
        }
        // Every newly recovered machine is in the delta from the freshest cursor.
        let recovered: Vec<&pb::Machine> = now
            .machines
            .iter()
            .filter(|m| state(m) == S::Failed && !known_failed.contains(&m.id))
            .collect();
        let late = list(&mut c, &[], 0, &cursor).await;
        let in_late: BTreeSet<&str> = late.machines.iter().map(|m| m.id.as_str()).collect();
        for m in &recovered {
            if !in_late.contains(m.id.as_str()) {
                misses.push(format!(
                    "round {round}: {} was recovered to FAILED ({:?}) by the restart (head {}), \
                     but List(since={}) with a cursor served before the kill omits it",
                    m.id,
                    m.last_error,
                    show(&now.revision),
                    show(&cursor),
                ));
            }
        }
        // A change after the restart is visible from both pre-kill cursors.
        let probe = now
            .machines
            .iter()
            .find(|m| state(m) == S::Speculative && free.contains(&m.id))
            .map(|m| m.id.clone())
            .expect("a free slot");
        free.retain(|id| *id != probe);
        create(&mut c, &probe, None)
            .await
            .expect("post-restart Create");
        for old in [&view.revision, &cursor] {
            let after = list(&mut c, &[], 0, old).await;
            if !after.machines.iter().any(|m| m.id == probe) {
                misses.push(format!(
                    "round {round}: the post-restart Create on {probe} is missing from \
                     List(since={}) (head now {}): the counter fell back below a served cursor",
                    show(old),
                    show(&after.revision),
                ));
            }
        }
        println!(
            "round {round:2}: view cursor {} / last cursor {} → head {}, {changed} changed, \
             {} recovered, delta {} / {}, misses so far {}",
            show(&view.revision),
            show(&cursor),
            show(&now.revision),
            recovered.len(),
            delta.machines.len(),
            late.machines.len(),
            misses.len()
        );
        known_failed.extend(recovered.iter().map(|m| m.id.clone()));
        for pool in &mut pools {
            pool.retain(|id| !known_failed.contains(id));
        }
    }
    assert!(
        misses.is_empty(),
        "a delta consumer missed changes:\n{}",
        misses.join("\n")
    );
}

// ---------------------------------------------------------------------------------------
// 6. Restored machines continue their lifecycle
// ---------------------------------------------------------------------------------------

/// Polls until `want` or FAILED; FAILED is a failure showing last_error.
async fn reach_or_fail(c: &mut Client, id: &str, want: S) -> pb::Machine {
    let start = Instant::now();
    loop {
        let m = get(c, id).await.expect("Get");
        assert_ne!(
            state(&m),
            S::Failed,
            "{id} FAILED instead of reaching {want:?}: {:?}",
            m.last_error
        );
        if state(&m) == want {
            return m;
        }
        assert!(start.elapsed() < WALK, "{id} did not reach {want:?}: {m:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// After a restart an Idle machine can still be configured and a Configured one drained:
/// the restored records must be usable, not only readable.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn restored_machines_continue_their_lifecycle() {
    let dir = tempfile::tempdir().expect("temp dir");
    let args = lane_args(&dir.path().join("restored.redb"), 16, &[]);
    let mut server = boot(&args);
    let mut c = server.client().await;
    let idle = walk_to_idle(&server, &mut c).await;
    let bound = walk_to_configured(&server, &mut c, "restored", &[("r/k", "v")]).await;
    sigkill(&mut server);

    let server = boot(&args);
    let mut c = server.client().await;
    configure(&mut c, &idle, "after-restart", &[("a/k", "v")], None)
        .await
        .expect("Configure on a restored Idle machine");
    let m = reach_or_fail(&mut c, &idle, S::Configured).await;
    assert_eq!(m.cluster, "after-restart");
    drain(&mut c, &bound, 5, None)
        .await
        .expect("Drain on a restored Configured machine");
    let m = reach_or_fail(&mut c, &bound, S::Idle).await;
    assert!(m.cluster.is_empty() && m.shard_metadata.is_empty());
    delete(&mut c, &bound, None).await.expect("Delete");
    reach_or_fail(&mut c, &bound, S::Speculative).await;
}
