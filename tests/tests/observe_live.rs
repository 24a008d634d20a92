//! The observability pack against the running binary (issue 18): every series the alert
//! rules and the dashboard query is one the provider really exports on `/metrics`, and a
//! real Prometheus server (Debian's `prometheus`) scraping the provider on loopback takes
//! the host-unreachable alert to `firing` for a libvirt zone whose host cannot be reached.
//!
//! The provider runs the libvirt backend against two test-driver zones: `good` (a node
//! file) and `dead` (a node file that does not exist, so every dial fails and the zone
//! stays unreachable, as a host that is down would).

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bigfleet_libvirt_libvirt::fixture::{self, Fixture};
use bigfleet_libvirt_proto::v1alpha1::MachineState as S;
use serde_json::Value;

use crate::deploy::yaml_docs;
use crate::deploy::{Tools, tools};
use crate::harness::tls::{Ca, arg, write};
use crate::harness::*;
use crate::observe::{DASHBOARD, RULES, alerts, read};

/// Series Prometheus itself records for every target, not the provider.
const SYNTHETIC: &[&str] = &["up"];

/// The provider with a reachable zone `good` and an unreachable zone `dead`.
fn start_provider(dir: &Path) -> Server {
    let good = Fixture {
        cpus: 32,
        memory_mib: 256 * 1024,
        ..Fixture::default()
    }
    .write(dir, "good.xml")
    .expect("write the fixture");
    let dead = fixture::uri(&dir.join("missing.xml"));
    let connect = format!("--connect=good={good},dead={dead}");
    Server::start(&[
        connect.as_str(),
        "--image=base.qcow2",
        "--provider=observe",
        "--seed-count=4",
        "--reconcile-interval=1s",
    ])
}

/// What a provider with mTLS, and so client identities enforced, exports: the refusal
/// counters exist there from the start, at 0.
async fn exported_under_mtls() -> BTreeSet<String> {
    let ca = Ca::new("observe test CA");
    let leaf = ca.server("observe server", 1);
    let dir = tempfile::tempdir().unwrap();
    let cert = arg(
        "--tls-cert",
        &write(dir.path(), "server.pem", &leaf.cert_pem),
    );
    let key = arg("--tls-key", &write(dir.path(), "server.key", &leaf.key_pem));
    let client_ca = arg("--tls-ca", &write(dir.path(), "ca.pem", &ca.pem));
    let server = Server::start(&[
        "--use-fake-backend",
        "--seed-count=2",
        &cert,
        &key,
        &client_ca,
    ]);
    exported(&scrape(&server).await)
}

async fn scrape(server: &Server) -> String {
    let addr = server.metrics_addr.expect("metrics address");
    let (status, _, body) = http_get(addr, "/metrics").await.expect("GET /metrics");
    assert_eq!(status, 200);
    body
}

/// Sample names in a text exposition (`_total`, `_bucket`, … included).
fn exported(body: &str) -> BTreeSet<String> {
    let mut names: BTreeSet<String> = body
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| l.split(['{', ' ']).next().unwrap_or_default().to_owned())
        .collect();
    // A labelled family nobody has touched yet (refusals on a provider without mTLS) has
    // no sample, but its `# TYPE` line shows the binary exports it.
    for declared in body.lines().filter_map(|l| l.strip_prefix("# TYPE ")) {
        let mut parts = declared.split(' ');
        let (Some(name), Some(kind)) = (parts.next(), parts.next()) else {
            continue;
        };
        match kind {
            "counter" => {
                names.insert(format!("{name}_total"));
            }
            "histogram" => {
                for suffix in ["_bucket", "_sum", "_count"] {
                    names.insert(format!("{name}{suffix}"));
                }
            }
            _ => {
                names.insert(name.to_owned());
            }
        }
    }
    names
}

/// The metric names a PromQL expression selects: identifiers outside label matchers,
/// ranges and strings that are not functions, keywords, grouping labels or numbers.
fn series_in(expr: &str) -> BTreeSet<String> {
    let mut cleaned = String::new();
    let (mut braces, mut brackets, mut quoted) = (0, 0, false);
    for c in expr.chars() {
        match c {
            _ if quoted => quoted = c != '"',
            '"' => quoted = true,
            '{' => braces += 1,
            '}' => braces -= 1,
            '[' => brackets += 1,
            ']' => brackets -= 1,
            _ if braces == 0 && brackets == 0 => {
                cleaned.push(c);
                continue;
            }
            _ => {}
        }
        cleaned.push(' ');
    }
    // Binary operators, modifiers, and aggregations (`sum by (x) (…)` puts the grouping
    // between the aggregation and its parenthesis).
    const KEYWORDS: &[&str] = &[
        "and",
        "or",
        "unless",
        "bool",
        "offset",
        "sum",
        "min",
        "max",
        "avg",
        "group",
        "stddev",
        "stdvar",
        "count",
        "count_values",
        "bottomk",
        "topk",
        "quantile",
    ];
    const GROUPING: &[&str] = &[
        "by",
        "without",
        "on",
        "ignoring",
        "group_left",
        "group_right",
    ];
    let chars: Vec<char> = cleaned.chars().collect();
    let mut names = BTreeSet::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if !(c.is_ascii_alphabetic() || c == '_' || c == ':') {
            if c.is_ascii_digit() || c == '$' {
                while i < chars.len()
                    && (chars[i].is_ascii_alphanumeric() || "._$".contains(chars[i]))
                {
                    i += 1;
                }
            } else {
                i += 1;
            }
            continue;
        }
        let start = i;
        while i < chars.len()
            && (chars[i].is_ascii_alphanumeric() || chars[i] == '_' || chars[i] == ':')
        {
            i += 1;
        }
        let word: String = chars[start..i].iter().collect();
        let mut next = i;
        while next < chars.len() && chars[next].is_whitespace() {
            next += 1;
        }
        let call = chars.get(next) == Some(&'(');
        if GROUPING.contains(&word.as_str()) && call {
            // Skip the label list.
            while i < chars.len() && chars[i] != ')' {
                i += 1;
            }
        } else if !call && !KEYWORDS.contains(&word.as_str()) {
            names.insert(word);
        }
    }
    names
}

/// The first argument of a Grafana `label_values(<selector>, <label>)` variable query.
fn label_values_selector(query: &str) -> &str {
    let inner = query
        .strip_prefix("label_values(")
        .and_then(|q| q.strip_suffix(')'))
        .unwrap_or_else(|| panic!("not a label_values query: {query}"));
    inner
        .rsplit_once(',')
        .map_or(inner, |(selector, _)| selector)
}

#[test]
fn the_series_parser_reads_names_not_functions_or_labels() {
    let expr = r#"histogram_quantile(0.99, sum by (method, le) (rate(a_bucket{job="x", code!="OK"}[$__rate_interval]))) / on (job) b_total > 0.25 and c offset 5m"#;
    let names: Vec<String> = series_in(expr).into_iter().collect();
    assert_eq!(names, ["a_bucket", "b_total", "c"]);
    assert_eq!(
        label_values_selector(r#"label_values(r{job="a,b"}, instance)"#),
        r#"r{job="a,b"}"#
    );
}

/// Every series the alert rules, the dashboard's panels and its variables use, each with
/// where it is used.
fn used_series(tools: &Tools) -> Vec<(String, String)> {
    let mut used: Vec<(String, String)> = Vec::new();
    let rules = &yaml_docs(tools, &read(RULES))[0];
    for rule in alerts(rules) {
        let name = rule["alert"].as_str().unwrap();
        for series in series_in(rule["expr"].as_str().unwrap()) {
            used.push((series, format!("alert {name}")));
        }
    }
    let dashboard: Value = serde_json::from_str(&read(DASHBOARD)).unwrap();
    for panel in dashboard["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().unwrap() {
            for series in series_in(target["expr"].as_str().unwrap()) {
                used.push((series, format!("panel {}", panel["title"])));
            }
        }
    }
    for variable in dashboard["templating"]["list"].as_array().unwrap() {
        if let Some(query) = variable["query"]["query"].as_str() {
            for series in series_in(label_values_selector(query)) {
                used.push((series, format!("variable {}", variable["name"])));
            }
        }
    }
    used
}

#[tokio::test]
async fn every_series_in_the_rules_and_dashboard_is_exported() {
    let Some(tools) = skip::needs(skip::DEPLOY_TOOLS, tools()) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let server = start_provider(dir.path());
    let mut c = server.client().await;
    // One machine through Create gives the gRPC, transition and libvirt phase series.
    let id = pick(&server, &mut c).await;
    create(&mut c, &id, None).await.expect("Create");
    reach(&mut c, &id, S::Idle, SETTLE).await;

    // The reconcile loop runs every second; its counter appears after the first run.
    let started = Instant::now();
    let mut body = scrape(&server).await;
    while !body.contains("bigfleet_libvirt_reconcile_total") {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "no reconcile run within 60 s:\n{body}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
        body = scrape(&server).await;
    }
    let mut exported = exported(&body);
    exported.extend(exported_under_mtls().await);
    assert!(
        body.lines().any(|l| l == "bigfleet_libvirt_ready 1"),
        "a serving provider exports bigfleet_libvirt_ready 1:\n{body}"
    );

    let used = used_series(tools);
    let distinct: BTreeSet<&str> = used.iter().map(|(s, _)| s.as_str()).collect();
    println!(
        "{} series used by the rules and the dashboard: {distinct:?}",
        distinct.len()
    );
    assert!(
        distinct.len() >= 10,
        "the parser found too few: {distinct:?}"
    );
    let missing: Vec<&(String, String)> = used
        .iter()
        .filter(|(s, _)| !exported.contains(s) && !SYNTHETIC.contains(&s.as_str()))
        .collect();
    assert!(
        missing.is_empty(),
        "used but not exported by the binary: {missing:?}\nexported: {exported:?}"
    );
}

/// A Prometheus server process; killed when dropped.
struct Prometheus {
    child: Child,
    addr: SocketAddr,
    log: std::path::PathBuf,
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Prometheus {
    /// Starts `prometheus` scraping `target` every second and evaluating `rules` every
    /// second, with its storage under `dir`, on a loopback port it picks itself; returns once
    /// it has logged that port.
    fn start(dir: &Path, target: SocketAddr, rules: &Path) -> Prometheus {
        let config = dir.join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nrule_files:\n  - {}\n\
                 scrape_configs:\n  - job_name: bigfleet-libvirt\n    static_configs:\n      \
                 - targets: ['{target}']\n",
                rules.display()
            ),
        )
        .unwrap();
        let (ok, out) = crate::observe::promtool(dir, &["check", "config", "prometheus.yml"]);
        assert!(ok, "promtool check config:\n{out}");
        // Prometheus binds port 0 itself and logs the port it got: no port is picked here and
        // released for it, so no other process can take it in between.
        let log = dir.join("prometheus.log");
        let child = Command::new("prometheus")
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg("--web.listen-address=127.0.0.1:0")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap_or_else(|e| {
                panic!("cannot run prometheus ({e}): scripts/install-deps.sh installs it")
            });
        let unbound = SocketAddr::from(([127, 0, 0, 1], 0));
        let mut prometheus = Prometheus {
            child,
            addr: unbound,
            log,
        };
        let started = Instant::now();
        prometheus.addr = loop {
            if let Some(addr) = listening_on(&prometheus.log_text()) {
                break addr;
            }
            prometheus.assert_running();
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "prometheus logged no listening address within 30 s:\n{}",
                prometheus.log_text()
            );
            std::thread::sleep(Duration::from_millis(50));
        };
        prometheus
    }

    async fn get(&self, path: &str) -> Option<Value> {
        let (status, _, body) = http_get(self.addr, path).await.ok()?;
        if status != 200 {
            return None;
        }
        serde_json::from_str(&body).ok()
    }

    /// Panics with the log when the server has exited.
    fn assert_running(&mut self) {
        if let Some(status) = self.child.try_wait().expect("try_wait prometheus") {
            panic!("prometheus exited ({status}):\n{}", self.log_text());
        }
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

/// The address Prometheus's web server bound, from its log line
/// `msg="Listening on" address=127.0.0.1:PORT` (written once the listener is bound).
fn listening_on(log: &str) -> Option<SocketAddr> {
    log.lines()
        .filter(|line| line.contains("msg=\"Listening on\""))
        .find_map(|line| {
            let address = line.split("address=").nth(1)?;
            address.split_whitespace().next()?.parse().ok()
        })
}

/// The rules file with every `for:` shortened to 5 s, so the live test need not wait 5 min.
fn short_holds(rules: &str) -> String {
    rules
        .lines()
        .map(|line| {
            if line.trim_start().starts_with("for:") {
                let indent = line.len() - line.trim_start().len();
                format!("{}for: 5s\n", " ".repeat(indent))
            } else {
                format!("{line}\n")
            }
        })
        .collect()
}

#[tokio::test]
async fn prometheus_scrapes_the_provider_and_fires_host_unreachable() {
    let dir = tempfile::tempdir().unwrap();
    let server = start_provider(dir.path());
    let rules = dir.path().join("bigfleet-libvirt.rules.yml");
    std::fs::write(&rules, short_holds(&read(RULES))).unwrap();
    let (ok, out) = crate::observe::promtool(
        dir.path(),
        &["check", "rules", "bigfleet-libvirt.rules.yml"],
    );
    assert!(ok, "{out}");
    let mut prometheus = Prometheus::start(
        dir.path(),
        server.metrics_addr.expect("metrics address"),
        &rules,
    );

    let started = Instant::now();
    let bound = Duration::from_secs(120);
    let mut last = Value::Null;
    let firing = loop {
        if let Some(alerts) = prometheus.get("/api/v1/alerts").await {
            let found = alerts["data"]["alerts"].as_array().and_then(|list| {
                list.iter()
                    .find(|a| {
                        a["labels"]["alertname"] == "BigfleetLibvirtHostUnreachable"
                            && a["labels"]["zone"] == "dead"
                            && a["state"] == "firing"
                    })
                    .cloned()
            });
            if let Some(alert) = found {
                break alert;
            }
            last = alerts;
        }
        prometheus.assert_running();
        if started.elapsed() > bound {
            let targets = prometheus.get("/api/v1/targets").await;
            panic!(
                "BigfleetLibvirtHostUnreachable{{zone=\"dead\"}} not firing within {bound:?}.\n\
                 alerts: {last}\ntargets: {targets:?}\nprometheus log:\n{}",
                prometheus.log_text()
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    println!(
        "BigfleetLibvirtHostUnreachable reached firing {:.1} s after Prometheus started: {firing}",
        started.elapsed().as_secs_f64()
    );
    assert_eq!(firing["labels"]["job"], "bigfleet-libvirt");
    assert_eq!(firing["labels"]["severity"], "critical");
    assert!(
        firing["annotations"]["description"]
            .as_str()
            .is_some_and(|d| d.contains("zone dead")),
        "{firing}"
    );

    // Only what is really wrong fires: the good zone and the (ready) provider stay quiet.
    let alerts = prometheus.get("/api/v1/alerts").await.expect("alerts");
    let list = alerts["data"]["alerts"].as_array().unwrap();
    assert!(
        !list.iter().any(|a| a["labels"]["zone"] == "good"),
        "the good zone alerts: {alerts}"
    );
    assert!(
        !list
            .iter()
            .any(|a| a["labels"]["alertname"] == "BigfleetLibvirtNotReady"),
        "a ready provider alerts not ready: {alerts}"
    );
    let up = prometheus
        .get("/api/v1/query?query=bigfleet_libvirt_ready")
        .await
        .expect("query");
    assert_eq!(up["data"]["result"][0]["value"][1], "1", "{up}");
}
