//! `List`'s response on the server side: a `MachineList` whose machines arrive already
//! encoded.
//!
//! A provider answering full Lists of 100k machines would otherwise convert and encode
//! every record on every call, although almost none changed since the last one. With
//! [`EncodedMachineList`] it hands over each machine's own encoding (kept from the previous
//! call when the record did not change) and [`ListCodec`] writes them out with the field
//! key and length prefix prost would have written. The bytes on the wire are exactly
//! `MachineList`'s, so clients decode it with the generated type.

use std::sync::Arc;

use prost::Message;
use prost::bytes::BufMut;
use prost::encoding::{WireType, encode_key, encode_varint, encoded_len_varint, key_len};
use tonic::Status;
use tonic::codec::{Codec, EncodeBuf, Encoder};
use tonic_prost::ProstDecoder;

use crate::v1alpha1::{ListFilter, Machine, MachineList};

/// `MachineList.machines`.
const MACHINES: u32 = 1;
/// `MachineList.revision`.
const REVISION: u32 = 2;

/// A `MachineList` with every machine already encoded.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EncodedMachineList {
    /// Each machine's encoding as a `Machine` message (no field key, no length prefix).
    pub machines: Vec<Arc<[u8]>>,
    /// `MachineList.revision`.
    pub revision: Vec<u8>,
}

impl EncodedMachineList {
    /// Encodes each machine of `list` on its own.
    #[must_use]
    pub fn from_list(list: &MachineList) -> Self {
        Self {
            machines: list
                .machines
                .iter()
                .map(|m| Arc::from(m.encode_to_vec()))
                .collect(),
            revision: list.revision.clone(),
        }
    }

    /// One machine's encoding, for [`Self::machines`].
    #[must_use]
    pub fn encode_machine(machine: &Machine) -> Vec<u8> {
        machine.encode_to_vec()
    }

    /// The length of the encoded `MachineList`.
    #[must_use]
    pub fn encoded_len(&self) -> usize {
        let machines: usize = self
            .machines
            .iter()
            .map(|m| key_len(MACHINES) + encoded_len_varint(m.len() as u64) + m.len())
            .sum();
        let revision = if self.revision.is_empty() {
            0
        } else {
            key_len(REVISION) + encoded_len_varint(self.revision.len() as u64) + self.revision.len()
        };
        machines + revision
    }

    /// Writes the `MachineList` encoding: the machines in order, then the revision unless
    /// it is empty (proto3 omits empty scalars), as prost does.
    pub fn encode_raw(&self, buf: &mut impl BufMut) {
        for machine in &self.machines {
            encode_key(MACHINES, WireType::LengthDelimited, buf);
            encode_varint(machine.len() as u64, buf);
            buf.put_slice(machine);
        }
        if !self.revision.is_empty() {
            encode_key(REVISION, WireType::LengthDelimited, buf);
            encode_varint(self.revision.len() as u64, buf);
            buf.put_slice(&self.revision);
        }
    }

    /// The `MachineList` encoding as a vector.
    #[must_use]
    pub fn encode_to_vec(&self) -> Vec<u8> {
        let mut buf = Vec::with_capacity(self.encoded_len());
        self.encode_raw(&mut buf);
        buf
    }

    /// Decodes into the generated type (for in-process callers such as the simulator).
    ///
    /// # Errors
    /// When a machine's bytes are not a valid `Machine` encoding.
    pub fn to_list(&self) -> Result<MachineList, prost::DecodeError> {
        MachineList::decode(self.encode_to_vec().as_slice())
    }
}

/// Writes an [`EncodedMachineList`]'s encoding a piece at a time, for an answer streamed to
/// its reader instead of copied into one buffer: the machines' own encodings are read in
/// place, and only the piece being written is allocated.
#[derive(Debug)]
pub struct Pieces {
    list: Arc<EncodedMachineList>,
    /// The next machine to write; `machines.len()` means the revision is next.
    next: usize,
    done: bool,
}

impl Pieces {
    /// The pieces of `list`'s `MachineList` encoding, in order.
    #[must_use]
    pub fn new(list: Arc<EncodedMachineList>) -> Self {
        Self {
            list,
            next: 0,
            done: false,
        }
    }

    /// The next piece: whole machines up to about `target` bytes (at least one machine),
    /// then the revision. `None` once everything was written. The pieces concatenated are
    /// exactly [`EncodedMachineList::encode_to_vec`].
    pub fn next_piece(&mut self, target: usize) -> Option<prost::bytes::Bytes> {
        if self.done {
            return None;
        }
        let mut buf = Vec::with_capacity(target.min(self.list.encoded_len()));
        while let Some(machine) = self.list.machines.get(self.next) {
            if !buf.is_empty() && buf.len() + machine.len() + 16 > target {
                return Some(buf.into());
            }
            encode_key(MACHINES, WireType::LengthDelimited, &mut buf);
            encode_varint(machine.len() as u64, &mut buf);
            buf.put_slice(machine);
            self.next += 1;
        }
        let revision = &self.list.revision;
        if !revision.is_empty() {
            encode_key(REVISION, WireType::LengthDelimited, &mut buf);
            encode_varint(revision.len() as u64, &mut buf);
            buf.put_slice(revision);
        }
        self.done = true;
        (!buf.is_empty()).then(|| buf.into())
    }
}

/// The `List` codec: decodes the `ListFilter` request with prost and encodes the
/// [`EncodedMachineList`] response.
#[derive(Clone, Copy, Debug, Default)]
pub struct ListCodec;

impl Codec for ListCodec {
    type Encode = EncodedMachineList;
    type Decode = ListFilter;
    type Encoder = ListEncoder;
    type Decoder = ProstDecoder<ListFilter>;

    fn encoder(&mut self) -> Self::Encoder {
        ListEncoder
    }

    fn decoder(&mut self) -> Self::Decoder {
        ProstDecoder::new(tonic::codec::BufferSettings::default())
    }
}

/// Encodes an [`EncodedMachineList`] into the response buffer.
#[derive(Clone, Copy, Debug, Default)]
pub struct ListEncoder;

impl Encoder for ListEncoder {
    type Item = EncodedMachineList;
    type Error = Status;

    fn encode(&mut self, item: Self::Item, dst: &mut EncodeBuf<'_>) -> Result<(), Self::Error> {
        dst.reserve(item.encoded_len());
        item.encode_raw(dst);
        Ok(())
    }
}
