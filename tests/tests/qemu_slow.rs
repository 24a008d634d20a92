//! Issue 45 — a slow libvirtd: zone rackB's daemon is reached through a socket proxy the
//! test runs (`SlowSocket`), which holds every chunk the daemon sends for a set delay, so
//! each libvirt call on that zone answers late while the daemon itself is healthy; zone
//! rackA is reached directly. With replies held 3 s, a Create on rackB cannot finish its
//! sequence within a 30 s deadline. Checked:
//!
//! - the rackB Create ends Failed by its deadline (plus the deadline sweep's slack), with
//!   the timeout as its reason, never left Creating;
//! - meanwhile a whole cycle on rackA (Create, Configure, Drain, Delete) completes, each
//!   transition before the rackB Create gives up: a slow zone holds only its own calls (its
//!   time and the same cycle's with rackB idle are printed side by side);
//! - once the daemon answers promptly again, the timed-out Create's leftovers are gone (its
//!   compensating delete) and a new Create on rackB completes.
//!
//! Needs the real-QEMU tier (`#[ignore]`d in the ordinary suite; `scripts/qemu-tier/run.sh
//! ci` runs it).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bigfleet_libvirt_proto::v1alpha1 as pb;
use pb::MachineState as S;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{UnixListener, UnixStream};

use crate::harness::*;
use crate::qemu_zones::*;

/// Every transition's deadline in this test.
const DEADLINE: Duration = Duration::from_secs(30);
/// How long rackB's daemon's replies are held while it is slow.
const SLOW: Duration = Duration::from_secs(3);
/// The deadline sweep's slack: a transition is failed within about a second of its
/// deadline (docs/contract.md §5).
const SLACK: Duration = Duration::from_secs(3);

/// A unix socket that forwards to a libvirtd socket, holding each chunk the daemon sends
/// for the current delay (requests go through at once).
struct SlowSocket {
    path: PathBuf,
    delay_ms: Arc<AtomicU64>,
}

impl SlowSocket {
    fn start(dir: &Path, target: PathBuf) -> Self {
        let path = dir.join("slow-libvirt-sock");
        let listener = UnixListener::bind(&path).expect("bind the proxy socket");
        let delay_ms = Arc::new(AtomicU64::new(0));
        let delay = Arc::clone(&delay_ms);
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(daemon) = UnixStream::connect(&target).await else {
                    continue;
                };
                tokio::spawn(pipe(client, daemon, Arc::clone(&delay)));
            }
        });
        Self { path, delay_ms }
    }

    fn set(&self, delay: Duration) {
        let ms = u64::try_from(delay.as_millis()).unwrap();
        self.delay_ms.store(ms, Ordering::SeqCst);
    }

    /// The libvirt URI of the proxied daemon.
    fn uri(&self) -> String {
        format!("qemu+unix:///system?socket={}", self.path.display())
    }
}

/// Requests straight to the daemon; its replies held for the delay, chunk by chunk.
async fn pipe(client: UnixStream, daemon: UnixStream, delay_ms: Arc<AtomicU64>) {
    let (mut from_client, mut to_client) = client.into_split();
    let (mut from_daemon, mut to_daemon) = daemon.into_split();
    tokio::spawn(async move {
        let _ = tokio::io::copy(&mut from_client, &mut to_daemon).await;
        let _ = to_daemon.shutdown().await;
    });
    let mut buffer = vec![0u8; 64 * 1024];
    loop {
        let n = match from_daemon.read(&mut buffer).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let held = delay_ms.load(Ordering::SeqCst);
        if held > 0 {
            tokio::time::sleep(Duration::from_millis(held)).await;
        }
        if to_client.write_all(&buffer[..n]).await.is_err() {
            break;
        }
    }
}

/// The socket path in a `qemu+unix:///system?socket=PATH` URI.
fn socket_of(uri: &str) -> PathBuf {
    let (_, path) = uri.split_once("socket=").expect("a unix socket URI");
    PathBuf::from(path)
}

/// One full cycle of `id`; the time each transition took.
async fn cycle(c: &mut Client, id: &str) -> [Duration; 4] {
    let mut took = [Duration::ZERO; 4];
    let start = Instant::now();
    create(c, id, None).await.expect("Create accepted");
    reach(c, id, S::Idle, BOOT).await;
    took[0] = start.elapsed();
    let start = Instant::now();
    configure(c, id, "slow-cluster", &[], None)
        .await
        .expect("Configure accepted");
    reach(c, id, S::Configured, BOOT).await;
    took[1] = start.elapsed();
    let start = Instant::now();
    drain(c, id, 5, None).await.expect("Drain accepted");
    reach(c, id, S::Idle, BOOT).await;
    took[2] = start.elapsed();
    let start = Instant::now();
    delete(c, id, None).await.expect("Delete accepted");
    reach(c, id, S::Speculative, BOOT).await;
    took[3] = start.elapsed();
    took
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the real-QEMU tier: run scripts/qemu-tier/run.sh ci"]
async fn a_slow_daemon_fails_its_own_calls_by_their_deadline_and_slows_no_other_zone() {
    let mut tier = Tier::from_env();
    let dir = tempfile::tempdir().unwrap();
    let proxy = SlowSocket::start(dir.path(), socket_of(&tier.b.uri));
    let direct_b = tier.b.uri.clone();
    tier.b.uri = proxy.uri();
    let deadline = format!("--transition-timeout={}s", DEADLINE.as_secs());
    let label = format!("slow{}", std::process::id());
    let extra = [deadline.as_str(), "--reconcile-interval=5s"];
    let server = tier.provider(dir.path(), &label, (2, 2), &extra);
    let mut c = server.client().await;
    let (a, b) = (ids_in(&mut c, "rackA").await, ids_in(&mut c, "rackB").await);
    assert_eq!((a.len(), b.len()), (2, 2), "{a:?} {b:?}");

    let direct = Libvirt::open(
        &tier,
        &Zone {
            uri: direct_b,
            ..tier.b.clone()
        },
    );
    let before = (direct.domains(), direct.volumes());
    let alone = cycle(&mut c, &a[0]).await;
    proxy.set(SLOW);
    let sent = Instant::now();
    create(&mut c, &b[0], None).await.expect("Create accepted");
    let mut other = server.client().await;
    let beside = cycle(&mut other, &a[1]).await;
    let cycled = sent.elapsed();
    let failed = reach(&mut c, &b[0], S::Failed, DEADLINE + SLACK).await;
    let gave_up = sent.elapsed();
    println!(
        "slow: rackA's cycle (create, configure, drain, delete) alone {alone:?}, beside the slow \
         rackB {beside:?}; the rackB Create Failed {gave_up:?} after it was sent: {}",
        failed.last_error
    );
    assert!(
        failed
            .last_error
            .contains("create transition timed out after 30s"),
        "{}",
        failed.last_error
    );
    assert!(
        cycled < gave_up,
        "rackA's whole cycle ({cycled:?}) ended before the slow zone's Create gave up \
         ({gave_up:?})"
    );

    proxy.set(Duration::ZERO);
    let left = |host: &Libvirt| (host.domains(), host.volumes());
    let cleaned = until("the timed-out Create's leftovers are removed", BOOT, || {
        left(&direct) == before
    })
    .await;
    println!("slow: the compensating delete left rackB as it was {cleaned:?} after the delay went");
    create(&mut c, &b[1], None).await.expect("Create accepted");
    let idle = reach(&mut c, &b[1], S::Idle, BOOT).await;
    let name = domain_name(&idle);
    assert!(
        direct.domain(&name).is_some(),
        "the new Create made its domain"
    );
    delete(&mut c, &b[1], None).await.expect("Delete accepted");
    reach(&mut c, &b[1], S::Speculative, BOOT).await;
}
