//! The memory budget for List answers held for their readers, and the turn-taking of large
//! List builds.
//!
//! A full List of a large inventory is one message of many megabytes. tonic encodes it into
//! one buffer, which lives until HTTP/2 has sent it: for as long as its reader takes to read
//! it. Without a bound, readers that ask for full Lists and read slowly make the process hold
//! one such buffer each, without limit. Here:
//!
//! - a *large* answer (estimated above [`LARGE_ANSWER`] bytes) is built only when it is its
//!   turn (one at a time, first come first served), off the async workers, so other calls
//!   keep their threads;
//! - before it is handed to tonic it takes its size from the budget (`--list-memory-budget-mib`),
//!   waiting while the answers already held use it up; an answer larger than the whole budget
//!   takes all of it. List never fails for the budget: it waits;
//! - the share is given back when the answer's HTTP/2 body is dropped: once it has been sent,
//!   or its stream reset, or its connection closed ([`release_when_sent`]).
//!
//! Small answers (picks with `max_results`, deltas since a revision) are not counted: each is
//! bounded by [`LARGE_ANSWER`], and their number by the connection and stream caps.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll, ready};

use bigfleet_libvirt_proto::wire::{EncodedMachineList, Pieces};
use http_body::Frame;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tonic::codegen::Bytes;

/// The size above which an answer is built in turn and counted against the budget.
pub const LARGE_ANSWER: usize = 1 << 20;

/// The default budget (`--list-memory-budget-mib`): with the chart's default memory limit
/// of 256 MiB, 64 MiB of held answers leaves room for a 100,000-machine inventory's
/// baseline.
pub const DEFAULT_BUDGET_MIB: usize = 64;

/// What one machine's encoding is taken to weigh before any large List was built.
const FIRST_GUESS_PER_MACHINE: usize = 256;

/// The budget's unit: semaphore permits are KiB.
const UNIT: usize = 1024;

/// The List memory budget, shared by every List call of the process.
#[derive(Clone, Debug)]
pub struct ListBudget {
    turn: Arc<Semaphore>,
    held: Arc<Semaphore>,
    units: usize,
    /// Bytes per machine of the last large answer, for estimating the next one.
    per_machine: Arc<AtomicUsize>,
}

/// A share of the budget, kept by an answer until its body is dropped.
#[derive(Clone, Debug)]
pub struct HeldAnswer(#[allow(dead_code)] Arc<OwnedSemaphorePermit>);

impl ListBudget {
    /// A budget of `mib` MiB (at least 1).
    #[must_use]
    pub fn new(mib: usize) -> Self {
        let units = mib.max(1).saturating_mul(1024);
        Self {
            turn: Arc::new(Semaphore::new(1)),
            held: Arc::new(Semaphore::new(units)),
            units,
            per_machine: Arc::new(AtomicUsize::new(FIRST_GUESS_PER_MACHINE)),
        }
    }

    /// The budget in bytes.
    #[must_use]
    pub fn bytes(&self) -> usize {
        self.units.saturating_mul(UNIT)
    }

    /// Whether an answer of at most `machines` machines may be large.
    #[must_use]
    pub fn may_be_large(&self, machines: usize) -> bool {
        machines.saturating_mul(self.per_machine.load(Ordering::Relaxed)) > LARGE_ANSWER
    }

    /// Waits for this large List's turn to be built; the turn ends when the guard drops.
    pub async fn turn(&self) -> OwnedSemaphorePermit {
        Arc::clone(&self.turn)
            .acquire_owned()
            .await
            .expect("the List turn semaphore is never closed")
    }

    /// Waits until an answer of `bytes` over `machines` machines fits in the budget and
    /// takes its share (`None` for an answer too small to count).
    pub async fn hold(&self, bytes: usize, machines: usize) -> Option<HeldAnswer> {
        self.observe(bytes, machines);
        if bytes <= LARGE_ANSWER {
            return None;
        }
        let units = bytes.div_ceil(UNIT).min(self.units);
        let units = u32::try_from(units).unwrap_or(u32::MAX);
        let permit = Arc::clone(&self.held)
            .acquire_many_owned(units)
            .await
            .expect("the List budget semaphore is never closed");
        Some(HeldAnswer(Arc::new(permit)))
    }

    /// Learns what an answer of `machines` machines weighed, for the next estimate.
    pub fn observe(&self, bytes: usize, machines: usize) {
        if let Some(per_machine) = bytes.checked_div(machines) {
            self.per_machine
                .store(per_machine.max(1), Ordering::Relaxed);
        }
    }

    /// Bytes of the budget in use now (for metrics and tests).
    #[must_use]
    pub fn in_use(&self) -> usize {
        (self.units - self.held.available_permits()).saturating_mul(UNIT)
    }
}

/// About how much of a streamed answer is handed to HTTP/2 at a time.
const CHUNK: usize = 64 * 1024;

/// A large List answer that the gRPC layer streams to its reader from the machines' own
/// encodings ([`release_when_sent`]), with its share of the budget. The handler answers tonic
/// with an empty `MachineList` and puts this in the response's extensions; only a server with
/// that layer may do so (`CapacityService::with_streamed_lists`).
#[derive(Clone, Debug)]
pub struct StreamedList {
    answer: Arc<EncodedMachineList>,
    held: Option<HeldAnswer>,
}

impl StreamedList {
    /// `answer`, to be streamed while `held` is kept.
    #[must_use]
    pub fn new(answer: EncodedMachineList, held: Option<HeldAnswer>) -> Self {
        Self {
            answer: Arc::new(answer),
            held,
        }
    }
}

/// Streams a [`StreamedList`] found in a response's extensions: the body becomes the gRPC
/// message written piece by piece (about [`CHUNK`] bytes a frame, each made only once HTTP/2
/// asked for it), followed by tonic's own trailers. The answer's share of the budget is given
/// back when this body is dropped: after its last frame was taken, or when its stream was
/// reset or its connection closed. So a slow reader holds the machines' encodings it has not
/// read yet, never a copy of the whole answer, and never past the budget.
#[must_use]
pub fn release_when_sent(
    mut response: http::Response<tonic::body::Body>,
) -> http::Response<tonic::body::Body> {
    let Some(streamed) = response.extensions_mut().remove::<StreamedList>() else {
        return response;
    };
    response.map(|inner| {
        tonic::body::Body::new(Streamed {
            inner,
            prefix: Some(streamed.answer.encoded_len()),
            pieces: Pieces::new(Arc::clone(&streamed.answer)),
            _held: streamed.held,
        })
    })
}

/// The body of a streamed List answer.
struct Streamed {
    /// tonic's body for the empty stand-in message: its data is dropped, its trailers kept.
    inner: tonic::body::Body,
    /// The message length, until the gRPC length prefix was written.
    prefix: Option<usize>,
    pieces: Pieces,
    _held: Option<HeldAnswer>,
}

impl http_body::Body for Streamed {
    type Data = Bytes;
    type Error = tonic::Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, tonic::Status>>> {
        let this = &mut *self;
        if let Some(len) = this.prefix.take() {
            let Ok(len) = u32::try_from(len) else {
                return Poll::Ready(Some(Err(tonic::Status::resource_exhausted(format!(
                    "the List answer is {len} bytes, more than one gRPC message can carry; \
                     ask for fewer machines with max_results"
                )))));
            };
            let mut header = Vec::with_capacity(5);
            header.push(0); // not compressed
            header.extend_from_slice(&len.to_be_bytes());
            return Poll::Ready(Some(Ok(Frame::data(Bytes::from(header)))));
        }
        if let Some(piece) = this.pieces.next_piece(CHUNK) {
            return Poll::Ready(Some(Ok(Frame::data(piece))));
        }
        loop {
            match ready!(Pin::new(&mut this.inner).poll_frame(cx)) {
                // The stand-in's empty message: the real one was written above.
                Some(Ok(frame)) if frame.is_data() => {}
                other => return Poll::Ready(other),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn answers_wait_while_the_budget_is_held_and_get_it_back_when_dropped() {
        let budget = ListBudget::new(4);
        assert_eq!(budget.hold(LARGE_ANSWER, 1000).await.map(|_| ()), None);
        let first = budget.hold(3 << 20, 1000).await.expect("large");
        assert_eq!(budget.in_use(), 3 << 20);
        let second = budget.hold(2 << 20, 1000);
        tokio::pin!(second);
        assert!(
            futures::poll!(second.as_mut()).is_pending(),
            "2 MiB more does not fit in 4 MiB"
        );
        drop(first);
        let second = second.await.expect("large");
        assert_eq!(budget.in_use(), 2 << 20);
        // Larger than the whole budget: takes all of it, once it is free.
        let huge = budget.hold(64 << 20, 1000);
        tokio::pin!(huge);
        assert!(futures::poll!(huge.as_mut()).is_pending());
        drop(second);
        let _huge = huge.await.expect("large");
        assert_eq!(budget.in_use(), 4 << 20);
    }

    #[tokio::test]
    async fn a_streamed_answer_is_the_whole_message_and_its_share_lives_with_the_body() {
        use http_body_util::BodyExt;
        let budget = ListBudget::new(4);
        let held = budget.hold(2 << 20, 10).await;
        assert!(held.is_some());
        let machine: Vec<u8> = (0..200u8).collect();
        let answer = EncodedMachineList {
            machines: vec![Arc::from(machine); 1000],
            revision: b"42".to_vec(),
        };
        let whole = answer.encode_to_vec();
        // What tonic makes of the empty stand-in: its message frame, then trailers.
        let mut trailers = http::HeaderMap::new();
        trailers.insert("grpc-status", http::HeaderValue::from_static("0"));
        let stand_in = futures::stream::iter([
            Ok::<_, tonic::Status>(Frame::data(Bytes::from_static(&[0, 0, 0, 0, 0]))),
            Ok(Frame::trailers(trailers)),
        ]);
        let body = tonic::body::Body::new(http_body_util::StreamBody::new(stand_in));
        let mut response = http::Response::new(body);
        response
            .extensions_mut()
            .insert(StreamedList::new(answer, held));
        let mut body = release_when_sent(response).into_body();
        let mut data = Vec::new();
        let mut frames = 0;
        let mut status = None;
        while let Some(frame) = body.frame().await {
            match frame.expect("frame").into_data() {
                Ok(piece) => {
                    assert!(piece.len() <= CHUNK + 256);
                    data.extend_from_slice(&piece);
                    frames += 1;
                }
                Err(frame) => status = frame.into_trailers().ok(),
            }
        }
        assert!(
            frames > 3,
            "streamed in pieces, not whole ({frames} frames)"
        );
        assert_eq!(data[0], 0);
        assert_eq!(
            u32::from_be_bytes(data[1..5].try_into().unwrap()) as usize,
            whole.len()
        );
        assert_eq!(
            &data[5..],
            &whole[..],
            "exactly the message tonic would have sent"
        );
        assert_eq!(status.expect("trailers")["grpc-status"], "0");
        assert_eq!(budget.in_use(), 2 << 20, "held until the body is dropped");
        drop(body);
        assert_eq!(budget.in_use(), 0);
    }

    #[test]
    fn the_estimate_follows_the_last_large_answer() {
        let budget = ListBudget::new(4);
        assert!(budget.may_be_large(100_000));
        assert!(!budget.may_be_large(1000));
        futures::executor::block_on(budget.hold(10_000, 1000));
        assert!(!budget.may_be_large(100_000), "10 bytes a machine");
    }
}
