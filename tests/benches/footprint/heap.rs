//! The in-process half of the footprint benchmark: live heap bytes per component, counted by
//! the benchmark's global allocator while the components are built the way the binary builds
//! them for `--use-fake-backend --seed-count=N` (the default offerings, provider `libvirt`,
//! the fake hypervisor given the inventory's slots, the provider built by the binary's own
//! composition root, `app::assemble`, over the in-memory store, the gRPC service on a
//! loopback port).

use crate::results::say;
use std::time::Duration;

use bigfleet_libvirt_app::Metrics;
use bigfleet_libvirt_app::{self as app, Banner, ServeConfig};
use bigfleet_libvirt_domain::authorization::IdentityMode;
use bigfleet_libvirt_domain::catalog::{
    InstanceCatalog, InventoryConfig, PriceTable, build_inventory, default_offerings,
};
use bigfleet_libvirt_domain::{Core, Machine, Policy};
use bigfleet_libvirt_memory::MemoryStateStore;
use bigfleet_libvirt_memory::fake::{FakeConfig, FakeHypervisor};
use bigfleet_libvirt_ports::{Hypervisor, ProviderConfig, StateStore};
use bigfleet_libvirt_proto::v1alpha1 as pb;
use bigfleet_libvirt_system::{SystemClock, TokioSpawner};
use pb::capacity_provider_client::CapacityProviderClient;
use tonic::transport::Channel;

use super::{BoxError, GLOBAL};

/// Live heap bytes of this process right now.
fn live() -> i64 {
    let s = GLOBAL.stats();
    let allocated = i64::try_from(s.bytes_allocated).unwrap_or(i64::MAX);
    let freed = i64::try_from(s.bytes_deallocated).unwrap_or(i64::MAX);
    allocated - freed + s.bytes_reallocated as i64
}

/// Prints one component's bytes, in total and per machine.
struct Table {
    machines: usize,
    total: i64,
}

impl Table {
    fn row(&mut self, component: &str, bytes: i64, counted: bool) {
        if counted {
            self.total += bytes;
        }
        say!(
            "{:<58} {:>10.2} MiB {:>9.0} B/machine",
            component,
            bytes as f64 / (1024.0 * 1024.0),
            bytes as f64 / self.machines as f64
        );
    }
}

/// The Speculative inventory of `--seed-count=machines` with the default offerings.
fn inventory(machines: usize) -> Vec<Machine> {
    let catalog = InstanceCatalog::builtin();
    let prices = PriceTable::default();
    let count = i64::try_from(machines).unwrap_or(i64::MAX);
    let offerings = default_offerings(count, &[], "local", "on_demand", &catalog);
    let config = InventoryConfig {
        provider: "libvirt",
        catalog: &catalog,
        prices: &prices,
        require_zones: None,
    };
    build_inventory(&offerings, &config)
        .expect("the default offerings build")
        .machines
}

fn fake(slots: Vec<Machine>) -> FakeHypervisor<SystemClock> {
    FakeHypervisor::new(
        FakeConfig {
            provider: "libvirt".to_owned(),
            slots,
            delay_min: Duration::ZERO,
            delay_max: Duration::ZERO,
            seed: 1,
            fault_hooks: false,
            slow_ok_delay: Duration::from_secs(1),
        },
        SystemClock,
    )
}

async fn client(addr: std::net::SocketAddr) -> Result<CapacityProviderClient<Channel>, BoxError> {
    let channel = Channel::from_shared(format!("http://{addr}"))?
        .connect()
        .await?;
    Ok(CapacityProviderClient::new(channel).max_decoding_message_size(usize::MAX))
}

/// Lets the server finish dropping what it sent (its side of a call ends after the client's).
async fn settle() {
    tokio::time::sleep(Duration::from_millis(300)).await;
}

/// The domain core and the in-memory store, each measured on its own from one describe().
async fn core_and_store(table: &mut Table, slots: Vec<Machine>) -> Result<(), BoxError> {
    let fake = fake(slots);
    let before = live();
    let described = fake.describe().await?;
    table.row("  describe() answer (transient)", live() - before, false);
    let before = live();
    let (core, changes) = Core::seed(Policy::default(), described)?;
    table.row(
        "  domain core seeded (records, revision index) + its change set",
        live() - before,
        false,
    );
    let store = MemoryStateStore::new();
    let before = live();
    store.commit(changes).await?;
    table.row(
        "  in-memory store after the seed commit (shares the records)",
        live() - before,
        false,
    );
    drop((core, store));
    Ok(())
}

type Served = (
    std::net::SocketAddr,
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<Result<(), String>>,
);

type BenchProvider =
    app::Assembled<FakeHypervisor<SystemClock>, MemoryStateStore, SystemClock, TokioSpawner>;

/// Serves `provider` on a loopback port as the binary does (`app::serve`).
async fn serve(provider: BenchProvider, metrics: Metrics) -> Result<Served, BoxError> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let config = ServeConfig {
        reflection: false,
        reconcile_interval: None,
        drain_period: Duration::from_secs(1),
        banner: Banner::default(),
        tls: None,
        fault_hooks: false,
        client_identity: IdentityMode::Off,
        limits: app::NetLimits::default(),
    };
    let server = tokio::spawn(async move {
        let shutdown = async move {
            let _ = stopped.await;
        };
        app::serve(provider, metrics, listener, None, config, shutdown)
            .await
            .map_err(|e| e.to_string())
    });
    Ok((addr, stop, server))
}

/// The List memo (and what a second full List leaves behind).
async fn lists(table: &mut Table, c: &mut CapacityProviderClient<Channel>) -> Result<(), BoxError> {
    let before = live();
    let listed = c.list(pb::ListFilter::default()).await?.into_inner();
    let count = listed.machines.len();
    let wire = prost::Message::encoded_len(&listed);
    drop(listed);
    settle().await;
    table.row(
        &format!(
            "List memo after one full List ({count} machines, {} B each on the wire)",
            wire / count.max(1)
        ),
        live() - before,
        true,
    );
    let before = live();
    let again = c.list(pb::ListFilter::default()).await?.into_inner();
    drop(again);
    settle().await;
    table.row(
        "  left behind by a second full List (both ends in this process)",
        live() - before,
        false,
    );
    Ok(())
}

/// What Creates on `ids` (from eight shards) add.
async fn creates(c: &mut CapacityProviderClient<Channel>, ids: &[String]) -> Result<(), BoxError> {
    let before = live();
    for (n, id) in ids.iter().enumerate() {
        c.create(pb::CreateRequest {
            machine_id: id.clone(),
            shard_id: format!("shard-{}", n % 8),
            shard_epoch: 1,
            sequence_number: 1,
        })
        .await?;
    }
    let filter = pb::ListFilter {
        states: vec![pb::MachineState::Creating as i32],
        max_results: 0,
        since_revision: vec![],
    };
    let t = std::time::Instant::now();
    while !c
        .list(filter.clone())
        .await?
        .into_inner()
        .machines
        .is_empty()
    {
        if t.elapsed() > Duration::from_secs(60) {
            return Err("the benchmark's Creates did not finish within 60 s".into());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let bytes = live() - before;
    say!(
        "{:<58} {:>10.2} MiB {:>9.0} B/mutated machine",
        format!(
            "{} Creates: fence marks, op ids, new versions, domains",
            ids.len()
        ),
        bytes as f64 / (1024.0 * 1024.0),
        bytes as f64 / ids.len() as f64
    );
    Ok(())
}

/// Every component at `machines`, as the binary builds them.
pub async fn run(machines: usize) -> Result<(), BoxError> {
    say!("\n== heap by component, {machines} machines (counting allocator, in process) ==");
    let mut table = Table { machines, total: 0 };
    say!("(each part of the provider on its own; not added to the total)");
    core_and_store(&mut table, inventory(machines)).await?;

    let before = live();
    let plan_inventory = inventory(machines);
    let inventory_bytes = live() - before;
    // Creates below go to a tenth of the slots (at most 2,000).
    let mutated = (machines / 10).clamp(1, 2_000);
    let ids: Vec<String> = plan_inventory
        .iter()
        .take(mutated)
        .map(|m| m.id.to_string())
        .collect();
    let ids_bytes = live() - before - inventory_bytes;
    // As the binary's fake_config: the plan's slots move into the fake.
    let fake = fake(plan_inventory);
    table.row(
        "inventory, moved into the fake hypervisor (its slots)",
        live() - before - ids_bytes,
        true,
    );

    let metrics = Metrics::new();
    let before = live();
    let provider = app::assemble(app::Parts {
        config: ProviderConfig::default(),
        hypervisor: fake,
        store: MemoryStateStore::new(),
        clock: SystemClock,
        spawner: TokioSpawner,
        metrics: metrics.clone(),
        observers: Vec::new(),
    })
    .await?;
    table.row(
        "provider assembled: domain core + in-memory store",
        live() - before,
        true,
    );

    let (addr, stop, server) = serve(provider, metrics).await?;
    let mut c = client(addr).await?;
    c.get(pb::MachineRef { id: ids[0].clone() }).await?;
    lists(&mut table, &mut c).await?;
    creates(&mut c, &ids).await?;
    let total = table.total;
    table.row(
        "total of the counted rows (before the Creates)",
        total,
        false,
    );
    drop(c);
    let _ = stop.send(());
    server.await??;
    Ok(())
}
