//! Streaming a large List answer to its reader, and the send-progress deadline.
//!
//! The handler answers tonic with an empty `MachineList` and puts a [`StreamedList`] in the
//! response's extensions; the tower layer [`release_when_sent`] turns the body into the
//! answer's message, written piece by piece ([`CHUNK`] bytes a frame, each made only once
//! HTTP/2 asked for it) from the machines' shared encodings, followed by tonic's trailers.
//!
//! HTTP/2 asks for the next piece once its reader has taken the previous one, so a reader
//! that takes nothing for the progress deadline (`--list-progress-timeout`, 30 s) has
//! stopped reading: its stream is cut. The answer, the stream's pieces and its share of the
//! budget are given back at once, `bigfleet_libvirt_list_streams_cut_total` counts it, and a
//! warn line names the deadline; the HTTP/2 stream is reset with `CANCEL` as soon as the
//! reader asks for more (or when its connection closes). A reader slower than one piece per
//! deadline (16 KiB in 30 s, about 550 bytes a second) is cut the same way.

// The streaming layer runs only on the real tokio runtime, inside the HTTP/2 server
// (`app::serve`; the simulator serves without it), so its per-stream watchdog is a tokio
// task on a tokio timer.
#![allow(clippy::disallowed_methods)]

use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::task::{Context, Poll, Waker, ready};
use std::time::Duration;

use bigfleet_libvirt_proto::wire::Pieces;
use http_body::Frame;
use prometheus_client::metrics::counter::Counter;
use tokio::time::Instant;
use tonic::codegen::Bytes;
use tracing::warn;

pub use crate::list_budget::CHUNK;
use crate::list_budget::{Answer, Reservation};

/// The default send-progress deadline (`--list-progress-timeout`).
pub const DEFAULT_PROGRESS_TIMEOUT: Duration = Duration::from_secs(30);

/// A large List answer for [`release_when_sent`] to stream, with the stream's reservation.
/// Only a server with that layer may answer with one (`ServiceSettings::streamed_lists`).
#[derive(Clone, Debug)]
pub struct StreamedList {
    answer: Arc<Answer>,
    reservation: Arc<Reservation>,
    deadline: Duration,
    cut: Counter,
}

impl StreamedList {
    /// `answer`, to be streamed while `reservation` is kept; cut (and counted on `cut`) when
    /// its reader takes nothing for `deadline`.
    #[must_use]
    pub fn new(
        answer: Arc<Answer>,
        reservation: Reservation,
        deadline: Duration,
        cut: Counter,
    ) -> Self {
        Self {
            answer,
            reservation: Arc::new(reservation),
            deadline,
            cut,
        }
    }
}

/// Streams a [`StreamedList`] found in a response's extensions (see the module docs). What
/// the stream holds is given back when its body is dropped, after its last piece, or when it
/// is cut.
#[must_use]
pub fn release_when_sent(
    mut response: http::Response<tonic::body::Body>,
) -> http::Response<tonic::body::Body> {
    let Some(streamed) = response.extensions_mut().remove::<StreamedList>() else {
        return response;
    };
    let len = streamed.answer.list().encoded_len();
    let shared = Arc::new(Shared {
        state: Mutex::new(State {
            content: Some(Content {
                pieces: Pieces::new(Arc::clone(streamed.answer.list())),
                _answer: streamed.answer,
                _reservation: streamed.reservation,
            }),
            last_progress: Instant::now(),
            cut: false,
            waker: None,
        }),
    });
    tokio::spawn(watch(
        Arc::downgrade(&shared),
        streamed.deadline,
        streamed.cut,
    ));
    response.map(|inner| {
        tonic::body::Body::new(Streamed {
            inner,
            prefix: Some(len),
            shared,
        })
    })
}

/// Cuts the stream once it made no progress for `deadline`; ends with the stream.
async fn watch(shared: Weak<Shared>, deadline: Duration, cut: Counter) {
    loop {
        let due = {
            let Some(shared) = shared.upgrade() else {
                return;
            };
            let mut state = shared.lock();
            if state.content.is_none() {
                return;
            }
            let due = state.last_progress + deadline;
            if Instant::now() >= due {
                state.content = None;
                state.cut = true;
                cut.inc();
                if let Some(waker) = state.waker.take() {
                    waker.wake();
                }
                warn!(
                    ?deadline,
                    "List stream cut: its reader took nothing for the send-progress deadline \
                     (--list-progress-timeout)"
                );
                return;
            }
            due
        };
        tokio::time::sleep_until(due).await;
    }
}

/// What a streamed body and its watchdog share.
struct Shared {
    state: Mutex<State>,
}

struct State {
    /// What the stream holds; `None` once sent or cut.
    content: Option<Content>,
    /// When HTTP/2 last took a piece.
    last_progress: Instant,
    /// Whether the watchdog cut the stream.
    cut: bool,
    /// The stream's task, to wake when cut.
    waker: Option<Waker>,
}

struct Content {
    pieces: Pieces,
    _answer: Arc<Answer>,
    _reservation: Arc<Reservation>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The body of a streamed List answer.
struct Streamed {
    /// tonic's body for the empty stand-in message: its data is dropped, its trailers kept.
    inner: tonic::body::Body,
    /// The message length, until the gRPC length prefix was written.
    prefix: Option<usize>,
    shared: Arc<Shared>,
}

/// The error that resets a cut stream: `CANCEL` on HTTP/2 (hyper resets a stream whose body
/// fails with the reason found among the error's sources).
fn cut_status() -> tonic::Status {
    let mut status = tonic::Status::cancelled(
        "the List stream was cut: its reader took nothing for --list-progress-timeout",
    );
    status.set_source(Arc::new(h2::Error::from(h2::Reason::CANCEL)));
    status
}

impl http_body::Body for Streamed {
    type Data = Bytes;
    type Error = tonic::Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, tonic::Status>>> {
        let this = &mut *self;
        {
            let mut state = this.shared.lock();
            if state.cut {
                return Poll::Ready(Some(Err(cut_status())));
            }
            state.waker = Some(cx.waker().clone());
            state.last_progress = Instant::now();
            if let Some(len) = this.prefix.take() {
                let Ok(len) = u32::try_from(len) else {
                    state.content = None;
                    return Poll::Ready(Some(Err(tonic::Status::resource_exhausted(format!(
                        "the List answer is {len} bytes, more than one gRPC message can \
                         carry; ask for fewer machines with max_results"
                    )))));
                };
                let mut header = Vec::with_capacity(5);
                header.push(0); // not compressed
                header.extend_from_slice(&len.to_be_bytes());
                return Poll::Ready(Some(Ok(Frame::data(Bytes::from(header)))));
            }
            if let Some(content) = state.content.as_mut() {
                if let Some(piece) = content.pieces.next_piece(CHUNK) {
                    return Poll::Ready(Some(Ok(Frame::data(piece))));
                }
                // All written: give back what the stream held before the trailers.
                state.content = None;
            }
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
#[path = "list_stream_tests.rs"]
mod tests;
