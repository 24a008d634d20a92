//! The conformance vocabulary: requests, picks, walks and state polling.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bigfleet_libvirt_proto::v1alpha1 as pb;
use pb::MachineState as S;
use tonic::Code;

use super::Server;
pub use super::process::Client;

/// The label that marks fault slots (`--fake-fault-hooks`).
pub const FAULT_LABEL: &str = "conformance.fault/create";

/// A fencing token: (shard, epoch, sequence). `None` sends the all-zero (unfenced) token.
pub type Token = Option<(String, i64, i64)>;

/// A shard id no other test uses.
pub fn unique_shard(prefix: &str) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!(
        "conf-{prefix}-{nanos}-{}",
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

/// A fenced token for `shard`.
pub fn tok(shard: &str, epoch: i64, sequence: i64) -> Token {
    Some((shard.to_owned(), epoch, sequence))
}

fn split(token: Token) -> (String, i64, i64) {
    token.unwrap_or_default()
}

/// Create.
pub async fn create(
    c: &mut Client,
    id: &str,
    token: Token,
) -> Result<pb::TransitionAck, tonic::Status> {
    let (shard_id, shard_epoch, sequence_number) = split(token);
    let request = pb::CreateRequest {
        machine_id: id.to_owned(),
        shard_id,
        shard_epoch,
        sequence_number,
    };
    c.create(request).await.map(tonic::Response::into_inner)
}

/// Configure with a cluster, metadata pairs and the harness blob.
pub async fn configure(
    c: &mut Client,
    id: &str,
    cluster: &str,
    metadata: &[(&str, &str)],
    token: Token,
) -> Result<pb::TransitionAck, tonic::Status> {
    let md = metadata
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    configure_map(c, id, cluster, md, b"# conformance\n".to_vec(), token).await
}

/// Configure with an owned metadata map and blob.
pub async fn configure_map(
    c: &mut Client,
    id: &str,
    cluster: &str,
    shard_metadata: std::collections::HashMap<String, String>,
    bootstrap_blob: Vec<u8>,
    token: Token,
) -> Result<pb::TransitionAck, tonic::Status> {
    let (shard_id, shard_epoch, sequence_number) = split(token);
    let request = pb::ConfigureRequest {
        machine_id: id.to_owned(),
        cluster_id: cluster.to_owned(),
        bootstrap_blob,
        shard_id,
        shard_epoch,
        sequence_number,
        shard_metadata,
    };
    c.configure(request).await.map(tonic::Response::into_inner)
}

/// Drain.
pub async fn drain(
    c: &mut Client,
    id: &str,
    grace: i64,
    token: Token,
) -> Result<pb::TransitionAck, tonic::Status> {
    let (shard_id, shard_epoch, sequence_number) = split(token);
    let request = pb::DrainRequest {
        machine_id: id.to_owned(),
        grace_period_seconds: grace,
        shard_id,
        shard_epoch,
        sequence_number,
    };
    c.drain(request).await.map(tonic::Response::into_inner)
}

/// Delete.
pub async fn delete(
    c: &mut Client,
    id: &str,
    token: Token,
) -> Result<pb::TransitionAck, tonic::Status> {
    let (shard_id, shard_epoch, sequence_number) = split(token);
    let request = pb::DeleteRequest {
        machine_id: id.to_owned(),
        shard_id,
        shard_epoch,
        sequence_number,
    };
    c.delete(request).await.map(tonic::Response::into_inner)
}

/// Get.
pub async fn get(c: &mut Client, id: &str) -> Result<pb::Machine, tonic::Status> {
    c.get(pb::MachineRef { id: id.to_owned() })
        .await
        .map(tonic::Response::into_inner)
}

/// List with a filter.
pub async fn list(c: &mut Client, states: &[S], max: i32, since: &[u8]) -> pb::MachineList {
    let filter = pb::ListFilter {
        states: states.iter().map(|s| *s as i32).collect(),
        max_results: max,
        since_revision: since.to_vec(),
    };
    c.list(filter).await.expect("List never fails").into_inner()
}

/// Unfiltered List.
pub async fn list_all(c: &mut Client) -> pb::MachineList {
    list(c, &[], 0, b"").await
}

/// The code of a result (`Ok` for success).
pub fn code<T>(result: &Result<T, tonic::Status>) -> Code {
    result
        .as_ref()
        .map_or_else(tonic::Status::code, |_| Code::Ok)
}

/// The machine's state.
pub fn state(m: &pb::Machine) -> S {
    S::try_from(m.state).unwrap_or(S::Unspecified)
}

/// Whether the host is present and names something.
pub fn host_set(m: &pb::Machine) -> bool {
    m.host
        .as_ref()
        .is_some_and(|h| !h.provider.is_empty() || !h.r#ref.is_empty())
}

/// Picks `n` distinct unclaimed Speculative machines without the fault label.
pub async fn pick_n(server: &Server, c: &mut Client, n: usize) -> Vec<String> {
    let all = list(c, &[S::Speculative], 0, b"").await.machines;
    let mut claimed = server.claimed.lock().unwrap();
    let picked: Vec<String> = all
        .into_iter()
        .filter(|m| !m.labels.contains_key(FAULT_LABEL))
        .map(|m| m.id)
        .filter(|id| !claimed.contains(id))
        .take(n)
        .collect();
    assert_eq!(
        picked.len(),
        n,
        "not enough Speculative machines to pick {n}"
    );
    claimed.extend(picked.iter().cloned());
    picked
}

/// The first machine of `List(SPECULATIVE, max_results=1)`, the way BigFleet's own tooling
/// picks a slot: no de-duplication, so consecutive picks differ only because the provider
/// spreads capped Lists.
pub async fn capped_pick(c: &mut Client) -> String {
    let page = list(c, &[S::Speculative], 1, b"").await;
    assert_eq!(page.machines.len(), 1, "a capped pick returns one machine");
    assert_eq!(state(&page.machines[0]), S::Speculative);
    page.machines[0].id.clone()
}

/// Picks one unclaimed Speculative machine.
pub async fn pick(server: &Server, c: &mut Client) -> String {
    pick_n(server, c, 1).await.remove(0)
}

/// Polls Get every 20 ms until the machine is in `want`; panics with the last state after
/// `timeout` (stretched on real libvirtd, `backend::stretch`).
pub async fn reach(c: &mut Client, id: &str, want: S, timeout: Duration) -> pb::Machine {
    let timeout = super::backend::stretch(timeout);
    let start = Instant::now();
    loop {
        if let Ok(m) = get(c, id).await {
            if state(&m) == want {
                super::timing::seen(&format!("reach {want:?}"), start.elapsed(), timeout);
                return m;
            }
            if start.elapsed() > timeout {
                panic!("{id} did not reach {want:?} within {timeout:?}; last seen {m:?}");
            }
        } else if start.elapsed() > timeout {
            panic!("{id} did not reach {want:?} within {timeout:?}; Get kept failing");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Reads the machine every 20 ms for `window`, the first read at once; panics if a read shows a
/// state other than `want`, and if any Get fails (upstream's rule: a window in which the
/// machine cannot be read proves nothing).
pub async fn stays_in(c: &mut Client, id: &str, want: S, window: Duration) {
    poll_window(c, id, window, |m| {
        assert_eq!(state(m), want, "{id} left {want:?}: {m:?}");
    })
    .await;
}

/// Reads the machine every 20 ms for `window`, the first read at once; panics if a read ever
/// shows `never`, and if any Get fails.
pub async fn never_reaches(c: &mut Client, id: &str, never: S, window: Duration) {
    poll_window(c, id, window, |m| {
        assert_ne!(state(m), never, "{id} reached {never:?}: {m:?}");
    })
    .await;
}

/// Gets the machine at once and then every 20 ms until `window` has passed, handing each
/// read to `check`; a failed Get fails the caller.
pub async fn poll_window(
    c: &mut Client,
    id: &str,
    window: Duration,
    mut check: impl FnMut(&pb::Machine),
) {
    let start = Instant::now();
    let mut reads = 0;
    loop {
        let m = get(c, id).await.unwrap_or_else(|e| {
            panic!("Get {id} failed after {reads} reads of a {window:?} window: {e:?}")
        });
        check(&m);
        reads += 1;
        if start.elapsed() >= window {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Samples Get every 1 ms until `until`, returning the de-duplicated trace of states.
pub async fn trace_until(c: &mut Client, id: &str, until: S, timeout: Duration) -> Vec<S> {
    let timeout = super::backend::stretch(timeout);
    let start = Instant::now();
    let mut trace: Vec<S> = Vec::new();
    loop {
        if let Ok(m) = get(c, id).await {
            let s = state(&m);
            if trace.last() != Some(&s) {
                trace.push(s);
            }
            if s == until {
                super::timing::seen(&format!("trace to {until:?}"), start.elapsed(), timeout);
                return trace;
            }
        }
        assert!(
            start.elapsed() < timeout,
            "{id} did not reach {until:?}; trace {trace:?}"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// The default settle time for walks.
pub const SETTLE: Duration = Duration::from_secs(15);

/// Picks a machine and walks it to Idle with an unfenced Create.
pub async fn walk_to_idle(server: &Server, c: &mut Client) -> String {
    let id = pick(server, c).await;
    create(c, &id, None).await.expect("Create accepted");
    reach(c, &id, S::Idle, SETTLE).await;
    id
}

/// Walks a machine to Configured with `cluster` and `metadata`.
pub async fn walk_to_configured(
    server: &Server,
    c: &mut Client,
    cluster: &str,
    metadata: &[(&str, &str)],
) -> String {
    let id = walk_to_idle(server, c).await;
    configure(c, &id, cluster, metadata, None)
        .await
        .expect("Configure accepted");
    reach(c, &id, S::Configured, SETTLE).await;
    id
}

/// Metadata pairs as a map, for comparisons.
pub fn md(pairs: &[(&str, &str)]) -> std::collections::HashMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

/// Checks that a mutating call was accepted, waits up to `within` for `want`, and returns the
/// machine and the time since `start` (when the call was sent). Each tier passes its own
/// limit (a TCG boot of the real image takes minutes, the tier's small guest seconds).
pub async fn settle(
    c: &mut Client,
    id: &str,
    accepted: Result<pb::TransitionAck, tonic::Status>,
    want: S,
    within: Duration,
    start: Instant,
) -> (pb::Machine, Duration) {
    accepted.unwrap_or_else(|e| panic!("the call towards {want:?} was refused: {e}"));
    let machine = reach(c, id, want, within).await;
    (machine, start.elapsed())
}
