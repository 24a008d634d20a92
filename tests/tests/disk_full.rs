//! A full or read-only disk under `--state`, for real: the state file lives on a small tmpfs
//! mounted by the test, which is filled with big `shard_metadata`, then grown with
//! `mount -o remount,size=…` while the provider runs. Mounting needs root (CI runs as root);
//! where the tmpfs cannot be mounted the tests fail, unless `BIGFLEET_SKIP_ROOT_TESTS=1`
//! (`harness/skip.rs`).
//!
//! A commit that fails fails only its calls (`UNAVAILABLE`, naming the file, the OS error
//! and the fix), reads keep answering from the last durable state, readiness and gRPC
//! health say the store refuses commits, and once there is room mutations succeed again
//! with no restart. After a restart everything acknowledged is there and nothing else.
//! Start-up on a full or read-only filesystem names the file, the mount point, the free
//! space and the fix.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use bigfleet_libvirt_proto::v1alpha1 as pb;
use pb::MachineState as S;
use tonic::Code;
use tonic::transport::Endpoint;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

use crate::harness::*;

/// Fast fake latencies, as the durable lane uses.
const FAST: [&str; 2] = ["--fake-delay-min=5ms", "--fake-delay-max=40ms"];
/// The tmpfs the state file starts on, and what it is grown to.
const SMALL: &str = "3m";
const LARGE: &str = "64m";
/// One Configure's metadata: big enough that a few fill the small tmpfs.
const METADATA_BYTES: usize = 192 * 1024;
/// How long anything that polls may take on a loaded machine.
const PATIENCE: Duration = Duration::from_secs(20);

/// A tmpfs mounted on a fresh directory; unmounted (lazily, so a process still holding it
/// cannot keep it mounted) and removed when dropped, also when the test fails.
struct Tmpfs {
    dir: PathBuf,
    _parent: tempfile::TempDir,
}

impl Tmpfs {
    /// Mounts a tmpfs of `size`, or says why it cannot.
    fn mount(size: &str) -> Result<Self, String> {
        let uid = run("id", &["-u"]).map_err(|e| format!("cannot run id -u: {e}"))?;
        if uid.trim() != "0" {
            return Err(format!("needs root to mount a tmpfs (uid {})", uid.trim()));
        }
        let parent = tempfile::tempdir().map_err(|e| format!("temp dir: {e}"))?;
        let dir = parent.path().join("state");
        std::fs::create_dir(&dir).map_err(|e| format!("create {}: {e}", dir.display()))?;
        let options = format!("size={size},mode=0700");
        let dir_arg = dir.display().to_string();
        run("mount", &["-t", "tmpfs", "-o", &options, "tmpfs", &dir_arg])
            .map_err(|e| format!("mount a tmpfs on {dir_arg}: {e}"))?;
        Ok(Self {
            dir,
            _parent: parent,
        })
    }

    fn remount(&self, options: &str) {
        let options = format!("remount,{options}");
        let dir = self.dir.display().to_string();
        run("mount", &["-o", &options, &dir]).expect("remount the tmpfs");
    }

    fn state(&self) -> PathBuf {
        self.dir.join("state.redb")
    }

    /// Fills what is left of the tmpfs with a file, until the kernel says it is full.
    fn fill(&self) {
        use std::io::Write;
        let mut filler = std::fs::File::create(self.dir.join("filler")).expect("create filler");
        let block = vec![0xa5_u8; 64 * 1024];
        loop {
            match filler.write(&block) {
                Ok(0) => break,
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => break,
                Err(e) => panic!("fill the tmpfs: {e}"),
            }
        }
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let dir = self.dir.display().to_string();
        if let Err(e) = run("umount", &["-l", &dir]) {
            eprintln!("disk_full: could not unmount {dir}: {e}");
        }
    }
}

/// Runs a command; its stdout, or its stderr as the error.
fn run(program: &str, args: &[&str]) -> Result<String, String> {
    let output = Command::new(program)
        .args(args)
        .output()
        .map_err(|e| e.to_string())?;
    if output.status.success() {
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    } else {
        Err(String::from_utf8_lossy(&output.stderr).trim().to_owned())
    }
}

fn boot(state: &Path, seed_count: usize) -> Server {
    let state = format!("--state={}", state.display());
    let seeds = format!("--seed-count={seed_count}");
    let mut args = vec!["--use-fake-backend", "--provider=diskfull", &seeds, &state];
    args.extend(FAST);
    Server::start(&args)
}

fn big_metadata(tag: &str) -> std::collections::HashMap<String, String> {
    let value = tag.repeat(METADATA_BYTES / tag.len().max(1));
    [("disk-full/blob".to_owned(), value)].into()
}

async fn configure_big(
    c: &mut Client,
    id: &str,
    token: Token,
) -> Result<pb::TransitionAck, tonic::Status> {
    configure_map(c, id, &cluster_of(id), big_metadata(id), Vec::new(), token).await
}

fn cluster_of(id: &str) -> String {
    format!("cluster-{}", id.rsplit('/').next().unwrap_or(id))
}

async fn health(server: &Server) -> i32 {
    let channel = Endpoint::from_shared(format!("http://{}", server.addr))
        .unwrap()
        .connect_timeout(Duration::from_secs(5))
        .timeout(Duration::from_secs(5))
        .connect()
        .await
        .expect("connect for health");
    let request = HealthCheckRequest {
        service: String::new(),
    };
    let response = HealthClient::new(channel).check(request).await;
    response.expect("health check").into_inner().status
}

/// Polls `/readyz` and gRPC health until both say `ready` (or both say not), returning the
/// last `/readyz` answer.
async fn readiness_becomes(server: &Server, ready: bool) -> (u16, String) {
    let http = server.metrics_addr.expect("a metrics address");
    let want_health = if ready {
        ServingStatus::Serving
    } else {
        ServingStatus::NotServing
    } as i32;
    let start = Instant::now();
    loop {
        let (status, _, body) = http_get(http, "/readyz").await.expect("GET /readyz");
        let healthy = health(server).await;
        if (status == 200) == ready && healthy == want_health {
            return (status, body);
        }
        assert!(
            start.elapsed() < PATIENCE,
            "readiness did not become {ready}: /readyz {status} {body:?}, health {healthy}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Re-sends a refused Configure until `/readyz` (503), gRPC health (NOT_SERVING) and the
/// `state_writable` gauge (0) have each been seen saying the store refuses commits, and
/// returns the `/readyz` body. Each says so from one failed commit until the next commit
/// that succeeds, and on a full disk a small commit can still succeed (the store reuses
/// pages freed inside its own file: a finished transition, the once-a-second probe), so a
/// single look after a single failure can miss the window on a loaded machine. A re-sent
/// Configure that fits after all is acknowledged like any other and moves to `acked`.
async fn refusal_reported(
    server: &Server,
    c: &mut Client,
    shard: &str,
    refused: &mut Vec<(String, i64)>,
    acked: &mut Vec<Acked>,
) -> String {
    let http = server.metrics_addr.expect("a metrics address");
    let (mut body, mut unhealthy, mut unwritable) = (None, false, false);
    let start = Instant::now();
    loop {
        // The last refused call; the first stays refused for the retry after the growth.
        let (id, sequence) = refused.last().cloned().expect("a refused call");
        match configure_big(c, &id, tok(shard, 1, sequence)).await {
            Ok(ack) if refused.len() > 1 => {
                refused.pop();
                acked.push(Acked {
                    id,
                    operation_id: ack.operation_id,
                    sequence,
                });
            }
            Ok(_) => panic!("every refused Configure fitted: the disk is not full"),
            Err(status) => assert_eq!(status.code(), Code::Unavailable, "{status:?}"),
        }
        for _ in 0..10 {
            let (status, _, text) = http_get(http, "/readyz").await.expect("GET /readyz");
            if status == 503 {
                body.get_or_insert(text);
            }
            unhealthy |= health(server).await == ServingStatus::NotServing as i32;
            unwritable |= metric(server, "bigfleet_libvirt_state_writable").await == 0.0;
            if let (Some(body), true, true) = (&body, unhealthy, unwritable) {
                return body.clone();
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(
            start.elapsed() < PATIENCE,
            "the refusing store was not reported: /readyz 503 seen {}, health NOT_SERVING \
             seen {unhealthy}, state_writable 0 seen {unwritable}",
            body.is_some()
        );
    }
}

/// A sample of `/metrics` by series name (the first sample of that name).
async fn metric(server: &Server, name: &str) -> f64 {
    let http = server.metrics_addr.expect("a metrics address");
    let (_, _, body) = http_get(http, "/metrics").await.expect("GET /metrics");
    body.lines()
        .find_map(|line| {
            let rest = line.strip_prefix(name)?;
            let value = rest.strip_prefix(' ')?;
            value.trim().parse().ok()
        })
        .unwrap_or_else(|| panic!("no {name} in /metrics"))
}

/// One Configure the provider acknowledged.
struct Acked {
    id: String,
    operation_id: String,
    sequence: i64,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_fails_only_its_calls_and_heals_without_a_restart() {
    let Some(tmpfs) = skip::needs(skip::ROOT, Tmpfs::mount(SMALL)) else {
        return;
    };
    let file = tmpfs.state();
    let mut server = boot(&file, 48);
    let mut c = server.client().await;
    let shard = unique_shard("disk-full");
    let ids = pick_n(&server, &mut c, 40).await;
    // Every machine Idle first: while the disk is full only big commits are in flight.
    for (i, id) in ids.iter().enumerate() {
        let sequence = i64::try_from(i).unwrap() + 1;
        create(&mut c, id, tok(&shard, 1, sequence))
            .await
            .expect("Create accepted");
    }
    for id in &ids {
        reach(&mut c, id, S::Idle, PATIENCE).await;
    }

    // Fill the disk with big Configures until commits fail.
    let mut acked: Vec<Acked> = Vec::new();
    let mut refused: Vec<(String, i64)> = Vec::new();
    let mut first_refusal: Option<tonic::Status> = None;
    let mut used = ids.len();
    for (i, id) in ids.iter().enumerate() {
        let sequence = 1000 + i64::try_from(i).unwrap();
        match configure_big(&mut c, id, tok(&shard, 1, sequence)).await {
            Ok(ack) => acked.push(Acked {
                id: id.clone(),
                operation_id: ack.operation_id,
                sequence,
            }),
            Err(status) => {
                assert_eq!(status.code(), Code::Unavailable, "{status:?}");
                first_refusal.get_or_insert(status);
                refused.push((id.clone(), sequence));
                if refused.len() == 3 {
                    used = i + 1;
                    break;
                }
            }
        }
    }
    println!(
        "disk_full: {} Configures of {} KiB acknowledged on a {SMALL} tmpfs before {} were refused",
        acked.len(),
        METADATA_BYTES / 1024,
        refused.len()
    );
    let refusal = first_refusal.expect("the small tmpfs filled up");
    let message = refusal.message();
    println!("disk_full: refusal: {message}");
    assert!(message.contains(&file.display().to_string()), "{message}");
    assert!(message.contains("No space left on device"), "{message}");
    assert!(
        message.contains(&tmpfs.dir.display().to_string()),
        "{message}"
    );
    assert!(message.contains("free space") && message.contains("grow the volume"));
    assert!(!message.contains("restart"), "{message}");
    assert!(
        !acked.is_empty(),
        "some Configures fitted before the disk filled"
    );

    // Concurrent calls on the full disk share commits and are taken back together, while
    // reads keep answering alongside them.
    let calls = ids[used..].iter().enumerate().map(|(j, id)| {
        let mut client = c.clone();
        let sequence = 2000 + i64::try_from(j).unwrap();
        let token = tok(&shard, 1, sequence);
        async move {
            let outcome = configure_big(&mut client, id, token).await;
            (id.clone(), sequence, outcome)
        }
    });
    let reads = (0..8).map(|_| {
        let mut client = c.clone();
        async move { list_all(&mut client).await.machines.len() }
    });
    let (outcomes, lists) = futures::join!(
        futures::future::join_all(calls),
        futures::future::join_all(reads)
    );
    assert!(lists.iter().all(|&n| n == 48), "List answers: {lists:?}");
    let mut concurrent_refusals = 0;
    for (id, sequence, outcome) in outcomes {
        match outcome {
            Ok(ack) => acked.push(Acked {
                id,
                operation_id: ack.operation_id,
                sequence,
            }),
            Err(status) => {
                assert_eq!(status.code(), Code::Unavailable, "{status:?}");
                concurrent_refusals += 1;
                refused.push((id, sequence));
            }
        }
    }
    println!(
        "disk_full: {} concurrent Configures on the full disk: {concurrent_refusals} refused",
        ids.len() - used
    );

    // Reads answer, from the last durable state: a refused Configure left no trace.
    for (id, _) in &refused {
        let machine = get(&mut c, id)
            .await
            .expect("Get answers while commits fail");
        assert_eq!(state(&machine), S::Idle, "{machine:?}");
        assert!(machine.cluster.is_empty(), "{machine:?}");
    }
    let listed = list_all(&mut c).await;
    assert_eq!(listed.machines.len(), 48, "List answers while commits fail");
    let body = refusal_reported(&server, &mut c, &shard, &mut refused, &mut acked).await;
    println!("disk_full: /readyz while full: 503 {body:?}");
    assert!(body.contains("state store"), "{body}");
    assert!(body.contains("No space left on device"), "{body}");
    let http = server.metrics_addr.unwrap();
    let (status, _, body) = http_get(http, "/healthz").await.unwrap();
    assert_eq!((status, body.as_str()), (200, "ok\n"), "liveness stays ok");
    let failures = metric(&server, "bigfleet_libvirt_state_commit_failures_total").await;
    assert!(failures >= 1.0, "failures counted: {failures}");

    // Grow the filesystem: readiness comes back by itself, and the same call, with the
    // same token, now succeeds; no restart.
    tmpfs.remount(&format!("size={LARGE}"));
    let (status, _) = readiness_becomes(&server, true).await;
    assert_eq!(status, 200);
    let (retried, sequence) = refused[0].clone();
    let ack = configure_big(&mut c, &retried, tok(&shard, 1, sequence))
        .await
        .expect("the refused call succeeds once there is room, with the same token");
    acked.push(Acked {
        id: retried.clone(),
        operation_id: ack.operation_id,
        sequence,
    });
    assert_eq!(
        metric(&server, "bigfleet_libvirt_state_writable").await,
        1.0
    );
    // Transitions that completed while commits failed are committed now.
    for done in &acked {
        reach(&mut c, &done.id, S::Configured, PATIENCE).await;
    }

    // After a restart: everything acknowledged, and nothing else.
    server.kill();
    let server = boot(&file, 48);
    let mut c = server.client().await;
    for done in &acked {
        let machine = reach(&mut c, &done.id, S::Configured, PATIENCE).await;
        assert_eq!(machine.cluster, cluster_of(&done.id));
        assert_eq!(machine.shard_metadata, big_metadata(&done.id));
        // The acknowledged mark is durable: the same token is stale now.
        let stale = configure_big(&mut c, &done.id, tok(&shard, 1, done.sequence)).await;
        assert_eq!(code(&stale), Code::FailedPrecondition, "{}", done.id);
        // The acknowledged operation id is durable: a newer retry gets it back.
        let retry = configure_big(&mut c, &done.id, tok(&shard, 1, done.sequence + 1))
            .await
            .expect("an idempotent retry");
        assert_eq!(retry.operation_id, done.operation_id, "{}", done.id);
    }
    for (id, sequence) in refused.iter().skip(1) {
        let machine = get(&mut c, id).await.expect("Get");
        assert_eq!(state(&machine), S::Idle, "never acknowledged: {machine:?}");
        assert!(machine.cluster.is_empty(), "{machine:?}");
        // Its fence mark was never durable: the refused token still passes.
        configure_big(&mut c, id, tok(&shard, 1, *sequence))
            .await
            .expect("the refused token was never recorded");
    }
}

/// With no call and no transition in flight, readiness still comes back once space is freed:
/// the provider probes the store while it refuses commits (out of service, it gets no calls).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_comes_back_by_itself_once_space_is_freed() {
    let Some(tmpfs) = skip::needs(skip::ROOT, Tmpfs::mount(SMALL)) else {
        return;
    };
    let server = boot(&tmpfs.state(), 8);
    let mut c = server.client().await;
    let ids = pick_n(&server, &mut c, 8).await;
    for id in &ids {
        create(&mut c, id, None).await.expect("Create accepted");
    }
    for id in &ids {
        reach(&mut c, id, S::Idle, PATIENCE).await;
    }
    tmpfs.fill();
    // Far more than any free room left inside the state file.
    let huge: std::collections::HashMap<String, String> =
        [("disk-full/huge".to_owned(), "h".repeat(4 * 1024 * 1024))].into();
    let refused = configure_map(&mut c, &ids[0], "cluster-x", huge, Vec::new(), None).await;
    assert_eq!(code(&refused), Code::Unavailable, "{refused:?}");
    let (status, _) = readiness_becomes(&server, false).await;
    assert_eq!(status, 503);
    std::fs::remove_file(tmpfs.dir.join("filler")).expect("free the space");
    let started = Instant::now();
    let (status, body) = readiness_becomes(&server, true).await;
    println!(
        "disk_full: ready again {:?} after space was freed, with no call: {status} {body:?}",
        started.elapsed()
    );
    let machine = get(&mut c, &ids[0]).await.expect("Get");
    assert_eq!(
        state(&machine),
        S::Idle,
        "the refused Configure left no trace"
    );
}

/// Starts the binary expecting it to refuse to start; returns its exit code and stderr.
fn start_refused(state: &Path) -> (Option<i32>, String) {
    let mut child = Command::new(binary())
        .args([
            "--use-fake-backend",
            "--addr=127.0.0.1:0",
            "--metrics-addr=",
            "--log-format=json",
        ])
        .arg(format!("--state={}", state.display()))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn bigfleet-libvirt");
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            let mut stderr = String::new();
            use std::io::Read;
            let _ = child.stderr.take().unwrap().read_to_string(&mut stderr);
            return (status.code(), stderr);
        }
        if start.elapsed() > PATIENCE {
            let _ = child.kill();
            panic!("the provider did not refuse to start within {PATIENCE:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn assert_says_where_and_what_to_do(stderr: &str, tmpfs: &Tmpfs, os_error: &str) {
    let state = tmpfs.state().display().to_string();
    let mount = tmpfs.dir.display().to_string();
    assert!(stderr.contains(&state), "names the file: {stderr}");
    assert!(
        stderr.contains(&format!("filesystem {mount} (tmpfs")),
        "{stderr}"
    );
    assert!(
        stderr.contains(" free of "),
        "says how much is free: {stderr}"
    );
    assert!(stderr.contains(os_error), "{stderr}");
    assert!(stderr.contains("free space there, grow the volume or make it writable"));
    assert!(!stderr.contains("restart the provider"), "{stderr}");
}

#[test]
fn start_up_on_a_full_disk_names_the_file_the_filesystem_and_the_fix() {
    let Some(tmpfs) = skip::needs(skip::ROOT, Tmpfs::mount("1m")) else {
        return;
    };
    tmpfs.fill();
    let (code, stderr) = start_refused(&tmpfs.state());
    println!("disk_full: start-up on a full disk: {stderr}");
    assert_ne!(code, Some(0));
    assert_says_where_and_what_to_do(&stderr, &tmpfs, "No space left on device");
}

#[test]
fn start_up_on_a_read_only_disk_names_the_file_the_filesystem_and_the_fix() {
    let Some(tmpfs) = skip::needs(skip::ROOT, Tmpfs::mount("16m")) else {
        return;
    };
    // A first run creates the state file; then the filesystem goes read-only under it.
    let mut server = boot(&tmpfs.state(), 4);
    server.kill();
    tmpfs.remount("ro");
    let (code, stderr) = start_refused(&tmpfs.state());
    println!("disk_full: start-up on a read-only disk: {stderr}");
    assert_ne!(code, Some(0));
    assert_says_where_and_what_to_do(&stderr, &tmpfs, "Read-only file system");
    assert!(stderr.contains("mounted read-only"), "{stderr}");
}
