//! Slow List readers as the List tests need them: a full List over a raw HTTP/2 connection
//! whose flow-control windows the caller opens, so it reads exactly as fast as it wants, and
//! the provider's resident memory.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bigfleet_libvirt_proto::v1alpha1 as pb;
use prost::Message;
use prost::bytes::Bytes;

/// The resident memory (VmRSS) of `pid`, in MiB.
pub fn rss_mib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS");
    kib / 1024
}

/// A raw HTTP/2 List whose windows are `window` bytes, and its connection's task.
pub async fn raw_list(
    addr: SocketAddr,
    window: u32,
) -> (
    h2::RecvStream,
    tokio::task::JoinHandle<Result<(), h2::Error>>,
) {
    let tcp = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let (h2, connection) = h2::client::Builder::new()
        .initial_window_size(window)
        .initial_connection_window_size(window)
        .handshake::<_, Bytes>(tcp)
        .await
        .expect("HTTP/2 handshake");
    let connection = tokio::spawn(connection);
    let mut h2 = h2.ready().await.expect("ready");
    let request = ::http::Request::post(format!(
        "http://{addr}/bigfleet.v1alpha1.CapacityProvider/List"
    ))
    .header("content-type", "application/grpc")
    .header("te", "trailers")
    .body(())
    .unwrap();
    let filter = pb::ListFilter::default().encode_to_vec();
    let mut frame = vec![0u8];
    frame.extend_from_slice(&u32::try_from(filter.len()).unwrap().to_be_bytes());
    frame.extend_from_slice(&filter);
    let (response, mut send) = h2.send_request(request, false).expect("send List");
    send.send_data(Bytes::from(frame), true).expect("send body");
    let body = response.await.expect("List answered").into_body();
    (body, connection)
}

/// Reads `body` at `rate` bytes a second (its window opened by what was read) until it ends
/// or `stop`, then drops the connection; the bytes read, and when the first came after
/// `start`.
pub async fn read_slowly(
    mut body: h2::RecvStream,
    connection: tokio::task::JoinHandle<Result<(), h2::Error>>,
    rate: usize,
    start: Instant,
    stop: Instant,
) -> (usize, Option<Duration>) {
    let (mut read, mut first) = (0, None);
    while Instant::now() < stop {
        let chunk = tokio::select! {
            chunk = body.data() => chunk,
            () = tokio::time::sleep_until(stop.into()) => break,
        };
        let Some(chunk) = chunk else { break };
        let chunk = chunk.expect("List body");
        first.get_or_insert_with(|| start.elapsed());
        read += chunk.len();
        tokio::time::sleep(Duration::from_secs_f64(chunk.len() as f64 / rate as f64)).await;
        let _ = body.flow_control().release_capacity(chunk.len());
    }
    connection.abort();
    (read, first)
}
