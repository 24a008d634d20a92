//! Clients (the generated one and a raw-bytes List codec) and the calls the phases send.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, Instant};

use bigfleet_libvirt_proto::v1alpha1 as pb;
use pb::capacity_provider_client::CapacityProviderClient;
use prost::Message;
use prost::bytes::{Buf, Bytes};
use tokio::net::TcpListener;
use tokio::sync::Barrier;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::codegen::http::uri::PathAndQuery;
use tonic::transport::Channel;
use tonic::{Request, Status};

use super::*;

// ---------------------------------------------------------------------------------------
// Clients

/// A loopback listener on a fresh port.
pub(crate) async fn listen() -> Result<TcpListener, BoxError> {
    Ok(TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], 0))).await?)
}

pub(crate) async fn connect(addr: SocketAddr) -> Result<Channel, BoxError> {
    Ok(Channel::from_shared(format!("http://{addr}"))?
        .connect()
        .await?)
}

pub(crate) fn client(channel: &Channel) -> Client {
    CapacityProviderClient::new(channel.clone()).max_decoding_message_size(usize::MAX)
}

/// Sends a prost-encoded `ListFilter` and hands back the response body undecoded.
#[derive(Clone, Copy, Debug, Default)]
struct RawListCodec;

#[derive(Clone, Copy, Debug, Default)]
struct ListFilterEncoder;

#[derive(Clone, Copy, Debug, Default)]
struct RawBytesDecoder;

impl Codec for RawListCodec {
    type Encode = pb::ListFilter;
    type Decode = Bytes;
    type Encoder = ListFilterEncoder;
    type Decoder = RawBytesDecoder;

    fn encoder(&mut self) -> Self::Encoder {
        ListFilterEncoder
    }

    fn decoder(&mut self) -> Self::Decoder {
        RawBytesDecoder
    }
}

impl Encoder for ListFilterEncoder {
    type Item = pb::ListFilter;
    type Error = Status;

    fn encode(&mut self, item: Self::Item, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        item.encode(dst)
            .map_err(|e| Status::internal(format!("encode ListFilter: {e}")))
    }
}

impl Decoder for RawBytesDecoder {
    type Item = Bytes;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Bytes>, Status> {
        let n = src.remaining();
        Ok(Some(src.copy_to_bytes(n)))
    }
}

pub(crate) struct RawClient {
    grpc: tonic::client::Grpc<Channel>,
}

impl RawClient {
    pub(crate) fn new(channel: &Channel) -> Self {
        Self {
            grpc: tonic::client::Grpc::new(channel.clone()).max_decoding_message_size(usize::MAX),
        }
    }

    pub(crate) async fn list(&mut self, filter: pb::ListFilter) -> Result<Bytes, BoxError> {
        self.grpc.ready().await?;
        let path = PathAndQuery::from_static("/bigfleet.v1alpha1.CapacityProvider/List");
        let response = self
            .grpc
            .unary(Request::new(filter), path, RawListCodec)
            .await?;
        Ok(response.into_inner())
    }
}

// ---------------------------------------------------------------------------------------
// Calls

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Rpc {
    Create,
    Configure,
    Drain,
    Delete,
    Get,
}

impl Rpc {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Rpc::Create => "Create",
            Rpc::Configure => "Configure",
            Rpc::Drain => "Drain",
            Rpc::Delete => "Delete",
            Rpc::Get => "Get",
        }
    }

    pub(crate) fn mutating(self) -> bool {
        self != Rpc::Get
    }
}

enum Call {
    Create(pb::CreateRequest),
    Configure(pb::ConfigureRequest),
    Drain(pb::DrainRequest),
    Delete(pb::DeleteRequest),
    Get(pb::MachineRef),
}

/// A request as a fenced BigFleet shard would send it.
fn build_call(rpc: Rpc, id: &str, sequence: i64, blob: &[u8]) -> Call {
    let shard_id = SHARD.to_owned();
    let machine_id = id.to_owned();
    match rpc {
        Rpc::Create => Call::Create(pb::CreateRequest {
            machine_id,
            shard_id,
            shard_epoch: 1,
            sequence_number: sequence,
        }),
        Rpc::Configure => Call::Configure(pb::ConfigureRequest {
            machine_id,
            cluster_id: CLUSTER.to_owned(),
            bootstrap_blob: blob.to_vec(),
            shard_id,
            shard_epoch: 1,
            sequence_number: sequence,
            shard_metadata: [("bench".to_owned(), "1".to_owned())].into(),
        }),
        Rpc::Drain => Call::Drain(pb::DrainRequest {
            machine_id,
            grace_period_seconds: 0,
            shard_id,
            shard_epoch: 1,
            sequence_number: sequence,
        }),
        Rpc::Delete => Call::Delete(pb::DeleteRequest {
            machine_id,
            shard_id,
            shard_epoch: 1,
            sequence_number: sequence,
        }),
        Rpc::Get => Call::Get(pb::MachineRef { id: machine_id }),
    }
}

async fn send(client: &mut Client, call: Call) -> Result<(), Status> {
    match call {
        Call::Create(r) => client.create(r).await.map(drop),
        Call::Configure(r) => client.configure(r).await.map(drop),
        Call::Drain(r) => client.drain(r).await.map(drop),
        Call::Delete(r) => client.delete(r).await.map(drop),
        Call::Get(r) => client.get(r).await.map(drop),
    }
}

/// The outcome of one timed batch.
pub(crate) struct Run {
    pub(crate) samples: Samples,
    pub(crate) wall: Duration,
    pub(crate) errors: usize,
    pub(crate) first_error: Option<String>,
}

/// Runs one worker per chunk, all released together; each sends its calls one after the
/// other and times each from just before the send to the decoded answer.
pub(crate) async fn run_batch(
    channel: &Channel,
    rpc: Rpc,
    chunks: &[Vec<String>],
    sequence: &Arc<AtomicI64>,
    blob: &Arc<Vec<u8>>,
) -> Result<Run, BoxError> {
    let barrier = Arc::new(Barrier::new(chunks.len() + 1));
    let mut handles = Vec::with_capacity(chunks.len());
    for chunk in chunks {
        let mut client = client(channel);
        let chunk = chunk.clone();
        let barrier = Arc::clone(&barrier);
        let sequence = Arc::clone(sequence);
        let blob = Arc::clone(blob);
        handles.push(tokio::spawn(async move {
            let mut latencies = Vec::with_capacity(chunk.len());
            let mut errors = 0usize;
            let mut first_error = None;
            barrier.wait().await;
            let began = Instant::now();
            for id in &chunk {
                let call = build_call(rpc, id, sequence.fetch_add(1, Ordering::Relaxed), &blob);
                let started = Instant::now();
                let result = send(&mut client, call).await;
                let elapsed = started.elapsed();
                match result {
                    Ok(()) => latencies.push(elapsed),
                    Err(status) => {
                        errors += 1;
                        first_error.get_or_insert_with(|| format!("{id}: {status}"));
                    }
                }
            }
            (latencies, errors, first_error, began, Instant::now())
        }));
    }
    barrier.wait().await;
    let mut all = Vec::new();
    let mut errors = 0;
    let mut first_error = None;
    let mut span: Option<(Instant, Instant)> = None;
    for handle in handles {
        let (latencies, e, first, began, ended) = handle.await?;
        span = Some(span.map_or((began, ended), |(b, e)| (b.min(began), e.max(ended))));
        all.extend(latencies);
        errors += e;
        if first_error.is_none() {
            first_error = first;
        }
    }
    Ok(Run {
        samples: Samples::new(all),
        wall: span.map_or(Duration::ZERO, |(b, e)| e.duration_since(b)),
        errors,
        first_error,
    })
}

pub(crate) fn list_filter(
    states: &[pb::MachineState],
    max_results: i32,
    since: Vec<u8>,
) -> pb::ListFilter {
    pb::ListFilter {
        states: states.iter().map(|s| *s as i32).collect(),
        max_results,
        since_revision: since,
    }
}

/// Waits until no machine is mid-transition, then checks that every id in `ids` is in
/// `target`. Returns how long the wait took.
pub(crate) async fn settle(
    client: &mut Client,
    ids: &[String],
    target: pb::MachineState,
) -> Result<Duration, BoxError> {
    use pb::MachineState as S;
    let started = Instant::now();
    let busy = [S::Creating, S::Configuring, S::Draining, S::Deleting];
    loop {
        let page = client
            .list(list_filter(&busy, 1, Vec::new()))
            .await?
            .into_inner();
        if page.machines.is_empty() {
            break;
        }
        if started.elapsed() > WAIT_TIMEOUT {
            return Err(format!("machines still mid-transition after {WAIT_TIMEOUT:?}").into());
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let waited = started.elapsed();
    let in_target: HashSet<String> = client
        .list(list_filter(&[target], 0, Vec::new()))
        .await?
        .into_inner()
        .machines
        .into_iter()
        .map(|m| m.id)
        .collect();
    let missing: Vec<&String> = ids.iter().filter(|id| !in_target.contains(*id)).collect();
    if let Some(first) = missing.first() {
        let state = client
            .get(pb::MachineRef {
                id: (*first).clone(),
            })
            .await?
            .into_inner();
        return Err(format!(
            "{} of {} machines did not reach {target:?}; e.g. {first} is {:?} ({})",
            missing.len(),
            ids.len(),
            pb::MachineState::try_from(state.state).unwrap_or(S::Unspecified),
            state.last_error
        )
        .into());
    }
    Ok(waited)
}
