//! Serves the HTTP side server's routes (`http::router`) on `--metrics-addr` with every
//! client bounded: a connection cap that evicts the oldest idle connection for a new client
//! (so `/healthz` and `/readyz` answer while the port is flooded), accept backoff
//! ([`bigfleet_libvirt_system::accept`]), a deadline for
//! each request head (hyper's header-read timeout, which runs from the moment the
//! connection opens or the previous response ends, so it also closes kept-alive
//! connections that send nothing), and an idle timeout that closes a connection on which
//! no byte moves in either direction for that long (a client that stops mid-request or
//! stops reading the response). HTTP/1.1 only: Prometheus and kubelet probes speak it.

// The side server runs only on the real tokio runtime (it owns real sockets), so its
// connection tasks and idle timers use tokio directly.
#![allow(clippy::disallowed_methods)]

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpListener;
use tokio::time::{Instant, Sleep};
use tracing::{debug, warn};

use bigfleet_libvirt_system::accept::{Acceptor, Admitted, OnEvict, TrackRequests};

/// How long open connections may finish after shutdown before they are dropped.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

pub use crate::limits::HttpLimits;

/// Serves `router` on `listener` until `shutdown` completes, then lets open connections
/// finish (up to 5 s). `on_evict` is called for each connection evicted at the cap.
pub async fn serve(
    listener: TcpListener,
    router: axum::Router,
    limits: HttpLimits,
    on_evict: OnEvict,
    shutdown: impl Future<Output = ()> + Send,
) {
    let mut acceptor =
        Acceptor::new(listener, "--metrics-addr", limits.max_connections).on_evict(on_evict);
    let graceful = GracefulShutdown::new();
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout);
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        // Biased: after the shutdown signal no new connection is taken.
        let (tcp, peer, lease) = tokio::select! {
            biased;
            () = &mut shutdown => break,
            accepted = acceptor.accept() => accepted,
        };
        // Each request is in flight on its connection from its head to the end of its
        // response, so a connection serving one is never evicted; the lease (the permit)
        // goes with the connection.
        let service =
            TowerToHyperService::new(TrackRequests::new(router.clone(), lease.activity()));
        let io = TokioIo::new(Idle::new(Admitted::new(tcp, lease), limits.idle_timeout));
        let connection = graceful.watch(builder.serve_connection(io, service));
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                debug!(%peer, error = %e, "HTTP connection closed");
            }
        });
    }
    // Stop listening at once; then let in-flight requests finish.
    drop(acceptor);
    if tokio::time::timeout(SHUTDOWN_GRACE, graceful.shutdown())
        .await
        .is_err()
    {
        warn!("HTTP side-server connections did not finish in time");
    }
}

/// A connection that fails with `TimedOut` once no byte has moved for `idle`.
#[derive(Debug)]
struct Idle<IO> {
    io: IO,
    idle: Duration,
    timer: Pin<Box<Sleep>>,
}

impl<IO> Idle<IO> {
    fn new(io: IO, idle: Duration) -> Self {
        Self {
            io,
            idle,
            timer: Box::pin(tokio::time::sleep(idle)),
        }
    }

    fn moved(&mut self) {
        let deadline = Instant::now() + self.idle;
        self.timer.as_mut().reset(deadline);
    }

    /// Called when the connection would wait: fails it if the idle deadline has passed.
    fn check(&mut self, cx: &mut Context<'_>) -> Poll<io::Error> {
        ready!(self.timer.as_mut().poll(cx));
        Poll::Ready(io::Error::new(
            io::ErrorKind::TimedOut,
            format!("no traffic for {:?} (idle timeout)", self.idle),
        ))
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for Idle<IO> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        match Pin::new(&mut this.io).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                if buf.filled().len() > before {
                    this.moved();
                }
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => this.check(cx).map(Err),
        }
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Idle<IO> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        match Pin::new(&mut this.io).poll_write(cx, buf) {
            Poll::Ready(Ok(n)) => {
                if n > 0 {
                    this.moved();
                }
                Poll::Ready(Ok(n))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => this.check(cx).map(Err),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        match Pin::new(&mut this.io).poll_flush(cx) {
            Poll::Pending => this.check(cx).map(Err),
            done => done,
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}
