//! Issue 37 — one hung libvirt host must not take the process down. Each scenario runs the
//! `bigfleet-libvirt` binary over two zones: zone `a` is a private libvirtd (its own socket,
//! run as `nobody`, serving libvirt's test driver from a node file), zone `b` the test driver
//! in process. Under a Create/Delete load on both zones, zone a's daemon is stopped (SIGSTOP)
//! for 10, 20, 25 and 30 s and resumed; in a fifth scenario it is SIGKILLed with calls in
//! flight and a new daemon takes its socket. Throughout, the process stays up and zone b
//! keeps completing cycles; once the host is back, zone a is healthy again within the
//! reconnect bound and completes Create/Delete cycles, and no machine is left in a
//! transitional state.
//!
//! The five scenarios run side by side (each with its own daemon and provider), so the
//! module costs about one hang of wall time. Before the fix, a hang longer than libvirt's
//! keepalive window (5 s × 3 misses) crashed the provider with SIGSEGV inside libvirt's
//! client in most runs (docs/libvirt.md §2.3 says why and how the provider avoids it).

use std::collections::VecDeque;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bigfleet_libvirt_libvirt::fixture::Fixture;
use bigfleet_libvirt_proto::v1alpha1 as pb;
use pb::MachineState as S;

use crate::harness::logs::lines_of;
use crate::harness::*;

/// The uid and gid the private daemon runs as (`nobody`), so it runs libvirt's session
/// daemon with every path under its own directory instead of the system's.
const NOBODY: &str = "65534";

/// How long after the resume zone a must be healthy again: the longest reconnect backoff
/// (60 s) plus a probe timeout (30 s), the bound docs/libvirt.md §2.3 states.
const RECOVERY: Duration = Duration::from_secs(90);

/// A private libvirtd on its own socket; stopped, resumed and killed by the test.
struct Daemon {
    child: Child,
    socket: PathBuf,
    dir: tempfile::TempDir,
}

impl Daemon {
    fn start() -> Result<Daemon, String> {
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let open = std::fs::Permissions::from_mode(0o777);
        std::fs::set_permissions(dir.path(), open).map_err(|e| e.to_string())?;
        let child = Self::spawn(dir.path())?;
        let socket = dir.path().join("run/libvirt/libvirt-sock");
        let daemon = Daemon { child, socket, dir };
        daemon.wait_for_socket()?;
        Ok(daemon)
    }

    /// Kills the daemon (calls in flight see their connection drop) and starts a new one
    /// on the same socket.
    fn crash_and_restart(&mut self) {
        self.child.kill().expect("SIGKILL libvirtd");
        self.child.wait().expect("reap libvirtd");
        let _ = std::fs::remove_file(&self.socket);
        self.child = Self::spawn(self.dir.path()).unwrap_or_else(|e| panic!("{e}"));
        self.wait_for_socket().unwrap_or_else(|e| panic!("{e}"));
    }

    fn spawn(home: &Path) -> Result<Child, String> {
        let libvirtd = Path::new("/usr/sbin/libvirtd");
        if !libvirtd.exists() {
            return Err("libvirtd is not installed: run scripts/install-deps.sh".to_owned());
        }
        let home = home.to_str().expect("utf-8 temp path");
        Command::new("setpriv")
            .args(["--reuid", NOBODY, "--regid", NOBODY, "--clear-groups"])
            .arg("env")
            .arg(format!("HOME={home}"))
            .arg(format!("XDG_RUNTIME_DIR={home}/run"))
            .arg(format!("XDG_CONFIG_HOME={home}/config"))
            .arg(format!("XDG_CACHE_HOME={home}/cache"))
            .arg(libvirtd)
            .args(["--timeout", "0"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("spawn libvirtd through setpriv (needs root): {e}"))
    }

    fn wait_for_socket(&self) -> Result<(), String> {
        let start = Instant::now();
        while !self.socket.exists() {
            if start.elapsed() > Duration::from_secs(30) {
                return Err("the private libvirtd made no socket within 30 s".to_owned());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(())
    }

    fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .args([signal, &self.child.id().to_string()])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill {signal} libvirtd");
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-CONT", &self.child.id().to_string()])
            .status();
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A node file readable by the daemon's user; returns its path.
fn node(dir: &Path, name: &str) -> PathBuf {
    let fixture = Fixture {
        cpus: 64,
        memory_mib: 256 * 1024,
        ..Fixture::default()
    };
    fixture.write(dir, name).expect("write the node file");
    let path = dir.join(name);
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
    path
}

/// Creates and deletes machines of `zone` until `stop`, counting completed cycles, three
/// machines at a time, each step only while the zone's host is healthy (a Create sent to an
/// unreachable host fails at once and takes its slot to Failed, which has no way out). The
/// workers draw slots from one pool of the zone's Speculative slots and put each back after
/// its cycle; a machine that went Failed (its transition was in flight when the host stopped,
/// or was sent before the liveness probe saw the host go) leaves the pool. A worker never
/// owns a fixed share of slots, so however the failures fall, the zone runs dry only when
/// every one of its slots went Failed, and that is the one failure of the load itself.
async fn churn(
    server: Arc<Server>,
    zone: &'static str,
    stop: Arc<AtomicBool>,
    done: Arc<AtomicUsize>,
) {
    let mut c = server.client().await;
    let ids: Vec<String> = list_all(&mut c)
        .await
        .machines
        .into_iter()
        .filter(|m| m.zone == zone && state(m) == S::Speculative)
        .map(|m| m.id)
        .collect();
    assert!(ids.len() >= 6, "zone {zone} has Speculative slots: {ids:?}");
    let total = ids.len();
    let pool = Arc::new(Mutex::new(VecDeque::from(ids)));
    let failed = Arc::new(AtomicUsize::new(0));
    let workers = (0..3).map(|_| {
        let (server, stop, done) = (Arc::clone(&server), Arc::clone(&stop), Arc::clone(&done));
        let (pool, failed) = (Arc::clone(&pool), Arc::clone(&failed));
        tokio::spawn(async move {
            let mut c = server.client().await;
            while !stop.load(Ordering::SeqCst) {
                let taken = pool.lock().unwrap().pop_front();
                let Some(id) = taken else {
                    assert!(
                        failed.load(Ordering::SeqCst) < total,
                        "zone {zone}: every one of its {total} slots went Failed"
                    );
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                };
                if get(&mut c, &id).await.is_ok_and(|m| state(&m) == S::Failed) {
                    failed.fetch_add(1, Ordering::SeqCst);
                    continue;
                }
                while !stop.load(Ordering::SeqCst) && health(&server, zone, "healthy").await != 1.0
                {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                if !stop.load(Ordering::SeqCst) {
                    if cycle(&mut c, &id).await {
                        done.fetch_add(1, Ordering::SeqCst);
                    } else {
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                }
                pool.lock().unwrap().push_back(id);
            }
        })
    });
    for worker in workers.collect::<Vec<_>>() {
        worker.await.expect("a churn worker");
    }
}

/// One Create → Idle → Delete → Speculative cycle; false when any step did not get there.
async fn cycle(c: &mut Client, id: &str) -> bool {
    if create(c, id, None).await.is_err()
        && get(c, id).await.map(|m| state(&m)).ok() != Some(S::Idle)
    {
        return false;
    }
    if settled(c, id).await != Some(S::Idle) {
        return false;
    }
    if delete(c, id, None).await.is_err() {
        return false;
    }
    settled(c, id).await == Some(S::Speculative)
}

/// Polls `id` until it leaves the transitional states (at most 60 s); `None` on timeout or
/// an error.
async fn settled(c: &mut Client, id: &str) -> Option<S> {
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(60) {
        let machine = get(c, id).await.ok()?;
        let now = state(&machine);
        if !matches!(
            now,
            S::Creating | S::Configuring | S::Draining | S::Deleting
        ) {
            return Some(now);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    None
}

/// Zone `zone`'s `bigfleet_libvirt_host_health` for `state`; -1 when `/metrics` does not
/// answer (the process is gone: the caller's liveness check says so).
async fn health(server: &Server, zone: &str, state: &str) -> f64 {
    let addr = server.metrics_addr.expect("metrics address");
    let Ok((200, _, body)) = http_get(addr, "/metrics").await else {
        return -1.0;
    };
    let wanted = format!("bigfleet_libvirt_host_health{{zone=\"{zone}\",state=\"{state}\"}} ");
    body.lines()
        .find_map(|line| line.strip_prefix(&wanted))
        .and_then(|value| value.trim().parse().ok())
        .unwrap_or(0.0)
}

/// Whether the provider process still runs (not exited, not a zombie).
fn alive(server: &Server) -> bool {
    server
        .pid()
        .is_some_and(|pid| Path::new(&format!("/proc/{pid}")).exists() && !zombie(pid))
}

/// What a host does to the provider in one scenario.
#[derive(Clone, Copy, Debug)]
enum Fault {
    /// SIGSTOP for this long, then SIGCONT.
    Hang(Duration),
    /// SIGKILL with calls in flight, then a new daemon on the same socket.
    Crash,
}

/// One fault of zone a's host under load on both zones; panics with what went wrong.
async fn fault_and_recover(fault: Fault) {
    let mut daemon = Daemon::start().unwrap_or_else(|e| panic!("{e}"));
    let dir = tempfile::tempdir().unwrap();
    let server = Arc::new(serve_two_zones(dir.path(), &daemon));
    let stop = Arc::new(AtomicBool::new(false));
    let (done_a, done_b) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let load = [("a", &done_a), ("b", &done_b)].map(|(zone, done)| {
        let churn = churn(
            Arc::clone(&server),
            zone,
            Arc::clone(&stop),
            Arc::clone(done),
        );
        tokio::spawn(churn)
    });
    // Let both zones get going, so calls are in flight on zone a when its host goes.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let b_before = done_b.load(Ordering::SeqCst);
    let detected = inject(fault, &mut daemon, &server).await;
    let b_during = done_b.load(Ordering::SeqCst) - b_before;
    let (recovered, cycling) = until_zone_a_cycles_again(fault, &server, &done_a).await;
    stop.store(true, Ordering::SeqCst);
    for task in load {
        task.await.expect("the load task");
    }
    assert_alive(fault, &server);
    if matches!(fault, Fault::Hang(_)) {
        assert!(
            b_during > 0,
            "{fault:?}: zone b completed no cycle while zone a hung"
        );
    }
    let transitional: Vec<String> = list_all(&mut server.client().await)
        .await
        .machines
        .into_iter()
        .filter(|m| {
            matches!(
                state(m),
                S::Creating | S::Configuring | S::Draining | S::Deleting
            )
        })
        .map(|m| format!("{} {:?}", m.id, state(&m)))
        .collect();
    assert!(
        transitional.is_empty(),
        "{fault:?}: left transitional: {transitional:?}"
    );
    eprintln!(
        "host_hang: {fault:?}: zone b {b_during} cycles meanwhile; zone a left healthy after \
         {detected:?}, healthy again {recovered:?} after the host came back, cycling again \
         {cycling:?} later"
    );
}

/// The provider over zone a (the private daemon, test driver over its socket) and zone b
/// (the test driver in process), each host from its own node file in `dir`.
fn serve_two_zones(dir: &Path, daemon: &Daemon) -> Server {
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let connect = format!(
        "--connect=a=test+unix://{}?socket={},b=test://{}",
        node(dir, "a.xml").display(),
        daemon.socket.display(),
        node(dir, "b.xml").display()
    );
    Server::start(&[connect.as_str(), "--image=base.qcow2", "--provider=hang"])
}

/// Does `fault` to zone a's daemon; for a hang, returns when zone a was seen leaving
/// `healthy` during it.
async fn inject(fault: Fault, daemon: &mut Daemon, server: &Server) -> Option<Duration> {
    match fault {
        Fault::Hang(hang) => {
            daemon.signal("-STOP");
            let detected = unreachable_within(server, hang).await;
            daemon.signal("-CONT");
            detected
        }
        Fault::Crash => {
            daemon.crash_and_restart();
            None
        }
    }
}

/// Waits until zone a is healthy again and then completes a Create/Delete cycle, each within
/// [`RECOVERY`], checking throughout that the process lives; returns both waits.
async fn until_zone_a_cycles_again(
    fault: Fault,
    server: &Server,
    done_a: &AtomicUsize,
) -> (Duration, Duration) {
    let back = Instant::now();
    loop {
        assert_alive(fault, server);
        if health(server, "a", "healthy").await == 1.0 {
            break;
        }
        assert!(
            back.elapsed() < RECOVERY,
            "{fault:?}: zone a not healthy {RECOVERY:?} after"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let recovered = back.elapsed();
    let a_after = done_a.load(Ordering::SeqCst);
    let start = Instant::now();
    while done_a.load(Ordering::SeqCst) == a_after {
        assert_alive(fault, server);
        assert!(
            start.elapsed() < RECOVERY,
            "{fault:?}: zone a healthy, but no Create/Delete cycle completed there in {RECOVERY:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    (recovered, start.elapsed())
}

fn assert_alive(fault: Fault, server: &Server) {
    assert!(
        alive(server),
        "{fault:?}: the provider died; its log ends:\n{}",
        tail(server)
    );
}

/// Watches zone a for `hang` and returns when (after the stop) it was first seen not
/// `healthy` (`unreachable`, then `connecting` while the redial waits for the host), if it
/// was: the liveness probe's detection time, printed for the record.
async fn unreachable_within(server: &Server, hang: Duration) -> Option<Duration> {
    let start = Instant::now();
    let mut seen = None;
    while start.elapsed() < hang {
        if seen.is_none() && health(server, "a", "healthy").await == 0.0 {
            seen = Some(start.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    seen
}

/// The private daemons are started as `nobody` through `setpriv`, which takes root.
fn as_root() -> Result<(), String> {
    let uid = Command::new("id")
        .arg("-u")
        .output()
        .map_err(|e| e.to_string())?;
    if String::from_utf8_lossy(&uid.stdout).trim() == "0" {
        Ok(())
    } else {
        Err("host_hang starts private libvirtd daemons as nobody, which needs root".to_owned())
    }
}

fn zombie(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|stat| {
            stat.rsplit_once(')')
                .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z'))
        })
        .unwrap_or(true)
}

fn tail(server: &Server) -> String {
    let lines = lines_of(server);
    lines[lines.len().saturating_sub(5)..].join("\n")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_hung_or_crashed_host_never_takes_the_process_down_and_its_zone_recovers() {
    let Some(()) = skip::needs(skip::ROOT, as_root()) else {
        return;
    };
    let faults = [10, 20, 25, 30]
        .map(|s| Fault::Hang(Duration::from_secs(s)))
        .into_iter()
        .chain([Fault::Crash]);
    let runs: Vec<_> = faults.map(|f| tokio::spawn(fault_and_recover(f))).collect();
    let mut failures = Vec::new();
    for run in runs {
        if let Err(e) = run.await {
            failures.push(e.to_string());
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}
