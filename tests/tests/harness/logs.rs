//! Reading the provider's JSON log lines.

use std::time::{Duration, Instant};

use super::Server;

/// The `fields` of the JSON "serving CapacityProvider" line (the harness may return a
/// moment before that line reaches its log).
pub fn serving_fields(server: &Server) -> serde_json::Value {
    let start = Instant::now();
    loop {
        let found = server
            .log_text()
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .map(|v| v["fields"].clone())
            .find(|f| f["message"] == "serving CapacityProvider");
        if let Some(fields) = found {
            super::timing::seen("serving line", start.elapsed(), Duration::from_secs(5));
            return fields;
        }
        assert!(start.elapsed() < Duration::from_secs(5), "no serving line");
        std::thread::sleep(Duration::from_millis(10));
    }
}

pub fn lines_of(server: &Server) -> Vec<String> {
    server.log_text().lines().map(str::to_owned).collect()
}

/// Waits up to `within` for a JSON log line whose message satisfies `ok` (a line can reach
/// the log a moment after the effect it reports is visible).
pub async fn logged(
    log: impl Fn() -> Vec<String>,
    within: Duration,
    ok: impl Fn(&str, &serde_json::Value) -> bool,
) -> serde_json::Value {
    let start = Instant::now();
    loop {
        let lines = log();
        let found = lines
            .iter()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .find(|v| ok(v["fields"]["message"].as_str().unwrap_or_default(), v));
        if let Some(line) = found {
            super::timing::seen("log line", start.elapsed(), within);
            return line;
        }
        assert!(
            start.elapsed() < within,
            "no such log line in:\n{}",
            lines.join("\n")
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until the log holds every line the provider wrote while answering the calls made so
/// far. The provider writes a call's `rpc` line before it answers, and its lines reach the log
/// in order; so a sentinel call, a Get of a fresh unknown id whose warning names that id, is
/// logged after all of them, and once its line is in the log, so are theirs. Returns the log
/// up to and including the sentinel's line.
pub async fn log_caught_up(server: &Server, c: &mut super::Client) -> Vec<String> {
    static SENTINELS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = SENTINELS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let sentinel = format!("log-sentinel-{}-{n}", std::process::id());
    let answer = super::get(c, &sentinel).await;
    assert_eq!(
        super::code(&answer),
        tonic::Code::NotFound,
        "the sentinel {sentinel} is an unknown id: {answer:?}"
    );
    let start = Instant::now();
    loop {
        let lines = lines_of(server);
        if let Some(at) = lines.iter().position(|line| line.contains(&sentinel)) {
            super::timing::seen("log caught up", start.elapsed(), Duration::from_secs(10));
            return lines[..=at].to_vec();
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "the sentinel {sentinel}'s line never reached the log:\n{}",
            lines.join("\n")
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
