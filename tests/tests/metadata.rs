//! Metadata (docs/conformance.md §3.5, B501–B505): `shard_metadata` is stored and echoed byte for
//! byte — NUL and control bytes, unicode, empty values, NUL inside a key — set at Configure
//! accept, cleared with the cluster when a Drain completes, never truncated.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use bigfleet_libvirt_proto::v1alpha1 as pb;
use pb::MachineState as S;
use tonic::Code;

use crate::harness::*;

type Map = HashMap<String, String>;

/// The deadline the extension suite uses for B503's large binding.
const LARGE_SETTLE: Duration = Duration::from_secs(30);

/// The exact hostile 55-key map of B501.
fn hostile_map() -> Map {
    let mut m = Map::new();
    let mut put = |k: &str, v: &str| {
        assert!(
            m.insert(k.to_owned(), v.to_owned()).is_none(),
            "duplicate key {k:?}"
        );
    };
    put("bigfleet.lucy.sh/assigned-priority", "1000000");
    put(
        "bigfleet.lucy.sh/assigned-group",
        "topology.bigfleet/rack\0gang-7",
    );
    put("x-unicode/value", "παντα ρει — 你好 — 🚀\t\n");
    put("x-empty/value", "");
    put("x-control/value", "\x00\x01\x02\x1F\x7F");
    put("x-c1-control/value", "\u{0085}");
    put("x-nul-only/value", "\0");
    put("x-trailing-space/value", "padded   ");
    put("x-key-with-nul\0suffix", "key itself carries a NUL byte");
    put("x-mixed/value", "a\0b\x01c\tπ\n你🚀");
    for n in 10..=54 {
        put(
            &format!("x-bulk/key-{n:03}-παδ"),
            &format!("v-{n}-\0-你好🚀"),
        );
    }
    m
}

/// Panics unless `got` is exactly `want`, naming missing, extra and differing keys.
fn assert_map_eq(got: &Map, want: &Map, what: &str) {
    if got == want {
        return;
    }
    let missing: Vec<_> = want.keys().filter(|k| !got.contains_key(*k)).collect();
    let extra: Vec<_> = got.keys().filter(|k| !want.contains_key(*k)).collect();
    let differ: Vec<_> = want
        .iter()
        .filter_map(|(k, v)| got.get(k).filter(|g| *g != v).map(|g| (k, v, g)))
        .collect();
    panic!(
        "{what}: metadata differs ({} keys, want {}): missing {missing:?}, extra {extra:?}, \
         differing (key, want, got) {differ:?}",
        got.len(),
        want.len()
    );
}

/// Walks a fresh machine to Idle, configures it with an owned map and waits for CONFIGURED.
async fn configure_and_settle(
    server: &Server,
    c: &mut Client,
    cluster: &str,
    map: Map,
    timeout: Duration,
) -> (String, pb::Machine) {
    let id = walk_to_idle(server, c).await;
    configure_map(c, &id, cluster, map, b"# conformance\n".to_vec(), None)
        .await
        .expect("Configure accepted");
    let m = reach(c, &id, S::Configured, timeout).await;
    (id, m)
}

/// B501: a hostile 55-key map (NUL inside a key and in values, C0/C1 control bytes, unicode,
/// an empty value, trailing spaces) is echoed exactly by four Gets, every read identical to
/// the first, and by List(CONFIGURED) on a separate connection.
#[tokio::test]
async fn b501_hostile_map_is_echoed_byte_for_byte_on_get_and_list() {
    let server = core();
    let mut c = server.client().await;
    let want = hostile_map();
    assert_eq!(want.len(), 55, "the B501 map has 55 keys");
    let (id, _) = configure_and_settle(&server, &mut c, "conf-b501", want.clone(), SETTLE).await;

    let mut first: Option<Map> = None;
    for read in 1..=4 {
        let m = get(&mut c, &id).await.expect("Get");
        assert_eq!(state(&m), S::Configured);
        assert_eq!(m.cluster, "conf-b501");
        assert_eq!(m.shard_metadata.len(), 55, "read {read}: key count");
        assert_map_eq(&m.shard_metadata, &want, &format!("Get #{read}"));
        match &first {
            None => first = Some(m.shard_metadata),
            Some(f) => assert_eq!(
                &m.shard_metadata, f,
                "read {read} differs from the first read"
            ),
        }
    }

    // A separate HTTP/2 connection (256 MiB receive limit, above the suite's 128 MiB).
    let mut other = server.client().await;
    let listed = list(&mut other, &[S::Configured], 0, b"").await;
    let hit: Vec<_> = listed.machines.iter().filter(|m| m.id == id).collect();
    assert_eq!(hit.len(), 1, "{id} listed exactly once in List(CONFIGURED)");
    assert_map_eq(&hit[0].shard_metadata, &want, "List(CONFIGURED)");
}

/// B502: Drain clears cluster and metadata together; a later binding carries exactly the new
/// map and cluster, with no key left over from the old binding.
#[tokio::test]
async fn b502_drain_clears_binding_and_a_rebind_shows_no_old_keys() {
    let server = core();
    let mut c = server.client().await;
    let old = md(&[
        ("old.key/a", "1"),
        ("old.key/b", "2"),
        ("old.key/nul", "x\0y"),
    ]);
    let (id, _) = configure_and_settle(&server, &mut c, "conf-b502-old", old.clone(), SETTLE).await;
    let m = get(&mut c, &id).await.expect("Get");
    assert_map_eq(&m.shard_metadata, &old, "old binding");
    assert_eq!(m.cluster, "conf-b502-old");

    drain(&mut c, &id, 5, None).await.expect("Drain accepted");
    let idle = reach(&mut c, &id, S::Idle, SETTLE).await;
    assert!(
        idle.shard_metadata.is_empty(),
        "metadata left at Idle: {:?}",
        idle.shard_metadata
    );
    assert_eq!(idle.cluster, "", "cluster left at Idle");

    let new = md(&[("new.key/x", "10"), ("new.key/y", "20")]);
    configure_map(
        &mut c,
        &id,
        "conf-b502-new",
        new.clone(),
        b"# conformance\n".to_vec(),
        None,
    )
    .await
    .expect("second Configure accepted");
    let m = reach(&mut c, &id, S::Configured, SETTLE).await;
    assert_map_eq(&m.shard_metadata, &new, "new binding");
    assert!(
        !m.shard_metadata.keys().any(|k| k.starts_with("old.key/")),
        "an old key survived"
    );
    assert_eq!(m.cluster, "conf-b502-new");
}

/// B503: a 256-key map of 8 KiB values (about 2 MiB) is either echoed exactly or rejected
/// with INVALID_ARGUMENT leaving the machine Idle and unbound — never truncated. This
/// provider documents no cap, so it must take the echo branch.
#[tokio::test]
async fn b503_oversize_map_is_echoed_exactly_never_truncated() {
    let server = core();
    let mut c = server.client().await;
    let filler: String = (b'a'..=b'z')
        .cycle()
        .take(8 * 1024)
        .map(char::from)
        .collect();
    let want: Map = (0..256)
        .map(|i| (format!("x-oversize/key-{i:04}"), filler.clone()))
        .collect();
    assert_eq!(want.len(), 256);
    let id = walk_to_idle(&server, &mut c).await;

    let result = configure_map(
        &mut c,
        &id,
        "conf-b503",
        want.clone(),
        b"# conformance\n".to_vec(),
        None,
    )
    .await;
    match code(&result) {
        Code::Ok => {
            reach(&mut c, &id, S::Configured, LARGE_SETTLE).await;
            let m = get(&mut c, &id).await.expect("Get");
            assert_eq!(m.shard_metadata.len(), 256, "key count after Configure");
            assert_map_eq(&m.shard_metadata, &want, "oversize binding");
            drain(&mut c, &id, 0, None)
                .await
                .expect("cleanup Drain accepted");
            reach(&mut c, &id, S::Idle, LARGE_SETTLE).await;
        }
        Code::InvalidArgument => {
            let m = get(&mut c, &id).await.expect("Get");
            assert_eq!(
                state(&m),
                S::Idle,
                "a rejected Configure left {:?}",
                state(&m)
            );
            stays_in(&mut c, &id, S::Idle, Duration::from_millis(300)).await;
            let m = get(&mut c, &id).await.expect("Get");
            assert!(
                m.shard_metadata.is_empty(),
                "a rejected Configure stored metadata"
            );
            panic!("this provider documents no metadata cap, yet rejected 2 MiB: {result:?}");
        }
        other => {
            panic!("oversize Configure: want OK or INVALID_ARGUMENT, got {other:?}: {result:?}")
        }
    }
}

/// The core profile with slower fake latencies (150–300 ms), so that B504's 1 ms sampling
/// reliably lands inside the CONFIGURING window.
fn core_slow() -> Server {
    crate::harness::profiles::slowed("150ms", "300ms")
}

/// B504: metadata is visible from Configure accept: the ack and every CONFIGURING snapshot
/// seen by 1 ms sampling carry the exact map (and the cluster); once CONFIGURED the map is
/// still exact. With 150–300 ms fake latencies the CONFIGURING window must be sampled.
#[tokio::test]
async fn b504_metadata_is_visible_while_configuring() {
    let server = core_slow();
    let mut c = server.client().await;
    let want = md(&[
        ("b504/early", "must-be-visible-mid-flight"),
        ("b504/nul", "x\0y"),
        ("b504/unicode", "你好🚀"),
    ]);
    let id = walk_to_idle(&server, &mut c).await;
    let ack = configure_map(
        &mut c,
        &id,
        "conf-b504",
        want.clone(),
        b"# conformance\n".to_vec(),
        None,
    )
    .await
    .expect("Configure accepted");
    let snapshot = ack.machine.expect("the ack carries a snapshot");
    assert_eq!(state(&snapshot), S::Configuring, "ack snapshot state");
    assert_map_eq(&snapshot.shard_metadata, &want, "ack snapshot");
    assert_eq!(snapshot.cluster, "conf-b504", "ack snapshot cluster");

    let start = Instant::now();
    let mut configuring_seen = 0usize;
    loop {
        if let Ok(m) = get(&mut c, &id).await {
            match state(&m) {
                S::Configuring => {
                    configuring_seen += 1;
                    assert_map_eq(&m.shard_metadata, &want, "a CONFIGURING snapshot");
                    assert_eq!(m.cluster, "conf-b504", "a CONFIGURING snapshot's cluster");
                }
                S::Configured => break,
                other => panic!("{id} went {other:?} while configuring: {m:?}"),
            }
        }
        assert!(
            start.elapsed() < SETTLE,
            "{id} did not reach CONFIGURED within {SETTLE:?}"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    eprintln!("b504: {configuring_seen} CONFIGURING snapshots sampled");
    assert!(
        configuring_seen > 0,
        "no CONFIGURING snapshot sampled in a 150 ms+ window"
    );
    let m = reach(&mut c, &id, S::Configured, SETTLE).await;
    assert_map_eq(&m.shard_metadata, &want, "CONFIGURED");
}

/// B505: the provider keeps its own copy of the map: after the client mutates, removes and
/// adds keys in its local map, two fresh Gets still return exactly the four original pairs.
#[tokio::test]
async fn b505_provider_keeps_its_own_copy_of_the_map() {
    let server = core();
    let mut c = server.client().await;
    let original = md(&[
        ("b505/keep", "original-value"),
        ("b505/mutate", "before-mutation"),
        ("b505/delete-me", "present"),
        ("b505/nul", "a\0b"),
    ]);
    let mut local = original.clone();
    let id = walk_to_idle(&server, &mut c).await;
    configure_map(
        &mut c,
        &id,
        "conf-b505",
        local.clone(),
        b"# conformance\n".to_vec(),
        None,
    )
    .await
    .expect("Configure accepted");
    reach(&mut c, &id, S::Configured, SETTLE).await;

    local.insert("b505/mutate".into(), "after-mutation".into());
    local.remove("b505/delete-me");
    local.insert("b505/added".into(), "late".into());
    assert_ne!(local, original);

    for read in 1..=2 {
        let m = get(&mut c, &id).await.expect("Get");
        assert_eq!(m.shard_metadata.len(), 4, "read {read}: key count");
        assert_map_eq(&m.shard_metadata, &original, &format!("fresh Get #{read}"));
    }
}

// B504 is not listed: it must sample a Configuring window of known length (the fake's
// 150-300 ms latencies); on the test driver a Configure takes a few milliseconds.
crate::harness::backend::on_test_driver!(
    b501_hostile_map_is_echoed_byte_for_byte_on_get_and_list,
    b502_drain_clears_binding_and_a_rebind_shows_no_old_keys,
    b503_oversize_map_is_echoed_exactly_never_truncated,
    b505_provider_keeps_its_own_copy_of_the_map,
);

crate::harness::backend::on_real_libvirtd!(
    b502_drain_clears_binding_and_a_rebind_shows_no_old_keys,
    b505_provider_keeps_its_own_copy_of_the_map,
);
