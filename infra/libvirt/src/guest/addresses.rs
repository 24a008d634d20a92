//! The guest's network addresses, read once through the guest agent after a successful
//! Configure (`guest-network-get-interfaces`) and shown on the Configure log line.
//!
//! Reading them is a courtesy to the operator, never part of Configure's outcome: the call
//! has its own short bound, and any failure (an agent without the command, a guest with no
//! NIC, a slow answer) is a warning. Loopback interfaces and addresses are left out, and
//! at most [`SHOWN`] addresses are shown, so a guest with many interfaces (a Kubernetes
//! node's veths) cannot flood the log.

use std::net::IpAddr;
use std::time::Duration;

use bigfleet_libvirt_ports::Clock;
use futures::FutureExt;
use serde_json::Value;

use crate::guest::agent::{GuestAgent, request, returned};

/// How long the agent may take to list the interfaces.
pub const TIMEOUT: Duration = Duration::from_secs(5);

/// The most addresses shown; the rest are counted.
pub const SHOWN: usize = 8;

/// The most interfaces read from one reply.
const INTERFACES: usize = 64;

/// One guest interface with its non-loopback addresses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GuestInterface {
    /// The guest's name for it (`eth0`, `enp1s0`).
    pub name: String,
    /// Its MAC address, when the agent reports one.
    pub mac: Option<String>,
    /// `address/prefix`, IPv4 and IPv6, in the agent's order.
    pub addresses: Vec<String>,
}

/// Parses a `guest-network-get-interfaces` return value, leaving out loopback.
///
/// # Errors
/// When the value is not a list of interfaces.
pub fn parse(value: &Value) -> Result<Vec<GuestInterface>, String> {
    let list = value
        .as_array()
        .ok_or_else(|| format!("guest-network-get-interfaces returned no list: {value}"))?;
    let mut out = Vec::new();
    for item in list.iter().take(INTERFACES) {
        let name = item.get("name").and_then(Value::as_str).unwrap_or("?");
        let addresses: Vec<String> = (item.get("ip-addresses").and_then(Value::as_array))
            .into_iter()
            .flatten()
            .filter_map(|a| {
                let ip: IpAddr = a.get("ip-address")?.as_str()?.parse().ok()?;
                let prefix = a.get("prefix").and_then(Value::as_u64);
                (!ip.is_loopback()).then(|| match prefix {
                    Some(prefix) => format!("{ip}/{prefix}"),
                    None => ip.to_string(),
                })
            })
            .collect();
        if name == "lo" || (addresses.is_empty() && is_loopback_mac(item)) {
            continue;
        }
        out.push(GuestInterface {
            name: name.to_owned(),
            mac: (item.get("hardware-address").and_then(Value::as_str))
                .filter(|mac| !mac.is_empty())
                .map(str::to_owned),
            addresses,
        });
    }
    Ok(out)
}

/// Loopback reports the all-zero hardware address.
fn is_loopback_mac(item: &Value) -> bool {
    item.get("hardware-address").and_then(Value::as_str) == Some("00:00:00:00:00:00")
}

/// `eth0 52:54:00:12:34:56 192.168.122.7/24 fe80::1/64; eth1 …`, at most [`SHOWN`]
/// addresses, then `(+N more)`; `none` when the guest reports no interface.
#[must_use]
pub fn summary(interfaces: &[GuestInterface]) -> String {
    let total: usize = interfaces.iter().map(|i| i.addresses.len()).sum();
    let mut left = SHOWN;
    let mut parts = Vec::new();
    for interface in interfaces {
        if left == 0 {
            break;
        }
        let mut part = interface.name.clone();
        if let Some(mac) = &interface.mac {
            part.push(' ');
            part.push_str(mac);
        }
        let shown: Vec<&str> = (interface.addresses.iter().take(left))
            .map(String::as_str)
            .collect();
        left -= shown.len();
        if shown.is_empty() {
            part.push_str(" (no address)");
        } else {
            part.push(' ');
            part.push_str(&shown.join(" "));
        }
        parts.push(part);
    }
    if parts.is_empty() {
        return "none".to_owned();
    }
    let mut out = parts.join("; ");
    if total > SHOWN {
        out.push_str(&format!(" (+{} more)", total - SHOWN));
    }
    out
}

/// Asks the agent once for the guest's interfaces, within [`TIMEOUT`].
///
/// # Errors
/// Why they could not be read (for a warning).
pub async fn read<A: GuestAgent, C: Clock>(
    agent: &A,
    clock: &C,
) -> Result<Vec<GuestInterface>, String> {
    let timeout_secs = i32::try_from(TIMEOUT.as_secs()).unwrap_or(i32::MAX);
    let asked = agent.command(request("guest-network-get-interfaces", None), timeout_secs);
    let deadline = clock.now().saturating_add(TIMEOUT);
    let reply = futures::select_biased! {
        reply = asked.fuse() => reply.map_err(|e| e.message().to_owned())?,
        () = clock.sleep_until(deadline).fuse() => {
            return Err(format!("no answer within {}s", TIMEOUT.as_secs()));
        }
    };
    parse(&returned(&reply)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn reply() -> Value {
        json!([
            {"name": "lo", "hardware-address": "00:00:00:00:00:00", "ip-addresses": [
                {"ip-address-type": "ipv4", "ip-address": "127.0.0.1", "prefix": 8},
                {"ip-address-type": "ipv6", "ip-address": "::1", "prefix": 128}]},
            {"name": "enp1s0", "hardware-address": "52:54:00:aa:bb:cc", "ip-addresses": [
                {"ip-address-type": "ipv4", "ip-address": "192.168.122.7", "prefix": 24},
                {"ip-address-type": "ipv6", "ip-address": "fe80::5054:ff:feaa:bbcc", "prefix": 64}],
             "statistics": {"rx-bytes": 1}},
            {"name": "enp2s0", "hardware-address": "52:54:00:dd:ee:ff"}
        ])
    }

    #[test]
    fn loopback_is_left_out_and_ipv4_ipv6_and_mac_are_shown() {
        let interfaces = parse(&reply()).unwrap();
        assert_eq!(interfaces.len(), 2, "{interfaces:?}");
        assert_eq!(interfaces[0].name, "enp1s0");
        assert_eq!(interfaces[0].mac.as_deref(), Some("52:54:00:aa:bb:cc"));
        assert_eq!(
            interfaces[0].addresses,
            ["192.168.122.7/24", "fe80::5054:ff:feaa:bbcc/64"]
        );
        assert_eq!(
            summary(&interfaces),
            "enp1s0 52:54:00:aa:bb:cc 192.168.122.7/24 fe80::5054:ff:feaa:bbcc/64; \
             enp2s0 52:54:00:dd:ee:ff (no address)"
        );
        assert_eq!(summary(&[]), "none");
        assert!(parse(&json!({"not": "a list"})).is_err());
    }

    #[test]
    fn a_loopback_address_on_another_interface_is_left_out_too() {
        let value = json!([{"name": "dummy0", "ip-addresses": [
            {"ip-address-type": "ipv4", "ip-address": "127.0.0.2", "prefix": 8},
            {"ip-address-type": "ipv4", "ip-address": "10.0.0.2"}]}]);
        let interfaces = parse(&value).unwrap();
        assert_eq!(interfaces[0].addresses, ["10.0.0.2"]);
        assert_eq!(interfaces[0].mac, None);
    }

    #[test]
    fn at_most_eight_addresses_are_shown_and_the_rest_counted() {
        let many: Vec<Value> = (0..20)
            .map(|i| {
                json!({"name": format!("veth{i}"), "ip-addresses": [
                    {"ip-address-type": "ipv4", "ip-address": format!("10.1.0.{i}"), "prefix": 32}]})
            })
            .collect();
        let interfaces = parse(&Value::Array(many)).unwrap();
        let shown = summary(&interfaces);
        assert_eq!(shown.matches("10.1.0.").count(), SHOWN, "{shown}");
        assert!(shown.ends_with("(+12 more)"), "{shown}");
    }
}
