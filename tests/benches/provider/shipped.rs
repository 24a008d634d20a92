//! Phase 4: the binary as shipped. The `bigfleet-libvirt` binary Cargo built for this bench
//! (release, with `cargo bench`), started with its default flags over the fake hypervisor
//! (plus loopback addresses, JSON logs as the chart runs it, and `--seed-count`), so its
//! tracing subscriber, per-call spans, trace-context handling, logging and metrics are all
//! on the path, is driven over loopback with Get, Create and Configure at concurrency
//! `BENCH_WORKERS` (64), round by round next to the echo yardstick. The echo runs in a
//! process of its own (this bench re-executed with `BENCH_ECHO_ADDR_FILE`), so each
//! server's CPU per call is read the same way: the sum of its threads' run time from
//! `/proc/<pid>/task/*/schedstat` (nanoseconds) before and after each round.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::AtomicI64;
use std::time::{Duration, Instant};

use bigfleet_libvirt_proto::v1alpha1 as pb;
use prost::Message;

use super::*;
use crate::clients::{Rpc, client, connect, list_filter, run_batch, settle};
use crate::harness::Server;
use crate::server::{Echo, start_echo};

/// Set in the re-executed bench: serve the echo, write its address to this file, and run
/// until killed.
const ECHO_ADDR_FILE: &str = "BENCH_ECHO_ADDR_FILE";
/// The machine the echo answers with, protobuf-encoded as hex.
const ECHO_MACHINE: &str = "BENCH_ECHO_MACHINE";

/// When this process was started as the echo server: serves it and never returns
/// (`None` otherwise).
pub(crate) fn echo_process() -> Option<Result<(), BoxError>> {
    let path = std::env::var_os(ECHO_ADDR_FILE)?;
    Some(serve_echo_until_killed(PathBuf::from(path)))
}

fn serve_echo_until_killed(path: PathBuf) -> Result<(), BoxError> {
    let hex = std::env::var(ECHO_MACHINE)?;
    let bytes = (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16))
        .collect::<Result<Vec<u8>, _>>()?;
    let machine = pb::Machine::decode(bytes.as_slice())?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        let running = start_echo(Echo {
            ack: pb::TransitionAck {
                operation_id: "op-00000000000000000001".to_owned(),
                machine: Some(machine.clone()),
            },
            machine,
        })
        .await?;
        let partial = path.with_extension("partial");
        std::fs::write(&partial, running.addr.to_string())?;
        std::fs::rename(&partial, &path)?;
        std::future::pending::<Result<(), BoxError>>().await
    })
}

/// The echo in its own process; killed when dropped.
struct EchoProcess {
    child: std::process::Child,
    addr: std::net::SocketAddr,
    _dir: tempfile::TempDir,
}

impl Drop for EchoProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl EchoProcess {
    fn start(machine: &pb::Machine) -> Result<Self, BoxError> {
        let dir = tempfile::tempdir()?;
        let file = dir.path().join("echo.addr");
        let hex: String = machine
            .encode_to_vec()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        let child = std::process::Command::new(std::env::current_exe()?)
            .env(ECHO_ADDR_FILE, &file)
            .env(ECHO_MACHINE, hex)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .spawn()?;
        let mut echo = Self {
            child,
            addr: "127.0.0.1:0".parse()?,
            _dir: dir,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(text) = std::fs::read_to_string(&file) {
                echo.addr = text.trim().parse()?;
                return Ok(echo);
            }
            if let Some(status) = echo.child.try_wait()? {
                return Err(format!("the echo process exited: {status}").into());
            }
            if Instant::now() > deadline {
                return Err("the echo process did not serve within 30 s".into());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// The CPU time all threads of process `pid` have run so far.
fn cpu_time(pid: u32) -> Result<Duration, BoxError> {
    let mut total = 0u64;
    for task in std::fs::read_dir(Path::new("/proc").join(pid.to_string()).join("task"))? {
        let Ok(text) = std::fs::read_to_string(task?.path().join("schedstat")) else {
            continue; // The thread ended meanwhile.
        };
        let on_cpu = text.split_whitespace().next().unwrap_or("0");
        total += on_cpu.parse::<u64>()?;
    }
    Ok(Duration::from_nanos(total))
}

/// One server's rounds of one RPC.
#[derive(Default)]
struct Side {
    samples: Vec<Duration>,
    calls: usize,
    wall: Duration,
    cpu: Duration,
    errors: usize,
    first_error: Option<String>,
}

impl Side {
    fn per_second(&self) -> f64 {
        self.calls as f64 / self.wall.as_secs_f64().max(1e-9)
    }

    fn cpu_per_call(&self) -> Duration {
        self.cpu / u32::try_from(self.calls.max(1)).unwrap_or(u32::MAX)
    }
}

/// One RPC on both servers.
pub(crate) struct ShippedRow {
    rpc: Rpc,
    echo: Side,
    shipped: Side,
    rounds: usize,
}

async fn round(
    side: &mut Side,
    pid: u32,
    channel: &tonic::transport::Channel,
    rpc: Rpc,
    chunks: &[Vec<String>],
    sequence: &Arc<AtomicI64>,
    blob: &Arc<Vec<u8>>,
) -> Result<(), BoxError> {
    let before = cpu_time(pid)?;
    let run = run_batch(channel, rpc, chunks, sequence, blob).await?;
    side.cpu += cpu_time(pid)?.saturating_sub(before);
    side.calls += run.samples.len();
    side.wall += run.wall;
    side.samples.extend(run.samples.0);
    side.errors += run.errors;
    if side.first_error.is_none() {
        side.first_error = run.first_error;
    }
    Ok(())
}

/// Both servers, connected: the binary as shipped, with `ids` its Speculative slots, and
/// the echo answering with one of its machines.
struct Servers {
    server: Server,
    echo_process: EchoProcess,
    shipped: tonic::transport::Channel,
    echo: tonic::transport::Channel,
    ids: Vec<String>,
}

async fn start_servers(needed: usize) -> Result<Servers, BoxError> {
    let server = Server::start(&[&format!("--seed-count={}", (needed + 64).max(8_000))]);
    let shipped = connect(server.addr).await?;
    let mut c = client(&shipped);
    let speculative = list_filter(&[pb::MachineState::Speculative], 0, Vec::new());
    let ids: Vec<String> = (c.list(speculative).await?.into_inner().machines.into_iter())
        .map(|m| m.id)
        .collect();
    if ids.len() < needed {
        return Err(format!("{} Speculative slots, need {needed}", ids.len()).into());
    }
    let sample = c
        .get(pb::MachineRef { id: ids[0].clone() })
        .await?
        .into_inner();
    let echo_process = EchoProcess::start(&sample)?;
    let echo = connect(echo_process.addr).await?;
    Ok(Servers {
        server,
        echo_process,
        shipped,
        echo,
        ids,
    })
}

/// Runs the phase: `sizes.rounds` rounds of `sizes.workers` × `sizes.calls_per_worker`
/// calls per RPC and server, the two servers alternating which goes first. Create takes the
/// Speculative slots, Configure the same machines once Idle, Get them again.
pub(crate) async fn measure_shipped(sizes: &Sizes) -> Result<Vec<ShippedRow>, BoxError> {
    let per_round = sizes.workers * sizes.calls_per_worker;
    let servers = start_servers(per_round * sizes.rounds).await?;
    let pids = (
        servers.echo_process.child.id(),
        servers
            .server
            .pid()
            .ok_or("the provider has no process id")?,
    );
    let sequence = Arc::new(AtomicI64::new(1));
    let blob: Arc<Vec<u8>> = Arc::new((0..1024u32).map(|i| (i % 251) as u8).collect());
    let used = &servers.ids[..per_round * sizes.rounds];
    let rounds: Vec<Vec<Vec<String>>> = (used.chunks(per_round))
        .map(|ids| (ids.chunks(sizes.calls_per_worker).map(<[String]>::to_vec)).collect())
        .collect();
    // Warm both: one round of Gets each, not counted.
    for channel in [&servers.echo, &servers.shipped] {
        run_batch(channel, Rpc::Get, &rounds[0], &sequence, &blob).await?;
    }
    let mut rows = Vec::new();
    for rpc in [Rpc::Create, Rpc::Configure, Rpc::Get] {
        if rpc == Rpc::Configure {
            settle(&mut client(&servers.shipped), used, pb::MachineState::Idle).await?;
        }
        let mut row = ShippedRow {
            rpc,
            echo: Side::default(),
            shipped: Side::default(),
            rounds: sizes.rounds,
        };
        for (n, chunks) in rounds.iter().enumerate() {
            let echo_first = n % 2 == 0;
            for echo in [echo_first, !echo_first] {
                let (side, pid, channel) = if echo {
                    (&mut row.echo, pids.0, &servers.echo)
                } else {
                    (&mut row.shipped, pids.1, &servers.shipped)
                };
                round(side, pid, channel, rpc, chunks, &sequence, &blob).await?;
            }
        }
        rows.push(row);
    }
    Ok(rows)
}

/// The phase's table and its verdicts (issue 40's goals: the binary as shipped against the
/// echo in the same run).
pub(crate) fn print_shipped(rows: &[ShippedRow], workers: usize, verdicts: &mut Vec<Verdict>) {
    say!();
    say!("== The binary as shipped vs the echo, each in its own process, concurrency {workers} ==");
    say!(
        "{:<10} {:>7} {:>12} {:>12} {:>10} {:>10} {:>12} {:>12}  ratios (shipped ÷ echo)",
        "rpc",
        "calls",
        "echo /s",
        "shipped /s",
        "echo p50",
        "ship p50",
        "echo cpu",
        "ship cpu"
    );
    for row in rows {
        let (e, s) = (&row.echo, &row.shipped);
        let (es, ss) = (
            Samples::new(e.samples.clone()),
            Samples::new(s.samples.clone()),
        );
        let throughput = s.per_second() / e.per_second();
        let p50 = ratio(ss.p50(), es.p50());
        let p99 = ratio(ss.p99(), es.p99());
        let cpu = ratio(s.cpu_per_call(), e.cpu_per_call());
        say!(
            "{:<10} {:>7} {:>12.0} {:>12.0} {:>10} {:>10} {:>12} {:>12}  throughput {throughput:.2}, p50 {p50:.2}, p99 {p99:.2} ({} vs {}), cpu/call {cpu:.2}; {} rounds, errors {}/{}{}",
            row.rpc.name(),
            s.calls,
            e.per_second(),
            s.per_second(),
            fmt_d(es.p50()),
            fmt_d(ss.p50()),
            fmt_d(e.cpu_per_call()),
            fmt_d(s.cpu_per_call()),
            fmt_d(ss.p99()),
            fmt_d(es.p99()),
            row.rounds,
            e.errors,
            s.errors,
            s.first_error
                .as_deref()
                .or(e.first_error.as_deref())
                .map(|f| format!(" (first: {f})"))
                .unwrap_or_default(),
        );
        goals(row, workers, (throughput, p50, p99, cpu), verdicts);
    }
}

/// The goals for one row: `(throughput, p50, p99, cpu)` are its ratios to the echo.
fn goals(
    row: &ShippedRow,
    workers: usize,
    ratios: (f64, f64, f64, f64),
    verdicts: &mut Vec<Verdict>,
) {
    let (throughput, p50, p99, cpu) = ratios;
    let mut goal = |what: &str, measured: f64, target: &str, pass: bool| {
        verdicts.push(Verdict {
            what: format!("shipped {} c={workers} {what}", row.rpc.name()),
            measured: format!("{measured:.2}x"),
            target: target.to_owned(),
            pass,
        });
    };
    match row.rpc {
        Rpc::Get => {
            goal(
                "throughput / echo",
                throughput,
                ">= 1.0x",
                throughput >= 1.0,
            );
            goal("p50 / echo", p50, "<= 1.2x", p50 <= 1.2);
        }
        Rpc::Create => {
            goal(
                "throughput / echo",
                throughput,
                ">= 0.8x",
                throughput >= 0.8,
            );
            goal("cpu per call / echo", cpu, "<= 2.0x", cpu <= 2.0);
        }
        Rpc::Configure => goal("p99 / echo", p99, "<= 2.0x", p99 <= 2.0),
        Rpc::Drain | Rpc::Delete => {}
    }
}
