//! Before Configure or Drain runs anything in a guest, the agent is asked which commands it
//! allows (`guest-info`). An image whose qemu guest agent has `guest-exec` or the file
//! commands turned off (`--block-rpcs`, `--allow-rpcs` or the `[general]` section of its
//! configuration file; some distributions ship them off) can never be bootstrapped this
//! way: without the probe, Configure would find out one command at a time, after preparing
//! the guest, and say only "Command guest-exec has been disabled". With it, the transition
//! fails at once, before anything ran in the guest, naming every command missing and what
//! to change in the image.
//!
//! An agent that cannot answer `guest-info` (none in use lacks it; it dates from qemu-ga's
//! first release) or answers it without a command list is not judged: the commands
//! themselves then say what is wrong.
//!
//! A first-boot machine's Drain asks the same question ([`allows`]) and, when the agent
//! forbids `guest-exec` (Talos's does), shuts the guest down instead of running the hook.

use serde_json::Value;

use crate::guest::agent::{self, GuestAgent};
use crate::options::AgentPolicy;

/// What Configure's bootstrap runs through the agent.
pub const BOOTSTRAP: [&str; 5] = [
    "guest-exec",
    "guest-exec-status",
    "guest-file-open",
    "guest-file-write",
    "guest-file-close",
];

/// What Drain runs through the agent.
pub const DRAIN: [&str; 2] = ["guest-exec", "guest-exec-status"];

/// The most bytes of the agent's version quoted.
const VERSION_BYTES: usize = 64;

/// Fails when the agent says it does not allow one of `needed`; `purpose` names the step
/// for the message.
///
/// # Errors
/// The commands missing or disabled, and the fix.
pub async fn require<A: GuestAgent>(
    agent: &A,
    policy: &AgentPolicy,
    needed: &[&str],
    purpose: &str,
) -> Result<(), String> {
    let info = match agent::call(agent, policy, "guest-info", None).await {
        Ok(info) => info,
        Err(e) => {
            tracing::debug!(error = %e, "guest-info unanswered; the agent's commands are not checked first");
            return Ok(());
        }
    };
    let Some(missing) = missing(&info, needed) else {
        return Ok(());
    };
    if missing.is_empty() {
        return Ok(());
    }
    let version = info
        .get("version")
        .and_then(Value::as_str)
        .map(|v| format!(" {}", agent::bound(v.as_bytes(), VERSION_BYTES)))
        .unwrap_or_default();
    Err(format!(
        "{purpose} cannot run in this guest: its qemu guest agent{version} does not allow {} \
         (turned off by the agent's --block-rpcs or --allow-rpcs, or by its configuration \
         file); the golden image's agent must allow {}",
        missing.join(", "),
        needed.join(", ")
    ))
}

/// Whether the agent allows every command of `needed`: false only when its `guest-info`
/// answer lists them and one is missing or disabled (an agent that does not answer it is
/// given the benefit of the doubt, as by [`require`]).
pub async fn allows<A: GuestAgent>(agent: &A, policy: &AgentPolicy, needed: &[&str]) -> bool {
    match agent::call(agent, policy, "guest-info", None).await {
        Ok(info) => missing(&info, needed).is_none_or(|missing| missing.is_empty()),
        Err(_) => true,
    }
}

/// The commands of `needed` a `guest-info` answer does not list as enabled; `None` when the
/// answer has no command list.
fn missing<'a>(info: &Value, needed: &[&'a str]) -> Option<Vec<&'a str>> {
    let listed = info.get("supported_commands")?.as_array()?;
    let enabled = |name: &str| {
        listed.iter().any(|command| {
            command.get("name").and_then(Value::as_str) == Some(name)
                && command.get("enabled").and_then(Value::as_bool) != Some(false)
        })
    };
    Some(needed.iter().copied().filter(|n| !enabled(n)).collect())
}
