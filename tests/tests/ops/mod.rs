//! Issue 7 — the operations surface, black-box: `/metrics` parsed with a Prometheus text
//! parser, `/healthz` and `/readyz`, gRPC health across SIGTERM, TLS and mTLS with
//! certificates made here (rcgen), certificate rotation on disk and on SIGHUP, start-up
//! errors for bad TLS flags, spans at an in-process OTLP collector, no bootstrap blob in any
//! log line or span, and a handler panic answered with INTERNAL while the process serves on.
//!
//! One module per part of that surface; this one holds what several of them share: a
//! provider process with a chosen environment and a known pid.

mod health;
mod metrics;
mod otlp;
mod otlp_down;
mod panics;
mod rotation;
mod startup;
mod timeline;
mod tls;
mod trace_context;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bigfleet_libvirt_proto::v1alpha1 as pb;
use bigfleet_libvirt_proto::v1alpha1::capacity_provider_client::CapacityProviderClient;
use pb::MachineState as S;
use tonic::transport::Endpoint;

use crate::harness::*;

const FAST: [&str; 2] = ["--fake-delay-min=5ms", "--fake-delay-max=40ms"];
const REQUESTS: &str = "bigfleet_libvirt_grpc_requests_total";

// ---------------------------------------------------------------------------------------
// A provider process with a chosen environment and a known pid (the harness offers
// neither), for RUST_LOG runs and SIGHUP.

struct Proc {
    child: Option<Child>,
    pid: u32,
    addr: SocketAddr,
    log: Arc<Mutex<Vec<String>>>,
    reader: Option<std::thread::JoinHandle<()>>,
}

impl Proc {
    fn spawn(args: &[String], env: &[(&str, &str)]) -> Proc {
        let mut command = Command::new(binary());
        command
            .args([
                "--addr=127.0.0.1:0",
                "--metrics-addr=127.0.0.1:0",
                "--log-format=json",
            ])
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        for var in [
            "RUST_LOG",
            "OTEL_SERVICE_NAME",
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            "OTEL_SDK_DISABLED",
        ] {
            command.env_remove(var);
        }
        command.envs(env.iter().copied());
        let mut child = command.spawn().expect("spawn bigfleet-libvirt");
        let stderr = child.stderr.take().unwrap();
        let log = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&log);
        let (tx, rx) = std::sync::mpsc::channel();
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let serving = serde_json::from_str::<serde_json::Value>(&line)
                    .ok()
                    .filter(|v| v["fields"]["message"] == "serving CapacityProvider")
                    .and_then(|v| v["fields"]["addr"].as_str()?.parse::<SocketAddr>().ok());
                if let Some(addr) = serving {
                    let _ = tx.send(addr);
                }
                sink.lock().unwrap().push(line);
            }
        });
        let pid = child.id();
        let Ok(addr) = rx.recv_timeout(Duration::from_secs(30)) else {
            let _ = child.kill();
            panic!(
                "no serving line in 30s:\n{}",
                log.lock().unwrap().join("\n")
            );
        };
        Proc {
            child: Some(child),
            pid,
            addr,
            log,
            reader: Some(reader),
        }
    }

    fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(self.pid.to_string())
            .status()
            .unwrap();
        assert!(status.success(), "kill -{signal} {}", self.pid);
    }

    fn running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| c.try_wait().unwrap().is_none())
    }

    /// Waits for the exit code, then for the last log lines.
    async fn wait(&mut self, timeout: Duration) -> Option<i32> {
        let start = Instant::now();
        let child = self.child.as_mut()?;
        let code = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break status.code();
            }
            if start.elapsed() > timeout {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        self.child = None;
        if let Some(reader) = self.reader.take() {
            let _ = reader.join();
        }
        code
    }

    fn log_lines(&self) -> Vec<String> {
        self.log.lock().unwrap().clone()
    }

    async fn client(&self) -> Client {
        let channel = Endpoint::from_shared(format!("http://{}", self.addr))
            .unwrap()
            .connect_timeout(Duration::from_secs(5))
            .timeout(Duration::from_secs(30))
            .connect()
            .await
            .expect("connect");
        CapacityProviderClient::new(channel)
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

async fn first_speculative(c: &mut Client) -> String {
    list(c, &[S::Speculative], 0, b"")
        .await
        .machines
        .into_iter()
        .find(|m| !m.labels.contains_key(FAULT_LABEL))
        .expect("a Speculative machine")
        .id
}
