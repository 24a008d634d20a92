//! The simulated network between shards and the provider, as message delays and drops.
//!
//! madsim-tonic is not used: the provider's gRPC server pulls in tonic-health, reflection,
//! axum and OTLP, which cannot run on madsim's network (see the README). Instead a shard's
//! call travels as a message: a seeded one-way delay, then delivery into the provider
//! node's inbox (where a task calls the generated `CapacityProvider` trait method of the
//! real `CapacityService`), then the reply travels back with its own delay. A dropped
//! request is never delivered; a dropped reply leaves the call indefinite; a partition
//! drops both directions for one shard. A provider that is down refuses at once.

use std::sync::Arc;
use std::time::Duration;

use bigfleet_libvirt_proto::v1alpha1 as pb;
use futures::FutureExt;
use futures::channel::oneshot;
use tonic::Status;

use crate::fakes::clock::elapsed;
use crate::world::World;

/// A call to the provider.
#[derive(Clone, Debug)]
pub enum Rpc {
    /// `Create`.
    Create(pb::CreateRequest),
    /// `Configure`.
    Configure(pb::ConfigureRequest),
    /// `Drain`.
    Drain(pb::DrainRequest),
    /// `Delete`.
    Delete(pb::DeleteRequest),
    /// `Get`.
    Get(pb::MachineRef),
    /// `List`.
    List(pb::ListFilter),
}

/// A successful answer.
#[derive(Clone, Debug)]
pub enum Answer {
    /// A mutating call's acknowledgement.
    Ack(pb::TransitionAck),
    /// A Get.
    Machine(pb::Machine),
    /// A List.
    List(pb::MachineList),
}

/// What the provider answered.
pub type Reply = Result<Answer, Status>;

/// A request in the provider's inbox.
pub struct Envelope {
    /// The call.
    pub rpc: Rpc,
    /// Where the answer goes.
    pub reply: oneshot::Sender<Reply>,
}

/// What the caller learned.
// Outcomes live for one call; boxing the answer would only make matching on it clumsier.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub enum Outcome {
    /// A definite answer.
    Answered(Reply),
    /// Nobody listened (the provider was down): the call certainly did nothing.
    Refused,
    /// No answer before the deadline, or the connection broke: the call may or may not
    /// have taken effect.
    Indefinite(&'static str),
}

/// Who calls: a shard (subject to its faults) or the auditor (the checkers, fault-free).
#[derive(Clone, Copy, Debug)]
pub enum Client {
    /// Shard `index`.
    Shard(usize),
    /// The quiescence checks.
    Auditor,
}

/// One direction of one message: its delay and whether it is lost.
fn leg(world: &World, client: Client) -> (Duration, bool) {
    let net = &world.plan.net;
    let mut rng = world.net_rng();
    let delay = rng.duration(net.delay.0, net.delay.1);
    let Client::Shard(shard) = client else {
        return (delay, false);
    };
    if world.calm() {
        return (delay, false);
    }
    let now = elapsed();
    let cut = net.partitions.iter().any(|w| w.covers(shard, now));
    (delay, cut)
}

async fn sleep_until(deadline: Duration) {
    madsim::time::sleep(deadline.saturating_sub(elapsed())).await;
}

/// Sends `rpc` to the provider and waits for the answer or the caller's deadline.
pub async fn call(world: &Arc<World>, client: Client, rpc: Rpc) -> Outcome {
    let deadline = elapsed() + world.plan.rpc_timeout;
    world.stats().rpcs += 1;
    let outcome = deliver(world, client, rpc, deadline).await;
    match &outcome {
        Outcome::Answered(_) => world.stats().answered += 1,
        Outcome::Indefinite(_) => world.stats().indefinite += 1,
        Outcome::Refused => {}
    }
    outcome
}

async fn deliver(world: &Arc<World>, client: Client, rpc: Rpc, deadline: Duration) -> Outcome {
    let (delay, cut) = leg(world, client);
    let lost = cut || dropped(world, client, true);
    madsim::time::sleep(delay).await;
    if lost {
        sleep_until(deadline).await;
        return Outcome::Indefinite("request lost");
    }
    let Some(endpoint) = world.endpoint() else {
        return Outcome::Refused;
    };
    let (reply, answer) = oneshot::channel();
    if endpoint.unbounded_send(Envelope { rpc, reply }).is_err() {
        return Outcome::Refused;
    }
    let answer = futures::select_biased! {
        answer = answer.fuse() => answer,
        () = sleep_until(deadline).fuse() => return Outcome::Indefinite("no answer in time"),
    };
    let Ok(answer) = answer else {
        // The provider died with the call in hand: the connection resets.
        return Outcome::Indefinite("connection reset");
    };
    let (delay, cut) = leg(world, client);
    if cut || dropped(world, client, false) {
        sleep_until(deadline).await;
        return Outcome::Indefinite("reply lost");
    }
    futures::select_biased! {
        () = madsim::time::sleep(delay).fuse() => Outcome::Answered(answer),
        () = sleep_until(deadline).fuse() => Outcome::Indefinite("answer too late"),
    }
}

fn dropped(world: &World, client: Client, request: bool) -> bool {
    if world.calm() || matches!(client, Client::Auditor) {
        return false;
    }
    let net = &world.plan.net;
    let rate = if request {
        net.drop_request
    } else {
        net.drop_reply
    };
    world.net_rng().chance(rate)
}
