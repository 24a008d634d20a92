//! Health first: what a port does at its connection cap when a new client arrives.
//!
//! Every open connection holds a [`Lease`]: its permit under the cap and its place in the
//! port's eviction order (oldest first). When the cap is reached, the acceptor evicts the
//! oldest connection that is *idle*, so a new client (a kubelet probe, a health check) gets
//! in instead of waiting behind connections that do nothing. A connection is idle when:
//!
//! - no request is in flight on it: no HTTP/1 request whose head was read and whose
//!   response body has not ended, no HTTP/2 stream whose handler was called and whose
//!   response has not ended (counted by [`TrackRequests`] through [`Activity::begin`]);
//! - nothing it wrote is still unflushed (a response still going out to a slow reader);
//! - its last response ended at least [`LINGER`] ago, or it never served one. A
//!   connection still reading its first request head, still in its TLS handshake or
//!   HTTP/2 preface, or one that never opened a stream, is idle from the start.
//!
//! When every connection is busy the new client waits, as before, until one closes or
//! goes idle. One eviction is outstanding at a time: the next waits until the evicted
//! connection has closed, so a single new client never costs more than one connection.

use std::collections::BTreeMap;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use http_body::{Body, Frame, SizeHint};
use tokio::sync::{Notify, OwnedSemaphorePermit};
use tonic::codegen::Service;
use tonic::codegen::http::{Extensions, Request, Response};

/// How long after its last response a connection still counts as busy: covers the moment
/// between a response's end and its last bytes reaching the socket (HTTP/2 writes them
/// from the connection's own task), so a finished response is never cut off.
pub const LINGER: Duration = Duration::from_secs(1);

fn locked<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // Nothing here panics while holding a lock; if something did, the state is still the
    // best account there is.
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The open connections of one port, in the order they were accepted.
#[derive(Debug, Default)]
pub(crate) struct Registry {
    slots: Mutex<Slots>,
}

#[derive(Debug, Default)]
struct Slots {
    next: u64,
    open: BTreeMap<u64, Arc<Slot>>,
    /// Evicted connections that have not closed yet.
    closing: usize,
}

/// What the acceptor did to make room at the cap.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Eviction {
    /// Evicted the oldest idle connection, open for `age`.
    Evicted { age: Duration },
    /// An evicted connection is still closing; its permit comes back soon.
    Closing,
    /// Every connection is busy: nothing to evict.
    AllBusy,
}

impl Registry {
    /// Enters a new connection holding `permit` as the youngest.
    pub(crate) fn lease(self: &Arc<Self>, permit: OwnedSemaphorePermit) -> Lease {
        let mut slots = locked(&self.slots);
        let id = slots.next;
        slots.next += 1;
        let slot = Arc::new(Slot {
            opened: Instant::now(),
            state: Mutex::default(),
            evicted: Notify::new(),
        });
        slots.open.insert(id, Arc::clone(&slot));
        Lease {
            registry: Arc::clone(self),
            id,
            activity: Activity(slot),
            _permit: permit,
        }
    }

    /// Evicts the oldest idle connection (unless one evicted earlier is still closing).
    pub(crate) fn evict_oldest_idle(&self) -> Eviction {
        let mut slots = locked(&self.slots);
        if slots.closing > 0 {
            return Eviction::Closing;
        }
        let now = Instant::now();
        let chosen = slots.open.values().find_map(|slot| {
            let mut state = locked(&slot.state);
            let idle = !state.evicted
                && state.in_flight == 0
                && !state.unflushed
                && state
                    .last_end
                    .is_none_or(|end| now.duration_since(end) >= LINGER);
            if !idle {
                return None;
            }
            state.evicted = true;
            Some((slot, state.reader.take()))
        });
        let Some((slot, reader)) = chosen else {
            return Eviction::AllBusy;
        };
        let age = now.duration_since(slot.opened);
        slot.evicted.notify_one();
        if let Some(reader) = reader {
            reader.wake();
        }
        slots.closing += 1;
        Eviction::Evicted { age }
    }

    fn release(&self, id: u64, slot: &Slot) {
        let mut slots = locked(&self.slots);
        slots.open.remove(&id);
        if locked(&slot.state).evicted {
            slots.closing -= 1;
        }
    }

    #[cfg(test)]
    pub(crate) fn open(&self) -> usize {
        locked(&self.slots).open.len()
    }
}

/// One open connection's place under its port's cap; the permit is returned (and the
/// connection leaves the eviction order) when it is dropped with the connection.
#[derive(Debug)]
pub struct Lease {
    registry: Arc<Registry>,
    id: u64,
    activity: Activity,
    _permit: OwnedSemaphorePermit,
}

impl Lease {
    /// The handle requests on this connection report to.
    #[must_use]
    pub fn activity(&self) -> Activity {
        self.activity.clone()
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.registry.release(self.id, &self.activity.0);
    }
}

#[derive(Debug)]
struct Slot {
    opened: Instant,
    state: Mutex<SlotState>,
    /// Signalled once when the connection is evicted (for a connection still opening).
    evicted: Notify,
}

#[derive(Debug, Default)]
struct SlotState {
    /// Requests (HTTP/1) or streams (HTTP/2) whose response has not ended.
    in_flight: u32,
    /// Bytes written since the last completed flush.
    unflushed: bool,
    /// When the last response ended.
    last_end: Option<Instant>,
    evicted: bool,
    /// The task waiting to read from the connection, woken on eviction.
    reader: Option<Waker>,
}

/// What one connection is doing, as the eviction rule sees it (cheap to clone). Tonic
/// hands it to every request of a gRPC connection as its connection info.
#[derive(Clone, Debug)]
pub struct Activity(Arc<Slot>);

impl Activity {
    /// Marks a request in flight until the returned guard is dropped.
    #[must_use]
    pub fn begin(&self) -> Busy {
        locked(&self.0.state).in_flight += 1;
        Busy(self.clone())
    }

    /// Whether the connection has been evicted.
    #[must_use]
    pub fn is_evicted(&self) -> bool {
        locked(&self.0.state).evicted
    }

    /// Completes once the connection is evicted.
    pub async fn evicted(&self) {
        if !self.is_evicted() {
            self.0.evicted.notified().await;
        }
    }

    /// Registers `cx` to be woken on eviction; `true` when already evicted.
    pub(crate) fn poll_evicted(&self, cx: &Context<'_>) -> bool {
        let mut state = locked(&self.0.state);
        if state.evicted {
            return true;
        }
        match &mut state.reader {
            Some(waker) if waker.will_wake(cx.waker()) => {}
            reader => *reader = Some(cx.waker().clone()),
        }
        false
    }

    /// Records a write that moved bytes or had to wait.
    pub(crate) fn wrote(&self) {
        locked(&self.0.state).unflushed = true;
    }

    /// Records a completed flush: everything written so far has left the process.
    pub(crate) fn flushed(&self) {
        locked(&self.0.state).unflushed = false;
    }
}

/// A request in flight (see [`Activity::begin`]).
#[derive(Debug)]
pub struct Busy(Activity);

impl Drop for Busy {
    fn drop(&mut self) {
        let mut state = locked(&(self.0).0.state);
        state.in_flight = state.in_flight.saturating_sub(1);
        state.last_end = Some(Instant::now());
    }
}

/// The error an evicted connection's reads and writes fail with.
pub(crate) fn evicted_error() -> io::Error {
    io::Error::new(
        io::ErrorKind::ConnectionAborted,
        "evicted: the port was at its connection cap and this was its oldest idle connection",
    )
}

/// Where [`TrackRequests`] finds a request's connection.
#[derive(Clone, Debug)]
enum Source {
    /// One connection's service (the HTTP/1 side server builds one per connection).
    Fixed(Activity),
    /// A service shared by every connection: the request's connection info says which.
    Extensions(fn(&Extensions) -> Option<Activity>),
}

/// A service that marks each request in flight on its connection from the moment it is
/// called until its response body is dropped (sent whole, or abandoned).
#[derive(Clone, Debug)]
pub struct TrackRequests<S> {
    inner: S,
    source: Source,
}

impl<S> TrackRequests<S> {
    /// Tracks every request `inner` serves as one of the connection `activity` reports on.
    pub fn new(inner: S, activity: Activity) -> Self {
        Self {
            inner,
            source: Source::Fixed(activity),
        }
    }
}

/// Wraps a shared service in [`TrackRequests`], finding each request's connection in its
/// extensions with `find` (where tonic put the connection info).
#[derive(Clone, Copy, Debug)]
pub struct TrackRequestsLayer {
    find: fn(&Extensions) -> Option<Activity>,
}

impl TrackRequestsLayer {
    /// A layer that reads each request's connection with `find`.
    #[must_use]
    pub fn new(find: fn(&Extensions) -> Option<Activity>) -> Self {
        Self { find }
    }
}

impl<S> tower_layer::Layer<S> for TrackRequestsLayer {
    type Service = TrackRequests<S>;

    fn layer(&self, inner: S) -> TrackRequests<S> {
        TrackRequests {
            inner,
            source: Source::Extensions(self.find),
        }
    }
}

type Tracked<R, E> = Pin<Box<dyn Future<Output = Result<R, E>> + Send>>;

impl<S, B, RB> Service<Request<B>> for TrackRequests<S>
where
    S: Service<Request<B>, Response = Response<RB>>,
    S::Future: Send + 'static,
{
    type Response = Response<BusyBody<RB>>;
    type Error = S::Error;
    type Future = Tracked<Self::Response, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let busy = match &self.source {
            Source::Fixed(activity) => Some(activity.begin()),
            Source::Extensions(find) => find(request.extensions()).map(|a| a.begin()),
        };
        let response = self.inner.call(request);
        Box::pin(async move {
            let response = response.await?;
            Ok(response.map(|body| BusyBody { body, _busy: busy }))
        })
    }
}

/// A response body that keeps its request in flight until it is dropped.
#[derive(Debug)]
pub struct BusyBody<B> {
    body: B,
    _busy: Option<Busy>,
}

impl<B: Body + Unpin> Body for BusyBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.get_mut().body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
#[path = "evict_tests.rs"]
mod tests;
