//! The network between shards and the provider: gRPC over madsim's simulated network,
//! plus the plan's faults on top.
//!
//! Every call goes through the generated `CapacityProviderClient` on a madsim-tonic
//! `Channel` to the madsim-tonic `Server` on the provider node at [`PROVIDER_ADDR`]
//! (`server.rs`). madsim-tonic opens one simulated connection per call (after a handshake
//! connection) and carries the request and the answer as values; madsim adds its own
//! 1–10 ms per message.
//!
//! The plan's faults apply per leg, drawn from the seed, as decisions around the call: an
//! extra one-way delay, a dropped request (never sent), a dropped reply (received and
//! discarded, so the call is indefinite) and partitions that drop both directions for one
//! shard. A provider that is down refuses the connection at once; one that dies with the
//! call in hand resets it (see [`transport_failure`]).

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use bigfleet_libvirt_proto::v1alpha1 as pb;
use futures::FutureExt;
use madsim_tonic::Status;
use madsim_tonic::transport::Endpoint;
use pb::capacity_provider_client::CapacityProviderClient;

pub use crate::rpc::{Answer, Reply, Rpc};
use crate::rpc::{CALLER_GAVE_UP, decode_list};
use crate::time::elapsed;
use crate::world::World;

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

/// One call through the generated client: madsim-tonic connects, sends the request and
/// waits for the answer on a connection of its own.
async fn exchange(rpc: Rpc) -> Result<Reply, Outcome> {
    let endpoint = Endpoint::from_shared(format!("http://{PROVIDER_ADDR}"))
        .expect("the provider's address is a valid URI");
    let mut client = CapacityProviderClient::new(endpoint.connect_lazy());
    let reply = match rpc {
        Rpc::Create(r) => client.create(r).await.map(|a| Answer::Ack(a.into_inner())),
        Rpc::Configure(r) => client
            .configure(r)
            .await
            .map(|a| Answer::Ack(a.into_inner())),
        Rpc::Drain(r) => client.drain(r).await.map(|a| Answer::Ack(a.into_inner())),
        Rpc::Delete(r) => client.delete(r).await.map(|a| Answer::Ack(a.into_inner())),
        Rpc::Get(r) => client.get(r).await.map(|m| Answer::Machine(m.into_inner())),
        // madsim-tonic hands over the server's `EncodedMachineList` itself; decode it as a
        // client decodes the bytes.
        Rpc::List(r) => client.list(r).await.and_then(|l| decode_list(l.get_ref())),
    };
    match reply {
        Err(status) => match transport_failure(&status) {
            Some(outcome) => Err(outcome),
            None => Ok(Err(status)),
        },
        answer => Ok(answer),
    }
}

/// What a status the transport made (rather than the provider) means for the call.
///
/// madsim-tonic turns a failed simulated connection into a status on the client side
/// (`From<io::Error>`, code UNAVAILABLE), while every status the server answers carries
/// the `content-type` its server appends, so the metadata tells them apart. Nobody
/// listening (the provider is down or not yet serving) fails the connect — "transport
/// error" from the handshake, "connection refused" from the call's own connection — before
/// the request is sent: refused, so the call certainly did nothing. A connection that
/// breaks afterwards ("connection reset": the provider died with the call in hand) leaves
/// it indefinite.
///
/// A call the caller gave up on (`rpc::CALLER_GAVE_UP`) is indefinite too: a real client
/// that cancels sees only its own deadline or reset, never the provider's answer.
fn transport_failure(status: &Status) -> Option<Outcome> {
    if status.code() == madsim_tonic::Code::Cancelled && status.message() == CALLER_GAVE_UP {
        return Some(Outcome::Indefinite("caller gave up"));
    }
    if status.metadata().contains_key("content-type") {
        return None;
    }
    Some(match status.message() {
        "transport error" | "connection refused" => Outcome::Refused,
        _ => Outcome::Indefinite("connection reset"),
    })
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
