//! The observability pack (issue 18), checked offline: the alert rules pass `promtool check
//! rules` and their promtool unit tests (every alert fires on a history that should fire
//! it and stays silent on one that should not), the chart renders a ServiceMonitor, a
//! PrometheusRule, a NetworkPolicy and the Grafana dashboard ConfigMap only when asked,
//! and they validate (kubernetes-validate for the NetworkPolicy, the vendored
//! prometheus-operator schemas for the custom resources). The rules and the dashboard have
//! one source, `deploy/helm/files/`; `deploy/monitoring/` holds copies that must match.
//!
//! `observe_live` runs the binary and a real Prometheus server against the same files.
//! promtool comes from Debian's `prometheus` package (`scripts/install-deps.sh`); helm,
//! kubernetes-validate and jsonschema from `scripts/install-tools.sh`.

use std::collections::BTreeSet;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::Value;

use crate::deploy::{Manifests, RELEASE, Tools, repo_root, temp_file, tools, yaml_docs};
use crate::harness::skip;

/// The chart's copies (the one source) and the plain copies beside the promtool tests.
pub(crate) const RULES: &str = "deploy/helm/files/bigfleet-libvirt.rules.yml";
pub(crate) const DASHBOARD: &str = "deploy/helm/files/bigfleet-libvirt-dashboard.json";
const PLAIN_RULES: &str = "deploy/monitoring/bigfleet-libvirt.rules.yml";
const PLAIN_DASHBOARD: &str = "deploy/monitoring/bigfleet-libvirt-dashboard.json";
const RULE_TESTS: &str = "deploy/monitoring/bigfleet-libvirt.rules.test.yml";

/// Values that turn the whole pack on, with a documented egress example.
const ALL_ON: &str = r#"metrics:
  serviceMonitor:
    enabled: true
    interval: 15s
    scrapeTimeout: 10s
    labels:
      release: kube-prometheus-stack
    relabelings:
      - sourceLabels: [__meta_kubernetes_pod_node_name]
        targetLabel: node
    metricRelabelings:
      - sourceLabels: [__name__]
        regex: process_virtual_memory_bytes
        action: drop
  prometheusRule:
    enabled: true
    labels:
      release: kube-prometheus-stack
  dashboard:
    enabled: true
    annotations:
      grafana_folder: BigFleet
networkPolicy:
  enabled: true
  grpcFrom:
    - namespaceSelector:
        matchLabels:
          kubernetes.io/metadata.name: bigfleet
      podSelector:
        matchLabels:
          app.kubernetes.io/name: bigfleet
  metricsFrom:
    - namespaceSelector:
        matchLabels:
          kubernetes.io/metadata.name: monitoring
      podSelector:
        matchLabels:
          app.kubernetes.io/name: prometheus
  egress:
    - to:
        - ipBlock:
            cidr: 192.0.2.0/24
      ports:
        - port: 22
          protocol: TCP
"#;

/// Runs `promtool` with `args` in `dir`: (success, stdout + stderr).
pub(crate) fn promtool(dir: &Path, args: &[&str]) -> (bool, String) {
    let output = Command::new("promtool")
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "cannot run promtool ({e}): install Debian's prometheus package \
                 (scripts/install-deps.sh does)"
            )
        });
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status.success(), text)
}

pub(crate) fn read(path: &str) -> String {
    std::fs::read_to_string(repo_root().join(path)).unwrap_or_else(|e| panic!("read {path}: {e}"))
}

/// Every alerting rule of a rules document (`{"groups": [...]}`).
pub(crate) fn alerts(rules: &Value) -> Vec<&Value> {
    rules["groups"]
        .as_array()
        .expect("groups")
        .iter()
        .flat_map(|g| g["rules"].as_array().expect("rules").iter())
        .filter(|r| r.get("alert").is_some())
        .collect()
}

fn alert_name(rule: &Value) -> String {
    rule["alert"].as_str().unwrap().to_owned()
}

#[test]
fn the_plain_rules_and_dashboard_are_copies_of_the_chart_files() {
    for (source, copy) in [(RULES, PLAIN_RULES), (DASHBOARD, PLAIN_DASHBOARD)] {
        assert!(
            read(source) == read(copy),
            "{copy} differs from {source}, its one source: edit {source}, then \
             `cp {source} {copy}`"
        );
    }
}

#[test]
fn promtool_checks_the_rules_and_every_alert_fires_and_stays_silent() {
    let Some(tools) = skip::needs(skip::DEPLOY_TOOLS, tools()) else {
        return;
    };
    let root = repo_root();
    let (ok, out) = promtool(&root, &["check", "rules", PLAIN_RULES]);
    assert!(ok, "promtool check rules {PLAIN_RULES}:\n{out}");
    println!("{out}");
    let rules = &yaml_docs(tools, &read(PLAIN_RULES))[0];
    let names: Vec<String> = alerts(rules).into_iter().map(alert_name).collect();
    assert!(
        out.contains(&format!("SUCCESS: {} rules found", names.len())),
        "{out}"
    );
    for rule in alerts(rules) {
        let name = alert_name(rule);
        let severity = rule["labels"]["severity"].as_str().unwrap_or("");
        assert!(
            ["critical", "warning"].contains(&severity),
            "{name}: severity must be critical or warning, not {severity:?}"
        );
        let summary = rule["annotations"]["summary"].as_str().unwrap_or("");
        let description = rule["annotations"]["description"].as_str().unwrap_or("");
        assert!(!summary.is_empty(), "{name} has no summary");
        assert!(
            description.contains("Likely cause"),
            "{name}: the description must name the likely cause: {description}"
        );
        assert!(
            description.matches('`').count() >= 2,
            "{name}: the description must give the first command to run, in backticks: \
             {description}"
        );
    }

    // Each alert has a case that fires it and one that leaves it silent.
    let tests = &yaml_docs(tools, &read(RULE_TESTS))[0];
    let mut fires = BTreeSet::new();
    let mut silent = BTreeSet::new();
    for case in tests["tests"].as_array().expect("tests") {
        for check in case["alert_rule_test"].as_array().expect("alert_rule_test") {
            let name = check["alertname"].as_str().unwrap().to_owned();
            assert!(names.contains(&name), "{RULE_TESTS} tests unknown {name}");
            if check["exp_alerts"]
                .as_array()
                .is_some_and(|a| !a.is_empty())
            {
                fires.insert(name);
            } else {
                silent.insert(name);
            }
        }
    }
    for name in &names {
        assert!(
            fires.contains(name),
            "{RULE_TESTS} has no case where {name} fires"
        );
        assert!(
            silent.contains(name),
            "{RULE_TESTS} has no case where {name} stays silent"
        );
    }
    let dir = root.join("deploy/monitoring");
    let (ok, out) = promtool(&dir, &["test", "rules", "bigfleet-libvirt.rules.test.yml"]);
    println!("{out}");
    assert!(ok && out.contains("SUCCESS"), "promtool test rules:\n{out}");

    // The firing cases have teeth: without one alert's rule, the tests fail on it.
    let text = read(PLAIN_RULES);
    for name in &names {
        let scratch = tempfile::tempdir().unwrap();
        std::fs::write(
            scratch.path().join("bigfleet-libvirt.rules.yml"),
            without_alert(&text, name),
        )
        .unwrap();
        std::fs::copy(
            root.join(RULE_TESTS),
            scratch.path().join("bigfleet-libvirt.rules.test.yml"),
        )
        .unwrap();
        let (ok, out) = promtool(
            scratch.path(),
            &["test", "rules", "bigfleet-libvirt.rules.test.yml"],
        );
        assert!(
            !ok && out.contains(&format!("alertname: {name}")),
            "the tests still pass without {name}:\n{out}"
        );
    }
}

/// The rules text with one alert's rule (from its `- alert:` line to the next rule or the
/// end) cut out.
fn without_alert(text: &str, name: &str) -> String {
    let start_line = format!("- alert: {name}");
    let mut out = String::new();
    let mut skipping = false;
    for line in text.lines() {
        let trimmed = line.trim_start();
        if trimmed.starts_with("- alert:") || trimmed.starts_with("- record:") {
            skipping = trimmed == start_line;
        }
        if !skipping {
            out.push_str(line);
            out.push('\n');
        }
    }
    assert_ne!(out, format!("{text}\n"), "{name} not found in the rules");
    out
}

#[test]
fn the_pack_is_off_by_default() {
    let Some(tools) = skip::needs(skip::DEPLOY_TOOLS, tools()) else {
        return;
    };
    let m = tools.render(&[]);
    let kinds = m.kinds();
    for kind in ["ServiceMonitor", "PrometheusRule", "NetworkPolicy"] {
        assert!(!kinds.contains(kind), "{kind} rendered by default");
    }
    assert!(
        !m.docs
            .iter()
            .any(|d| d["metadata"]["labels"].get("grafana_dashboard").is_some()),
        "the dashboard ConfigMap rendered by default"
    );
}

#[test]
fn everything_enabled_renders_a_valid_pack() {
    let Some(tools) = skip::needs(skip::DEPLOY_TOOLS, tools()) else {
        return;
    };
    let (_dir, values) = temp_file("all.values.yaml", ALL_ON);
    // render() already ran kubernetes-validate --strict over every object (the
    // NetworkPolicy included; it skips the custom resources with a warning).
    let m = tools.render(&["-f", &values]);
    for kind in ["ServiceMonitor", "PrometheusRule", "NetworkPolicy"] {
        assert!(m.kinds().contains(kind), "no {kind} in:\n{}", m.yaml);
    }
    validate_custom_resources(tools, &m);
    check_service_monitor(m.get("ServiceMonitor", RELEASE));
    check_network_policy(m.get("NetworkPolicy", RELEASE));

    // The PrometheusRule carries exactly the plain rules file, which promtool accepts.
    let rule = m.get("PrometheusRule", RELEASE);
    assert_eq!(
        rule["metadata"]["labels"]["release"],
        "kube-prometheus-stack"
    );
    let plain = &yaml_docs(tools, &read(PLAIN_RULES))[0];
    assert_eq!(
        &rule["spec"], plain,
        "the PrometheusRule's groups are the rules file"
    );
    let (_groups_dir, groups) = temp_file(
        "rendered.rules.json",
        &serde_json::to_string_pretty(&rule["spec"]).unwrap(),
    );
    let (ok, out) = promtool(&repo_root(), &["check", "rules", &groups]);
    assert!(ok, "promtool check rules on the rendered groups:\n{out}");
    println!("rendered PrometheusRule: {out}");

    // The dashboard ConfigMap carries the dashboard file, for Grafana's sidecar.
    let dashboard = m.get("ConfigMap", &format!("{RELEASE}-dashboard"));
    assert_eq!(dashboard["metadata"]["labels"]["grafana_dashboard"], "1");
    assert_eq!(
        dashboard["metadata"]["annotations"]["grafana_folder"],
        "BigFleet"
    );
    let shipped: Value =
        serde_json::from_str(dashboard["data"]["bigfleet-libvirt.json"].as_str().unwrap())
            .expect("the shipped dashboard parses");
    let source: Value = serde_json::from_str(&read(DASHBOARD)).unwrap();
    assert_eq!(shipped, source);
}

/// Validates the ServiceMonitor and PrometheusRule against the vendored CRD schemas.
fn validate_custom_resources(tools: &Tools, m: &Manifests) {
    let script = repo_root().join("tests/testdata/prometheus-operator/validate.py");
    let python: PathBuf = tools.bin.join("../venv/bin/python");
    let mut child = Command::new(&python)
        .arg(&script)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("run {}: {e}", python.display()));
    child
        .stdin
        .take()
        .unwrap()
        .write_all(serde_json::to_string(&m.docs).unwrap().as_bytes())
        .unwrap();
    let output = child.wait_with_output().unwrap();
    let report = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    println!("{report}");
    assert!(
        output.status.success(),
        "the custom resources do not match the prometheus-operator schemas:\n{report}"
    );
    assert!(report.contains("valid ServiceMonitor") && report.contains("valid PrometheusRule"));
}

fn check_service_monitor(sm: &Value) {
    assert_eq!(sm["metadata"]["labels"]["release"], "kube-prometheus-stack");
    assert_eq!(
        sm["spec"]["selector"]["matchLabels"]["app.kubernetes.io/instance"],
        RELEASE
    );
    assert_eq!(sm["spec"]["namespaceSelector"]["matchNames"][0], "bigfleet");
    let endpoint = &sm["spec"]["endpoints"][0];
    assert_eq!(endpoint["port"], "metrics", "the Service's metrics port");
    assert_eq!(endpoint["path"], "/metrics");
    assert_eq!(endpoint["interval"], "15s");
    assert_eq!(endpoint["scrapeTimeout"], "10s");
    let relabelings = endpoint["relabelings"].as_array().unwrap();
    assert_eq!(relabelings[0]["targetLabel"], "job", "the rules select job");
    assert_eq!(relabelings[0]["replacement"], "bigfleet-libvirt");
    assert_eq!(
        relabelings[1]["targetLabel"], "node",
        "the user's, after ours"
    );
    assert_eq!(endpoint["metricRelabelings"][0]["action"], "drop");
}

fn check_network_policy(np: &Value) {
    let spec = &np["spec"];
    assert_eq!(
        spec["podSelector"]["matchLabels"]["app.kubernetes.io/instance"],
        RELEASE
    );
    assert_eq!(
        spec["policyTypes"],
        serde_json::json!(["Ingress", "Egress"])
    );
    let ingress = spec["ingress"].as_array().unwrap();
    assert_eq!(ingress.len(), 2, "{ingress:?}");
    for rule in ingress {
        assert!(
            rule["from"].as_array().is_some_and(|f| !f.is_empty()),
            "an ingress rule without `from` admits everyone: {rule}"
        );
    }
    assert_eq!(
        ingress[0]["ports"],
        serde_json::json!([{"port": "grpc", "protocol": "TCP"}])
    );
    assert_eq!(
        ingress[0]["from"][0]["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"],
        "bigfleet"
    );
    assert_eq!(
        ingress[1]["ports"],
        serde_json::json!([{"port": "metrics", "protocol": "TCP"}])
    );
    assert_eq!(
        ingress[1]["from"][0]["podSelector"]["matchLabels"]["app.kubernetes.io/name"],
        "prometheus"
    );
    assert_eq!(
        spec["egress"][0]["to"][0]["ipBlock"]["cidr"],
        "192.0.2.0/24"
    );
}

#[test]
fn network_policy_needs_grpc_peers_and_leaves_egress_alone_by_default() {
    let Some(tools) = skip::needs(skip::DEPLOY_TOOLS, tools()) else {
        return;
    };
    let error = tools.render_error(&["--set", "networkPolicy.enabled=true"]);
    assert!(error.contains("networkPolicy.grpcFrom"), "{error}");

    let (_dir, values) = temp_file(
        "np.values.yaml",
        "networkPolicy:\n  enabled: true\n  grpcFrom:\n    - podSelector:\n        matchLabels:\n          app: bigfleet\n",
    );
    let m = tools.render(&["-f", &values]);
    let spec = &m.get("NetworkPolicy", RELEASE)["spec"];
    assert_eq!(
        spec["policyTypes"],
        serde_json::json!(["Ingress"]),
        "egress left open"
    );
    assert!(spec.get("egress").is_none());
    let ingress = spec["ingress"].as_array().unwrap();
    assert_eq!(
        ingress.len(),
        1,
        "no metricsFrom: the metrics port stays closed"
    );
    assert_eq!(ingress[0]["ports"][0]["port"], "grpc");

    // The schema refuses misspelt keys and peers with other fields.
    let error = tools.render_error(&["--set", "metrics.serviceMonitor.intervall=1m"]);
    assert!(error.contains("intervall"), "{error}");
    let error = tools.render_error(&["--set", "metrics.serviceMonitor.interval=often"]);
    assert!(error.contains("interval"), "{error}");
    let (_dir, values) = temp_file(
        "bad-peer.values.yaml",
        "networkPolicy:\n  enabled: true\n  grpcFrom:\n    - ipBlock:\n        cidr: 0.0.0.0/0\n",
    );
    let error = tools.render_error(&["-f", &values]);
    assert!(error.contains("ipBlock"), "{error}");
}

#[test]
fn the_dashboard_parses_and_covers_what_operators_look_at() {
    let dashboard: Value = serde_json::from_str(&read(DASHBOARD)).expect("dashboard JSON");
    assert_eq!(dashboard["uid"], "bigfleet-libvirt");
    let panels = dashboard["panels"].as_array().unwrap();
    let titles: Vec<&str> = panels
        .iter()
        .map(|p| p["title"].as_str().unwrap())
        .collect();
    for wanted in [
        "RPC rate",
        "RPC errors by code",
        "Ack latency",
        "Machines by state",
        "Transitions by outcome",
        "phase duration",
        "Host health",
        "drift",
        "Host queue depth",
        "Host queue wait",
        "in flight and budget",
        "Dedicated CPUs",
        "Huge pages",
        "Passthrough devices",
    ] {
        assert!(
            titles.iter().any(|t| t.contains(wanted)),
            "no panel for {wanted:?} in {titles:?}"
        );
    }
    for panel in panels {
        let targets = panel["targets"].as_array().unwrap();
        assert!(!targets.is_empty(), "{} has no query", panel["title"]);
        for target in targets {
            assert!(target["expr"].as_str().is_some_and(|e| !e.is_empty()));
            assert_eq!(target["datasource"]["uid"], "${datasource}");
        }
    }
}

/// The indented code blocks of one `## ` section of `deploy/README.md`, dedented.
fn readme_blocks(heading: &str) -> Vec<String> {
    let readme = read("deploy/README.md");
    let section = readme
        .split("\n## ")
        .find(|s| s.starts_with(heading))
        .unwrap_or_else(|| panic!("deploy/README.md has no section {heading:?}"));
    let mut blocks = Vec::new();
    let mut block = String::new();
    for line in section.lines() {
        if let Some(code) = line.strip_prefix("    ") {
            block.push_str(code);
            block.push('\n');
        } else if !line.is_empty() && !block.is_empty() {
            blocks.push(std::mem::take(&mut block));
        }
    }
    if !block.is_empty() {
        blocks.push(block);
    }
    blocks
}

#[test]
fn the_readme_examples_render_the_pack() {
    let Some(tools) = skip::needs(skip::DEPLOY_TOOLS, tools()) else {
        return;
    };
    let blocks = readme_blocks("8. Monitoring");
    let pick = |start: &str| {
        blocks
            .iter()
            .find(|b| b.starts_with(start))
            .unwrap_or_else(|| panic!("no example starting {start:?} in {blocks:?}"))
            .clone()
    };
    let (_a, values) = temp_file("readme.values.yaml", &pick("metrics:"));
    let (_b, egress) = temp_file("readme.egress.yaml", &pick("networkPolicy:\n  egress:"));
    let m = tools.render(&["-f", &values, "-f", &egress]);
    for kind in ["ServiceMonitor", "PrometheusRule", "NetworkPolicy"] {
        assert!(
            m.kinds().contains(kind),
            "the README example renders no {kind}"
        );
    }
    validate_custom_resources(tools, &m);
    let np = &m.get("NetworkPolicy", RELEASE)["spec"];
    assert_eq!(np["policyTypes"], serde_json::json!(["Ingress", "Egress"]));
    assert_eq!(np["egress"].as_array().map(Vec::len), Some(2));
    // The plain-Prometheus scrape config of the README names the job the rules expect.
    let scrape = pick("rule_files:");
    assert!(scrape.contains("job_name: bigfleet-libvirt"), "{scrape}");
}
