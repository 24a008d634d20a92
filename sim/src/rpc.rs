//! A call to the provider and its answer as values: what a caller sends through the
//! simulated network (`net`), what the provider's server answers (`server`), and what the
//! history records of both (`history`).

use bigfleet_libvirt_proto::v1alpha1 as pb;
use bigfleet_libvirt_proto::wire::EncodedMachineList;
use madsim_tonic::Status;

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

/// The message of the status a call whose caller gave up ends with. No caller reads it (the
/// shard's client turns it into an indefinite outcome, `net::exchange`); it only keeps the
/// simulated exchange going where a real stream would simply be reset.
pub const CALLER_GAVE_UP: &str = "the simulated caller gave up on this call";

/// Decodes a List answer as a client would decode it from the wire.
pub fn decode_list(list: &EncodedMachineList) -> Reply {
    list.to_list()
        .map(Answer::List)
        .map_err(|e| Status::internal(format!("List answer does not decode: {e}")))
}
