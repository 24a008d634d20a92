//! The network between shards and the provider: madsim's simulated network, plus the
//! plan's faults on top.
//!
//! Every call is one connection over `madsim::net` from the caller's node to the provider
//! node's listener at [`PROVIDER_ADDR`] (madsim adds its own 1–10 ms per message), where a
//! task calls the generated `CapacityProvider` trait method of the real `CapacityService`
//! and sends the answer back on the same connection — a unary gRPC call's shape. madsim-
//! tonic itself is not used: the provider's gRPC server pulls in tonic-health, reflection,
//! axum and OTLP, which cannot run on madsim's network (see the README).
//!
//! The plan's faults apply per leg, drawn from the seed: an extra one-way delay, a dropped
//! request (never sent), a dropped reply (received and discarded, so the call is
//! indefinite) and partitions that drop both directions for one shard. A provider that is
//! down refuses the connection at once; one that dies with the call in hand resets it.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use bigfleet_libvirt_proto::v1alpha1 as pb;
use futures::FutureExt;
use madsim::net::Endpoint;
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

/// The provider node's address.
pub const PROVIDER_IP: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1));

/// Where the provider listens.
pub const PROVIDER_ADDR: SocketAddr = SocketAddr::new(PROVIDER_IP, 9000);

/// The address of shard `index`'s node.
#[must_use]
pub fn shard_ip(index: usize) -> IpAddr {
    let index = u32::try_from(index).expect("shard count fits an IPv4 host part");
    IpAddr::V4(Ipv4Addr::from(
        u32::from(Ipv4Addr::new(10, 0, 1, 0)) + index,
    ))
}

/// The auditor's node (the quiescence checks).
pub const AUDITOR_IP: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 0, 2, 1));

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
    let answer = futures::select_biased! {
        outcome = exchange(rpc).fuse() => match outcome {
            Ok(answer) => answer,
            Err(outcome) => return outcome,
        },
        () = sleep_until(deadline).fuse() => return Outcome::Indefinite("no answer in time"),
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

/// One call on its own connection: connect, send the request, wait for the answer.
async fn exchange(rpc: Rpc) -> Result<Reply, Outcome> {
    let endpoint = Endpoint::bind("0.0.0.0:0")
        .await
        .expect("the caller's node has an address");
    // Nobody listens while the provider is down (or not yet serving): refused, so the
    // call certainly did nothing.
    let (tx, mut rx) = endpoint
        .connect1(PROVIDER_ADDR)
        .await
        .map_err(|_| Outcome::Refused)?;
    tx.send(Box::new(rpc))
        .await
        .map_err(|_| Outcome::Indefinite("connection reset"))?;
    // The provider died with the call in hand: the connection resets.
    let payload = rx
        .recv()
        .await
        .map_err(|_| Outcome::Indefinite("connection reset"))?;
    let reply = payload
        .downcast::<Reply>()
        .expect("the provider answers with a Reply");
    Ok(*reply)
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
