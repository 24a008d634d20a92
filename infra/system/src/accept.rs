//! Bounded accepting for both ports: every client costs a bounded amount of the process.
//!
//! - A connection cap per port: each accepted connection holds a semaphore permit until it
//!   closes; at the cap the port stops accepting (new clients wait in the kernel's backlog)
//!   instead of running the process out of descriptors.
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

/// Accepts connections on one port under a connection cap, backing off on errors.
#[derive(Debug)]
pub struct Acceptor {
    listener: TcpListener,
    port: &'static str,
    max_connections: usize,
    permits: Arc<Semaphore>,
    backoff: Duration,
    errors: RateLimited,
    full: RateLimited,
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
            backoff: BACKOFF_MIN,
            errors: RateLimited::default(),
            full: RateLimited::default(),
        }
    }

    /// The next connection and the permit it must hold until it closes. Waits while the
    /// port is at its cap; an accept error pauses (doubling up to 1 s) and retries.
    ///
    /// # Panics
    /// Never: the semaphore is never closed.
    pub async fn accept(&mut self) -> (TcpStream, SocketAddr, OwnedSemaphorePermit) {
        let permit = match Arc::clone(&self.permits).try_acquire_owned() {
            Ok(permit) => permit,
            Err(_) => {
                let (port, max) = (self.port, self.max_connections);
                self.full.hit(|waits| {
                    warn!(
                        port,
                        max_connections = max,
                        waits,
                        "connection cap reached; new connections wait until one closes"
                    );
                });
                Arc::clone(&self.permits)
                    .acquire_owned()
                    .await
                    .expect("the connection semaphore is never closed")
            }
        };
        loop {
            match self.listener.accept().await {
                Ok((tcp, peer)) => {
                    self.backoff = BACKOFF_MIN;
                    // Small unary replies must not wait out the peer's delayed ACK.
                    let _ = tcp.set_nodelay(true);
                    return (tcp, peer, permit);
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
            let (tcp, peer, permit) = tokio::select! {
                biased;
                () = tx.closed() => return,
                accepted = acceptor.accept() => accepted,
            };
            let opening = handshake(tcp);
            let tx = tx.clone();
            tokio::spawn(async move {
                let opened = tokio::time::timeout(deadline, async {
                    let mut io = opening.await?;
                    let preface = read_preface(&mut io).await?;
                    Ok::<_, io::Error>(Admitted::new(io, preface, permit))
                });
                match opened.await {
                    Ok(Ok(connection)) => {
                        let _ = tx.send(Ok(connection)).await;
                    }
                    Ok(Err(e)) => debug!(%peer, error = %e, "connection refused before HTTP/2"),
                    Err(_) => debug!(
                        %peer,
                        ?deadline,
                        "connection closed: no TLS handshake or HTTP/2 preface in time"
                    ),
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

/// An accepted connection: the bytes already read (the preface) are replayed first, and
/// the port's connection permit is released when the connection is dropped.
#[derive(Debug)]
pub struct Admitted<IO> {
    io: IO,
    replay: [u8; 24],
    replayed: usize,
    _permit: OwnedSemaphorePermit,
}

impl<IO> Admitted<IO> {
    fn new(io: IO, replay: [u8; 24], permit: OwnedSemaphorePermit) -> Self {
        Self {
            io,
            replay,
            replayed: 0,
            _permit: permit,
        }
    }

    /// The connection itself.
    pub fn get_ref(&self) -> &IO {
        &self.io
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for Admitted<IO> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let left = &this.replay[this.replayed..];
        if !left.is_empty() {
            let n = left.len().min(buf.remaining());
            buf.put_slice(&left[..n]);
            this.replayed += n;
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.io).poll_read(cx, buf)
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Admitted<IO> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

impl<IO: Connected> Connected for Admitted<IO> {
    type ConnectInfo = IO::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.io.connect_info()
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
