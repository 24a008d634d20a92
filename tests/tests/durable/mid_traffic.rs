//! Part 5: Cursors taken mid-traffic: a List cursor served before a SIGKILL misses no change
//! after the restart.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bigfleet_libvirt_proto::v1alpha1 as pb;
use pb::MachineState as S;

use super::*;
use crate::harness::*;

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
