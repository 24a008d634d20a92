//! A shard's watcher: keeps a view of the inventory from `since_revision` deltas for the
//! whole run, across provider restarts, partitions and lost replies. At quiescence the
//! checkers compare it with a full List: since_revision must never miss a change.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use bigfleet_libvirt_domain::parse_cursor;
use bigfleet_libvirt_proto::v1alpha1 as pb;

use crate::checkers::online;
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

/// Sends one delta List for `view` as `client`; returns the answer.
pub async fn delta(
    world: &Arc<World>,
    client: Client,
    view: &WatcherView,
) -> Option<pb::MachineList> {
    let floor = world.ledger().max_revision;
    let cursor = view.cursor.as_deref().and_then(parse_cursor);
    let filter = pb::ListFilter {
        since_revision: view.cursor.clone().unwrap_or_default(),
        ..pb::ListFilter::default()
    };
    let Outcome::Answered(Ok(Answer::List(list))) =
        net::call(world, client, Rpc::List(filter)).await
    else {
        return None;
    };
    online::on_list(world, &list, floor, cursor);
    Some(list)
}

/// Polls deltas every few seconds until faults stop.
pub async fn run_watcher(world: Arc<World>, shard: usize) {
    let mut rng = SimRng::stream(world.plan.seed, &format!("watcher-{shard}"));
    while !world.calm() {
        let wait = rng.duration(Duration::from_millis(500), Duration::from_secs(3));
        madsim::time::sleep(wait).await;
        let view = world.watchers()[shard].clone();
        if let Some(list) = delta(&world, Client::Shard(shard), &view).await {
            let changed = list.machines.len();
            world.watchers()[shard].apply(list);
            world.trace(format!("watcher-{shard} delta changed={changed}"));
        }
    }
}
