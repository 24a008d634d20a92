//! A minimal HTTP/1.0 client for the side server (`/metrics`, `/healthz`, `/readyz`,
//! `/timeline`).

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// How long a GET may take in all.
const GET_WITHIN: Duration = Duration::from_secs(30);

/// A one-shot HTTP/1.0 GET (the server closes the connection): (status, head, body).
pub async fn http_get(addr: SocketAddr, path: &str) -> std::io::Result<(u16, String, String)> {
    let io = async {
        let mut tcp = TcpStream::connect(addr).await?;
        let request = format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n");
        tcp.write_all(request.as_bytes()).await?;
        let mut raw = Vec::new();
        tcp.read_to_end(&mut raw).await?;
        Ok::<_, std::io::Error>(raw)
    };
    let sent = std::time::Instant::now();
    let raw = tokio::time::timeout(GET_WITHIN, io)
        .await
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "HTTP GET timed out"))??;
    super::timing::seen(&format!("GET {path}"), sent.elapsed(), GET_WITHIN);
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| std::io::Error::other(format!("no HTTP head in {text:?}")))?;
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("no status in {head:?}")))?;
    Ok((status, head.to_owned(), body.to_owned()))
}

/// `id` percent-encoded for a query string (machine ids hold `/`).
pub fn query_encoded(id: &str) -> String {
    id.bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'.' | b'_' => {
                char::from(b).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The events of machine `id`'s timeline (`GET /timeline?machine=ID` on the metrics port
/// `metrics`), oldest first; fails unless the answer is 200 with a JSON page.
pub async fn timeline_events(metrics: SocketAddr, id: &str) -> Vec<serde_json::Value> {
    let path = format!("/timeline?machine={}", query_encoded(id));
    let (status, _, body) = http_get(metrics, &path).await.expect("GET /timeline");
    assert_eq!(status, 200, "{body}");
    let page: serde_json::Value = serde_json::from_str(&body).expect("the timeline is JSON");
    page["events"].as_array().expect("events").clone()
}
