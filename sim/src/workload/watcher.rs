//! A shard's watcher: keeps a view of the inventory from `since_revision` deltas for the
//! whole run, across provider restarts, partitions and lost replies. At quiescence the
//! checkers compare it with a full List: since_revision must never miss a change.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use bigfleet_libvirt_domain::parse_cursor;
use bigfleet_libvirt_proto::v1alpha1 as pb;

use crate::history::Event;
use crate::net::{self, Answer, Client, Outcome, Rpc};
use crate::rng::SimRng;
use crate::world::World;

/// The watcher's cursor and view.
#[derive(Clone, Debug, Default)]
pub struct WatcherView {
    /// The last revision received, as sent back (`None` before the first List).
    pub cursor: Option<Vec<u8>>,
    /// Every machine as last seen.
    pub machines: BTreeMap<String, pb::Machine>,
}

impl WatcherView {
    /// Folds one List answer in.
    pub fn apply(&mut self, list: pb::MachineList) {
        for machine in list.machines {
            self.machines.insert(machine.id.clone(), machine);
        }
        self.cursor = Some(list.revision);
    }
}

/// Every shard's watcher view, kept for the whole run (the final checks compare each with
/// a full List).
#[derive(Debug)]
pub struct Watchers(Mutex<Vec<WatcherView>>);

impl Watchers {
    /// An empty view for each of `shards` shards.
    #[must_use]
    pub fn new(shards: usize) -> Self {
        Self(Mutex::new(vec![WatcherView::default(); shards]))
    }

    /// Shard `shard`'s view now.
    #[must_use]
    pub fn view(&self, shard: usize) -> WatcherView {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)[shard].clone()
    }

    /// Folds a List answer into shard `shard`'s view.
    pub fn apply(&self, shard: usize, list: pb::MachineList) {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)[shard].apply(list);
    }
}

/// Sends one delta List for `view` as `client` and records it in the history; returns the
/// answer.
pub async fn delta(
    world: &Arc<World>,
    client: Client,
    view: &WatcherView,
) -> Option<pb::MachineList> {
    let sent = world.record(Event::Listing);
    let cursor = view.cursor.as_deref().and_then(parse_cursor);
    let filter = pb::ListFilter {
        since_revision: view.cursor.clone().unwrap_or_default(),
        ..pb::ListFilter::default()
    };
    let list = match net::call(world, client, Rpc::List(filter)).await {
        Outcome::Answered(Ok(Answer::List(list))) => Some(list),
        _ => None,
    };
    let answered = list.clone();
    world.record(Event::Listed { sent, list, cursor });
    answered
}

/// Polls deltas every few seconds until faults stop, into shard `shard`'s view.
pub async fn run_watcher(world: Arc<World>, shard: usize, watchers: Arc<Watchers>) {
    let mut rng = SimRng::stream(world.plan.seed, &format!("watcher-{shard}"));
    while !world.calm() {
        let wait = rng.duration(Duration::from_millis(500), Duration::from_secs(3));
        madsim::time::sleep(wait).await;
        let view = watchers.view(shard);
        if let Some(list) = delta(&world, Client::Shard(shard), &view).await {
            let changed = list.machines.len();
            watchers.apply(shard, list);
            world.trace(format!("watcher-{shard} delta changed={changed}"));
        }
    }
}
