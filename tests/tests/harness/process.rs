//! Spawning and stopping provider processes.

use std::io::{BufRead, BufReader, Read};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bigfleet_libvirt_proto::v1alpha1::capacity_provider_client::CapacityProviderClient;
use tonic::transport::{Channel, Endpoint};

/// A generated client with generous message limits (big metadata and full lists).
pub type Client = CapacityProviderClient<Channel>;

/// The provider binary under test: the one Cargo built for this test run (the integration
/// tests belong to the binary's package, so `cargo test` builds it first and says where).
/// `BIGFLEET_LIBVIRT_BIN` names another build instead, for the ignored test that writes the
/// old-format state file fixture with an older release.
pub fn binary() -> PathBuf {
    std::env::var_os("BIGFLEET_LIBVIRT_BIN").map_or_else(
        || PathBuf::from(env!("CARGO_BIN_EXE_bigfleet-libvirt")),
        PathBuf::from,
    )
}

/// A running provider process; killed when dropped.
pub struct Server {
    child: Option<Child>,
    /// The gRPC address it serves on.
    pub addr: SocketAddr,
    /// The HTTP side-server address, when enabled.
    pub metrics_addr: Option<SocketAddr>,
    /// Every stderr line so far.
    pub log: Arc<Mutex<Vec<String>>>,
    /// Machine ids handed out by `pick_*`, so one test never picks the same slot twice.
    pub claimed: Mutex<std::collections::BTreeSet<String>>,
    /// Files the process reads for as long as it runs (a test-driver node file), removed
    /// after it is stopped.
    scratch: Option<tempfile::TempDir>,
    /// Run once the process is stopped (for example, removing what it made on real hosts).
    after_stop: Mutex<Option<Box<dyn FnOnce() + Send>>>,
}

/// How long the provider started with `args` may take to serve: 30 s, or 120 s when it
/// dials real libvirt daemons (`--connect` naming a `qemu` URI), because it starts their
/// inactive storage pools before it serves (an rbd pool connects to Ceph first: 9 s in a CI
/// rehearsal of the real-QEMU tier).
fn start_bound(args: &[&str]) -> Duration {
    let real = args
        .iter()
        .any(|a| a.starts_with("--connect") && a.contains("qemu"));
    Duration::from_secs(if real { 120 } else { 30 })
}

impl Server {
    /// Starts the binary with `args` (plus loopback `--addr`/`--metrics-addr` and JSON logs,
    /// unless `args` sets them) and waits until it serves.
    pub fn start(args: &[&str]) -> Server {
        Self::start_command(Command::new(binary()), args)
    }

    /// As [`Server::start`], but run through `wrapper`, a command that execs the binary
    /// given as its last argument (e.g. `prlimit --nofile=64:64`), so the process id is
    /// still the provider's.
    pub fn start_wrapped(wrapper: &[&str], args: &[&str]) -> Server {
        let (program, rest) = wrapper.split_first().expect("a wrapper command");
        let mut command = Command::new(program);
        command.args(rest).arg(binary());
        Self::start_command(command, args)
    }

    /// Like [`Server::start`], with `command` as the program (for example the binary run
    /// through `chroot`); `args` are appended to it.
    pub fn start_command(mut command: Command, args: &[&str]) -> Server {
        if !args.iter().any(|a| a.starts_with("--addr")) {
            command.arg("--addr=127.0.0.1:0");
        }
        if !args.iter().any(|a| a.starts_with("--metrics-addr")) {
            command.arg("--metrics-addr=127.0.0.1:0");
        }
        // libvirt's test driver reports every pool as 100 GiB, which the built-in types'
        // 40 GiB and larger roots would fill after two machines at the default ratio of 1;
        // the tests that are about disk room pass their own ratio.
        if !args
            .iter()
            .any(|a| a.starts_with("--disk-allocation-ratio"))
        {
            command.arg("--disk-allocation-ratio=1000");
        }
        command.args(["--log-format=json"]).args(args);
        command
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        command.env_remove("RUST_LOG");
        let mut child = command.spawn().expect("spawn bigfleet-libvirt");
        let stderr = child.stderr.take().expect("piped stderr");
        let log = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        let sink = Arc::clone(&log);
        std::thread::spawn(move || {
            let mut tx = Some(tx);
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let serving = serving_addrs(&line);
                // The line is in the log before the start returns, so a caller can read it.
                sink.lock().unwrap().push(line);
                if let Some(addrs) = serving {
                    if let Some(tx) = tx.take() {
                        let _ = tx.send(addrs);
                    }
                }
            }
        });
        let spawned = Instant::now();
        let within = start_bound(args);
        let (addr, metrics_addr) = match rx.recv_timeout(within) {
            Ok(addrs) => {
                super::timing::seen("start serving", spawned.elapsed(), within);
                addrs
            }
            Err(_) => {
                let _ = child.kill();
                let lines = log.lock().unwrap().join("\n");
                panic!(
                    "bigfleet-libvirt did not start serving within {within:?}; its log:\n{lines}"
                );
            }
        };
        Server {
            child: Some(child),
            addr,
            metrics_addr,
            log,
            claimed: Mutex::default(),
            scratch: None,
            after_stop: Mutex::new(None),
        }
    }

    /// This server, running `cleanup` once its process is stopped (when dropped).
    #[must_use]
    pub fn after_stop(mut self, cleanup: impl FnOnce() + Send + 'static) -> Self {
        self.after_stop = Mutex::new(Some(Box::new(cleanup)));
        self
    }

    /// This server, keeping `dir` until it is dropped.
    #[must_use]
    pub fn holding(mut self, dir: tempfile::TempDir) -> Self {
        self.scratch = Some(dir);
        self
    }

    /// A new connection (its own HTTP/2 connection) to the provider.
    pub async fn client(&self) -> Client {
        let endpoint = Endpoint::from_shared(format!("http://{}", self.addr)).unwrap();
        let channel = endpoint
            .connect_timeout(Duration::from_secs(5))
            .timeout(Duration::from_secs(30))
            .connect()
            .await
            .expect("connect to the provider");
        CapacityProviderClient::new(channel)
            .max_decoding_message_size(256 * 1024 * 1024)
            .max_encoding_message_size(64 * 1024 * 1024)
    }

    /// The provider's process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Sends SIGKILL and waits for the process.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Sends SIGTERM.
    pub fn terminate(&self) {
        if let Some(child) = &self.child {
            let pid = i32::try_from(child.id()).expect("pid fits");
            let rc = send_signal(pid, libc::SIGTERM);
            assert_eq!(rc, 0, "send SIGTERM");
        }
    }

    /// Waits for the process to exit and returns its exit code.
    pub fn wait(&mut self, timeout: Duration) -> Option<i32> {
        let child = self.child.as_mut()?;
        let start = std::time::Instant::now();
        loop {
            if let Some(status) = child.try_wait().expect("try_wait") {
                super::timing::seen("exit", start.elapsed(), timeout);
                self.child = None;
                return status.code();
            }
            if start.elapsed() > timeout {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The log so far, one line per entry.
    pub fn log_text(&self) -> String {
        self.log.lock().unwrap().join("\n")
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
        let cleanup = self.after_stop.lock().map(|mut c| c.take());
        if let Ok(Some(cleanup)) = cleanup {
            cleanup();
        }
    }
}

fn send_signal(pid: i32, signal: i32) -> i32 {
    // kill(1) keeps the test crate free of unsafe code.
    let status = Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(pid.to_string())
        .status()
        .expect("run kill");
    if status.success() { 0 } else { 1 }
}

/// Parses the JSON "serving CapacityProvider" line into (grpc, metrics) addresses.
fn serving_addrs(line: &str) -> Option<(SocketAddr, Option<SocketAddr>)> {
    let value: serde_json::Value = serde_json::from_str(line).ok()?;
    let fields = value.get("fields")?;
    if fields.get("message")?.as_str()? != "serving CapacityProvider" {
        return None;
    }
    let addr = fields.get("addr")?.as_str()?.parse().ok()?;
    let metrics = fields
        .get("metrics_addr")
        .and_then(|v| v.as_str())
        .and_then(|s| s.parse().ok());
    Some((addr, metrics))
}

/// Waits up to `within` for `child` (spawned with piped stderr) to exit by itself and kills
/// it otherwise. Returns its exit status (`None` when it had to be killed) and its stderr.
pub fn exit_within(mut child: Child, within: Duration) -> (Option<ExitStatus>, String) {
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            super::timing::seen("exit", start.elapsed(), within);
            break Some(status);
        }
        if start.elapsed() > within {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut stderr = String::new();
    if let Some(mut pipe) = child.stderr.take() {
        pipe.read_to_string(&mut stderr).unwrap();
    }
    (status, stderr)
}
