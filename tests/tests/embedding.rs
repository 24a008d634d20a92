//! The composition root used as a library, as the benchmarks use it: when `app::run`
//! returns, the provider has stopped (its background loops have ended, the state file is
//! closed), so the same process can serve the same state file again. Before, the loops kept
//! the provider, and with it the file's lock, alive after serving ended: the second run was
//! refused and the durability benchmark's restart phase waited forever.

use std::path::Path;
use std::time::{Duration, Instant};

use bigfleet_libvirt_app as app;
use bigfleet_libvirt_app::launch;
use tokio::net::TcpListener;
use tonic::transport::Endpoint;

use crate::bench_flags;
use crate::harness::*;

type Serving = tokio::task::JoinHandle<Result<(), String>>;

/// `app::run` on `state` with 8 fake slots, on a fresh loopback port.
async fn serve(
    state: &Path,
) -> (
    std::net::SocketAddr,
    tokio::sync::oneshot::Sender<()>,
    Serving,
) {
    let mut flags = bench_flags::fake(8);
    flags.state = Some(state.to_path_buf());
    let plan = launch::resolve(&flags).expect("the plan");
    let grpc = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = grpc.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        let exit = app::Exit::default();
        let listeners = app::Listeners { grpc, http: None };
        let shutdown = async move {
            let _ = stopped.await;
        };
        app::run(app::Launch {
            plan,
            tls: None,
            limits: app::NetLimits::default(),
            listeners: Some(listeners),
            on_start: (),
            shutdown,
            exit: &exit,
        })
        .await
        .map_err(|e| format!("{e:#}"))
    });
    (addr, stop, task)
}

/// The machines a full List returns, once the server answers (or why it never did).
async fn listed(addr: std::net::SocketAddr, task: &Serving) -> Result<usize, String> {
    let start = Instant::now();
    loop {
        if task.is_finished() {
            return Err("app::run returned before serving".to_owned());
        }
        let endpoint = Endpoint::from_shared(format!("http://{addr}")).unwrap();
        if let Ok(channel) = endpoint.connect().await {
            let mut c = Client::new(channel);
            return Ok(list_all(&mut c).await.machines.len());
        }
        if start.elapsed() > Duration::from_secs(30) {
            return Err("no answer within 30 s".to_owned());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_state_file_serves_again_once_run_returns() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state.redb");
    for round in ["first", "second"] {
        let (addr, stop, task) = serve(&state).await;
        let answer = listed(addr, &task).await;
        let _ = stop.send(());
        let served = tokio::time::timeout(Duration::from_secs(30), task)
            .await
            .expect("app::run returns after shutdown")
            .expect("the serving task");
        assert_eq!(answer, Ok(8), "{round} run: {served:?}");
        assert_eq!(served, Ok(()), "{round} run");
    }
}
