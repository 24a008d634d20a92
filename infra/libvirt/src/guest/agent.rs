//! The qemu guest-agent protocol as the provider uses it: readiness, file transfer and
//! process execution, over any [`GuestAgent`] transport.
//!
//! The transport is a trait so the protocol can be tested without a guest: libvirt's test
//! driver answers every agent command with "not supported", and a real agent needs a
//! booted VM. Production uses `virDomainQemuAgentCommand` (see `bootstrap`); the tests use an
//! in-memory agent. Every request is built with a JSON encoder and every reply parsed
//! with a JSON decoder; nothing is spliced into strings by hand.
//!
//! Rules this module enforces (docs/design.md §4.5): files are written in bounded chunks with
//! `guest-file-open/write/close` (no argv size limit, nothing in the guest's process
//! list); a process killed by a signal is a failure, as is one that reports no exit code;
//! the captured output quoted in an error is bounded.

use std::future::Future;
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use bigfleet_libvirt_domain::Timestamp;
use bigfleet_libvirt_ports::Clock;
use serde_json::{Value, json};

use crate::host::backoff::Backoff;
use crate::options::AgentPolicy;

/// Why an agent command failed, as far as the protocol cares.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AgentError {
    /// Agent commands cannot work for this domain (driver without agent support, no agent
    /// channel, domain gone, domain no longer running): waiting will not help.
    Unsupported(String),
    /// The agent is not answering yet (guest booting, agent not started, domain paused).
    NotReady(String),
    /// The agent answered with an error, or the call failed otherwise.
    Failed(String),
}

impl AgentError {
    /// The message.
    #[must_use]
    pub fn message(&self) -> &str {
        match self {
            AgentError::Unsupported(m) | AgentError::NotReady(m) | AgentError::Failed(m) => m,
        }
    }
}

/// A channel to one guest's qemu agent.
pub trait GuestAgent: Send + Sync {
    /// Sends one JSON command and returns the raw JSON reply. `timeout_secs` bounds how
    /// long the agent may take to answer.
    fn command(
        &self,
        json: String,
        timeout_secs: i32,
    ) -> impl Future<Output = Result<String, AgentError>> + Send;
}

/// The first wait before re-pinging an agent that did not answer.
const FIRST_PING_RETRY: Duration = Duration::from_millis(200);

/// The first wait before polling a guest command's status again.
const FIRST_POLL: Duration = Duration::from_millis(50);

/// A finished guest process.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ExecStatus {
    /// Whether the process has ended.
    pub exited: bool,
    /// Its exit code, when it exited normally.
    pub exit_code: Option<i64>,
    /// The signal that killed it, if one did.
    pub signal: Option<i64>,
    /// Captured standard output.
    pub stdout: Vec<u8>,
    /// Captured standard error.
    pub stderr: Vec<u8>,
}

/// `{"execute": name, "arguments": arguments}`.
#[must_use]
pub fn request(name: &str, arguments: Option<Value>) -> String {
    match arguments {
        Some(arguments) => json!({ "execute": name, "arguments": arguments }),
        None => json!({ "execute": name }),
    }
    .to_string()
}

/// The `return` member of a reply; an `error` member becomes a failure.
///
/// # Errors
/// The agent's error description, or a parse failure.
pub fn returned(reply: &str) -> Result<Value, String> {
    let value: Value =
        serde_json::from_str(reply).map_err(|e| format!("unparsable agent reply: {e}"))?;
    if let Some(error) = value.get("error") {
        let class = error
            .get("class")
            .and_then(Value::as_str)
            .unwrap_or("Error");
        let desc = error
            .get("desc")
            .and_then(Value::as_str)
            .unwrap_or("no description");
        return Err(format!("agent error {class}: {desc}"));
    }
    value
        .get("return")
        .cloned()
        .ok_or_else(|| "agent reply has no return value".to_owned())
}

/// Sends `name` and returns its `return` member.
pub(crate) async fn call<A: GuestAgent>(
    agent: &A,
    policy: &AgentPolicy,
    name: &str,
    arguments: Option<Value>,
) -> Result<Value, String> {
    let reply = agent
        .command(request(name, arguments), policy.command_timeout_secs)
        .await
        .map_err(|e| format!("{name}: {}", e.message()))?;
    returned(&reply).map_err(|e| format!("{name}: {e}"))
}

/// Pings until the agent answers, or until `until` on `clock` (a ping in flight then is
/// the last). Gives up at once on [`AgentError::Unsupported`].
///
/// # Errors
/// Why agent commands cannot work for this domain, or that the agent stayed silent until
/// `until` (with the last ping's answer).
pub async fn wait_ready<A: GuestAgent, C: Clock>(
    agent: &A,
    clock: &C,
    policy: &AgentPolicy,
    until: Timestamp,
) -> Result<(), String> {
    let ping = request("guest-ping", None);
    let mut backoff = Backoff::new(
        FIRST_PING_RETRY.min(policy.ping_retry),
        policy.ping_retry,
        0,
    );
    let started = clock.now();
    loop {
        let last = match agent.command(ping.clone(), policy.ping_timeout_secs).await {
            Ok(reply) if returned(&reply).is_ok() => return Ok(()),
            Err(AgentError::Unsupported(why)) => {
                return Err(format!("the qemu guest agent cannot be reached: {why}"));
            }
            Ok(reply) => format!("it answered {}", bound(reply.as_bytes(), 200)),
            Err(e) => format!("the last ping: {}", bound(e.message().as_bytes(), 200)),
        };
        let now = clock.now();
        if now >= until {
            let waited = Duration::from_secs(now.saturating_since(started).as_secs());
            return Err(format!(
                "the qemu guest agent did not answer for {waited:?} ({last}); the guest may \
                 not have booted, or its image runs no qemu-guest-agent on the \
                 org.qemu.guest_agent.0 port"
            ));
        }
        let next = now.saturating_add(backoff.next_wait()).min(until);
        clock.sleep_until(next).await;
    }
}

/// Writes `bytes` to `path` in the guest (created or truncated) in chunks.
///
/// # Errors
/// The failing step; the handle is closed whatever happened.
pub async fn write_file<A: GuestAgent>(
    agent: &A,
    policy: &AgentPolicy,
    path: &str,
    bytes: &[u8],
) -> Result<(), String> {
    let opened = call(
        agent,
        policy,
        "guest-file-open",
        Some(json!({ "path": path, "mode": "w" })),
    )
    .await?;
    let handle = opened
        .as_i64()
        .ok_or_else(|| format!("guest-file-open returned no handle: {opened}"))?;
    let written = write_chunks(agent, policy, handle, bytes).await;
    let closed = call(
        agent,
        policy,
        "guest-file-close",
        Some(json!({ "handle": handle })),
    )
    .await;
    written?;
    closed.map(|_| ())
}

async fn write_chunks<A: GuestAgent>(
    agent: &A,
    policy: &AgentPolicy,
    handle: i64,
    bytes: &[u8],
) -> Result<(), String> {
    let mut rest = bytes;
    while !rest.is_empty() {
        let chunk = &rest[..rest.len().min(policy.chunk_bytes.max(1))];
        let arguments = json!({
            "handle": handle,
            "buf-b64": BASE64.encode(chunk),
            "count": chunk.len(),
        });
        let reply = call(agent, policy, "guest-file-write", Some(arguments)).await?;
        let count = reply
            .get("count")
            .and_then(Value::as_u64)
            .and_then(|c| usize::try_from(c).ok())
            .filter(|c| *c > 0 && *c <= chunk.len())
            .ok_or_else(|| format!("guest-file-write wrote no data: {reply}"))?;
        rest = &rest[count..];
    }
    Ok(())
}

/// Starts `path args…` in the guest with output captured and polls until it ends.
///
/// # Errors
/// A failed command or an unparsable reply (not a non-zero exit: see [`judge`]).
pub async fn exec<A: GuestAgent, C: Clock>(
    agent: &A,
    clock: &C,
    policy: &AgentPolicy,
    path: &str,
    args: &[&str],
) -> Result<ExecStatus, String> {
    let arguments = json!({ "path": path, "arg": args, "capture-output": true });
    let started = call(agent, policy, "guest-exec", Some(arguments)).await?;
    let pid = started
        .get("pid")
        .and_then(Value::as_i64)
        .filter(|pid| *pid > 0)
        .ok_or_else(|| format!("guest-exec reply has no pid: {started}"))?;
    let first = FIRST_POLL.min(policy.poll_interval);
    let mut backoff = Backoff::new(first, policy.poll_interval, pid.unsigned_abs());
    loop {
        let reply = call(
            agent,
            policy,
            "guest-exec-status",
            Some(json!({ "pid": pid })),
        )
        .await
        .map_err(|e| format!("{e} (pid {pid})"))?;
        let status = parse_status(&reply)?;
        if status.exited {
            return Ok(status);
        }
        let next = clock.now().saturating_add(backoff.next_wait());
        clock.sleep_until(next).await;
    }
}

/// Parses a `guest-exec-status` return value.
///
/// # Errors
/// When `exited` is missing or captured data is not base64.
pub fn parse_status(value: &Value) -> Result<ExecStatus, String> {
    let exited = value
        .get("exited")
        .and_then(Value::as_bool)
        .ok_or_else(|| format!("guest-exec-status reply has no 'exited': {value}"))?;
    let data = |key: &str| -> Result<Vec<u8>, String> {
        match value.get(key).and_then(Value::as_str) {
            Some(encoded) => BASE64
                .decode(encoded)
                .map_err(|e| format!("guest-exec-status {key} is not base64: {e}")),
            None => Ok(Vec::new()),
        }
    };
    Ok(ExecStatus {
        exited,
        exit_code: value.get("exitcode").and_then(Value::as_i64),
        signal: value.get("signal").and_then(Value::as_i64),
        stdout: data("out-data")?,
        stderr: data("err-data")?,
    })
}

/// Success only for a normal exit with code 0; a signal, a non-zero code, or no code at
/// all is a failure quoting the (bounded) captured output.
///
/// # Errors
/// The failure, for `last_error`.
pub fn judge(what: &str, status: &ExecStatus, limit: usize) -> Result<(), String> {
    let how = match (status.signal, status.exit_code) {
        (Some(signal), _) => format!("was killed by signal {signal}"),
        (None, Some(0)) => return Ok(()),
        (None, Some(code)) => format!("exited {code}"),
        (None, None) => "ended without reporting an exit code".to_owned(),
    };
    Err(format!(
        "{what} {how} (stderr: {}) (stdout: {})",
        bound(&status.stderr, limit),
        bound(&status.stdout, limit)
    ))
}

/// Captured output as text: lossy UTF-8, trimmed, and cut to its last `limit` bytes (on
/// a character boundary), marked with a leading `…`.
#[must_use]
pub fn bound(bytes: &[u8], limit: usize) -> String {
    let text = String::from_utf8_lossy(bytes);
    let text = text.trim();
    if text.len() <= limit {
        return text.to_owned();
    }
    let mut start = text.len() - limit;
    while !text.is_char_boundary(start) {
        start += 1;
    }
    format!("…{}", &text[start..])
}

#[cfg(test)]
#[path = "agent_tests.rs"]
mod tests;
