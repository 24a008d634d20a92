//! Bounded accepting for both ports: every client costs a bounded amount of the process.
//!
//! - A connection cap per port: each accepted connection holds a semaphore permit (in its
//!   [`Lease`]) until it closes. At the cap a new client evicts the port's oldest idle
//!   connection (the rule is in [`evict`]); when every connection is busy it waits, and the
//!   port takes no further client until a connection closes or goes idle, so the process
//!   holds at most one connection past its cap and never runs out of descriptors.
//! - Accept errors (EMFILE, ENFILE, ENOBUFS, ENOMEM, …) back off, 10 ms doubling to 1 s,
//!   and are logged at most once per second with the number of failures since the last
//!   line, so descriptor exhaustion neither spins a core nor floods the log.
//! - On the gRPC port a new connection must finish its TLS handshake (if any) and send the
//!   HTTP/2 connection preface within a deadline; a client that stalls is closed. The
//!   preface bytes are read here and replayed to the HTTP/2 server by [`Admitted`].
//! - [`raise_nofile_limit`] lifts the soft descriptor limit to the hard one at start-up.

// Accepting runs only on the real tokio runtime (it owns real sockets), so its backoff
// timers, deadlines and rate limiting use tokio and the monotonic clock directly.
#![allow(clippy::disallowed_methods)]

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};

pub mod evict;

pub use evict::{Activity, Busy, BusyBody, LINGER, Lease, TrackRequests, TrackRequestsLayer};
use evict::{Eviction, Registry};
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::server::Connected;
use tracing::{debug, info, warn};

/// The first bytes of every HTTP/2 connection (RFC 9113, section 3.4).
const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// The first pause after a failed accept.
const BACKOFF_MIN: Duration = Duration::from_millis(10);
/// The longest pause between accept attempts.
const BACKOFF_MAX: Duration = Duration::from_secs(1);
/// At most one log line per this period for a repeating accept problem.
const LOG_PERIOD: Duration = Duration::from_secs(1);
/// At the cap, how often a waiting client looks again for a connection to evict (one may
/// have gone idle, or passed its [`LINGER`]).
const RECHECK: Duration = Duration::from_millis(50);

/// Called once per eviction (the provider counts them in a metric).
#[derive(Clone)]
pub struct OnEvict(Arc<dyn Fn() + Send + Sync>);

impl OnEvict {
    /// Calls `hook` on every eviction.
    pub fn new(hook: impl Fn() + Send + Sync + 'static) -> Self {
        Self(Arc::new(hook))
    }
}

impl std::fmt::Debug for OnEvict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("OnEvict")
    }
}

/// Accepts connections on one port under a connection cap, backing off on errors.
#[derive(Debug)]
pub struct Acceptor {
    listener: TcpListener,
    port: &'static str,
    max_connections: usize,
    permits: Arc<Semaphore>,
    registry: Arc<Registry>,
    on_evict: Option<OnEvict>,
    backoff: Duration,
    errors: RateLimited,
    full: RateLimited,
    evictions: RateLimited,
}

impl Acceptor {
    /// Accepts on `listener` (named by its flag, `port`, in logs), holding at most
    /// `max_connections` open at once.
    ///
    /// # Panics
    /// When `max_connections` is 0 (the flags refuse it).
    #[must_use]
    pub fn new(listener: TcpListener, port: &'static str, max_connections: usize) -> Self {
        assert!(max_connections > 0, "a connection cap of 0 serves nobody");
        Self {
            listener,
            port,
            max_connections,
            permits: Arc::new(Semaphore::new(max_connections)),
            registry: Arc::default(),
            on_evict: None,
            backoff: BACKOFF_MIN,
            errors: RateLimited::default(),
            full: RateLimited::default(),
            evictions: RateLimited::default(),
        }
    }

    /// Calls `hook` on every eviction.
    #[must_use]
    pub fn on_evict(mut self, hook: OnEvict) -> Self {
        self.on_evict = Some(hook);
        self
    }

    /// The next connection and the lease it must hold until it closes. At the cap the
    /// client is accepted first and room is made for it (see [`Acceptor::make_room`]); an
    /// accept error pauses (doubling up to 1 s) and retries.
    pub async fn accept(&mut self) -> (TcpStream, SocketAddr, Lease) {
        let free = Arc::clone(&self.permits).try_acquire_owned().ok();
        let (tcp, peer) = self.next_client().await;
        let permit = match free {
            Some(permit) => permit,
            None => self.make_room().await,
        };
        (tcp, peer, self.registry.lease(permit))
    }

    /// Waits for a permit at the cap, evicting the oldest idle connection to free one; when
    /// every connection is busy, waits until one closes or goes idle.
    ///
    /// # Panics
    /// Never: the semaphore is never closed.
    async fn make_room(&mut self) -> OwnedSemaphorePermit {
        loop {
            if let Ok(permit) = Arc::clone(&self.permits).try_acquire_owned() {
                return permit;
            }
            let (port, max) = (self.port, self.max_connections);
            match self.registry.evict_oldest_idle() {
                Eviction::Evicted { age } => {
                    if let Some(hook) = &self.on_evict {
                        (hook.0)();
                    }
                    self.evictions.hit(|evicted| {
                        info!(
                            port,
                            max_connections = max,
                            evicted,
                            age_ms = age.as_millis(),
                            "connection cap reached: evicted the oldest idle connection to let a new one in"
                        );
                    });
                }
                Eviction::Closing => {}
                Eviction::AllBusy => self.full.hit(|waits| {
                    warn!(
                        port,
                        max_connections = max,
                        waits,
                        "connection cap reached and every connection is busy; a new connection waits until one closes or goes idle"
                    );
                }),
            }
            tokio::select! {
                permit = Arc::clone(&self.permits).acquire_owned() => {
                    return permit.expect("the connection semaphore is never closed");
                }
                () = tokio::time::sleep(RECHECK) => {}
            }
        }
    }

    /// The next client off the listener, backing off on errors.
    async fn next_client(&mut self) -> (TcpStream, SocketAddr) {
        loop {
            match self.listener.accept().await {
                Ok((tcp, peer)) => {
                    self.backoff = BACKOFF_MIN;
                    // Small unary replies must not wait out the peer's delayed ACK.
                    let _ = tcp.set_nodelay(true);
                    return (tcp, peer);
                }
                Err(e) => {
                    // A connection that died in the backlog says nothing about this
                    // process: take the next one at once. Anything else (descriptors,
                    // buffers or memory exhausted) backs off.
                    let pause = (!per_connection(&e)).then_some(self.backoff);
                    if pause.is_some() {
                        self.backoff = (self.backoff * 2).min(BACKOFF_MAX);
                    }
                    let port = self.port;
                    let backoff_ms = pause.map_or(0, |p| p.as_millis());
                    self.errors.hit(|failures| {
                        warn!(port, error = %e, failures, backoff_ms, "accept failed");
                    });
                    if let Some(pause) = pause {
                        tokio::time::sleep(pause).await;
                    }
                }
            }
        }
    }
}

/// Errors that concern only the one connection being accepted.
fn per_connection(error: &io::Error) -> bool {
    matches!(
        error.kind(),
        io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::Interrupted
            | io::ErrorKind::WouldBlock
    )
}

/// Lets a repeating event log once per [`LOG_PERIOD`], with how often it happened.
#[derive(Debug, Default)]
struct RateLimited {
    last: Option<Instant>,
    count: u64,
}

impl RateLimited {
    fn hit(&mut self, log: impl FnOnce(u64)) {
        self.count += 1;
        let now = Instant::now();
        if self
            .last
            .is_none_or(|last| now.duration_since(last) >= LOG_PERIOD)
        {
            log(self.count);
            self.count = 0;
            self.last = Some(now);
        }
    }
}

/// gRPC connections from `acceptor`: each runs `handshake` (TLS, or nothing) and must then
/// send the HTTP/2 preface, all within `deadline` of being accepted, off the accept loop.
/// A connection that fails or stalls is closed and logged at debug. The loop ends (and the
/// listener closes) when the stream is dropped.
pub fn grpc_incoming<IO, H, F>(
    mut acceptor: Acceptor,
    deadline: Duration,
    handshake: H,
) -> ReceiverStream<io::Result<Admitted<IO>>>
where
    H: Fn(TcpStream) -> F + Send + 'static,
    F: Future<Output = io::Result<IO>> + Send + 'static,
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (tx, rx) = mpsc::channel(64);
    tokio::spawn(async move {
        loop {
            // Biased: once the server stops taking connections, stop accepting them.
            let (tcp, peer, lease) = tokio::select! {
                biased;
                () = tx.closed() => return,
                accepted = acceptor.accept() => accepted,
            };
            let opening = handshake(tcp);
            let tx = tx.clone();
            tokio::spawn(async move {
                let activity = lease.activity();
                let opened = tokio::time::timeout(deadline, async {
                    let mut io = opening.await?;
                    let preface = read_preface(&mut io).await?;
                    Ok::<_, io::Error>(Admitted::with_replay(io, preface, lease))
                });
                // A connection still opening is idle: eviction closes it here.
                let handed_over = tokio::select! {
                    () = activity.evicted() => Err("evicted before its HTTP/2 preface"),
                    opened = opened => match opened {
                        Ok(Ok(connection)) => {
                            // The server takes it; if it has stopped, the connection closes.
                            let _ = tx.send(Ok(connection)).await;
                            Ok(())
                        }
                        Ok(Err(e)) => {
                            debug!(%peer, error = %e, "connection refused before HTTP/2");
                            Ok(())
                        }
                        Err(_) => Err("connection closed: no TLS handshake or HTTP/2 preface in time"),
                    },
                };
                if let Err(why) = handed_over {
                    debug!(%peer, ?deadline, "{why}");
                }
            });
        }
    });
    ReceiverStream::new(rx)
}

/// Reads the HTTP/2 connection preface; anything else is refused.
async fn read_preface<IO: AsyncRead + Unpin>(io: &mut IO) -> io::Result<[u8; 24]> {
    let mut preface = [0_u8; 24];
    io.read_exact(&mut preface).await?;
    if &preface == PREFACE {
        Ok(preface)
    } else {
        Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "not an HTTP/2 connection preface (gRPC needs HTTP/2)",
        ))
    }
}

/// An accepted connection: the bytes already read (the HTTP/2 preface) are replayed first;
/// its writes and flushes are reported to its [`Activity`]; once evicted, its reads and
/// writes fail (a waiting read is woken for it), so its server closes it; and the port's
/// permit is released when it is dropped.
#[derive(Debug)]
pub struct Admitted<IO> {
    io: IO,
    replay: [u8; 24],
    replayed: usize,
    activity: Activity,
    _lease: Lease,
}

impl<IO> Admitted<IO> {
    /// A connection with nothing to replay (the HTTP/1 side server's).
    pub fn new(io: IO, lease: Lease) -> Self {
        let mut admitted = Self::with_replay(io, [0; 24], lease);
        admitted.replayed = admitted.replay.len();
        admitted
    }

    fn with_replay(io: IO, replay: [u8; 24], lease: Lease) -> Self {
        Self {
            io,
            replay,
            replayed: 0,
            activity: lease.activity(),
            _lease: lease,
        }
    }

    /// The connection itself.
    pub fn get_ref(&self) -> &IO {
        &self.io
    }

    /// What this connection's requests report to.
    pub fn activity(&self) -> Activity {
        self.activity.clone()
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for Admitted<IO> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.activity.is_evicted() {
            return Poll::Ready(Err(evict::evicted_error()));
        }
        let left = &this.replay[this.replayed..];
        if !left.is_empty() {
            let n = left.len().min(buf.remaining());
            buf.put_slice(&left[..n]);
            this.replayed += n;
            return Poll::Ready(Ok(()));
        }
        match Pin::new(&mut this.io).poll_read(cx, buf) {
            // Registered after the read went pending, so an eviction in between still wakes.
            Poll::Pending if this.activity.poll_evicted(cx) => {
                Poll::Ready(Err(evict::evicted_error()))
            }
            polled => polled,
        }
    }
}

impl<IO: AsyncWrite + Unpin> Admitted<IO> {
    fn tracked_write(
        &mut self,
        write: impl FnOnce(Pin<&mut IO>) -> Poll<io::Result<usize>>,
    ) -> Poll<io::Result<usize>> {
        if self.activity.is_evicted() {
            return Poll::Ready(Err(evict::evicted_error()));
        }
        let polled = write(Pin::new(&mut self.io));
        if matches!(polled, Poll::Pending | Poll::Ready(Ok(1..))) {
            self.activity.wrote();
        }
        polled
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Admitted<IO> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.get_mut().tracked_write(|io| io.poll_write(cx, buf))
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.get_mut()
            .tracked_write(|io| io.poll_write_vectored(cx, bufs))
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.io).poll_flush(cx);
        if let Poll::Ready(Ok(())) = polled {
            this.activity.flushed();
        }
        polled
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

/// Tonic hands each request of the connection its [`Activity`], for [`TrackRequests`].
impl<IO> Connected for Admitted<IO> {
    type ConnectInfo = Activity;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.activity.clone()
    }
}

/// Raises the soft `RLIMIT_NOFILE` to the hard limit (as the Go runtime does), so the
/// connection caps, not a 1,024-descriptor default, bound the process; logs the result.
pub fn raise_nofile_limit() {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    let before = getrlimit(Resource::Nofile);
    let shown =
        |limit: Option<u64>| limit.map_or_else(|| "unlimited".to_owned(), |n| n.to_string());
    if before.current == before.maximum {
        info!(
            soft = shown(before.current),
            hard = shown(before.maximum),
            "descriptor limit already at its hard limit"
        );
        return;
    }
    let raised = Rlimit {
        current: before.maximum,
        maximum: before.maximum,
    };
    match setrlimit(Resource::Nofile, raised) {
        Ok(()) => info!(
            from = shown(before.current),
            to = shown(before.maximum),
            "raised the soft descriptor limit to the hard limit"
        ),
        Err(e) => warn!(
            soft = shown(before.current),
            hard = shown(before.maximum),
            error = %e,
            "could not raise the soft descriptor limit; connections may fail at the soft limit"
        ),
    }
}
