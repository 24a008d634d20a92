//! The `deploy/helm` chart: `helm lint --strict`, and what it renders for the install
//! guide's value sets (defaults, minimal, offerings via `--set-file`, TLS + mTLS, libvirt
//! credentials, state with and without a PVC, OTLP, extraArgs, other values, half
//! configurations refused).

use serde_json::Value;

use super::*;

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
fn helm_lint_strict_passes() {
    let Some(tools) = skip::needs(skip::DEPLOY_TOOLS, tools()) else {
        return;
    };
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
    let Some(tools) = skip::needs(skip::DEPLOY_TOOLS, tools()) else {
        return;
    };
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

/// Durable state on the release's PVC: mounted at the state directory, 1Gi, ReadWriteOnce,
/// the cluster's default storage class.
fn assert_state_on_a_1gi_pvc(m: &Manifests) {
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
}

/// The install guide's minimal dc1.values.yaml, as `helm install bigfleet-libvirt-dc1
/// deploy/helm -n bigfleet -f dc1.values.yaml` renders it.
#[test]
fn install_guide_minimal_values() {
    let Some(tools) = skip::needs(skip::DEPLOY_TOOLS, tools()) else {
        return;
    };
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
    assert_state_on_a_1gi_pvc(&m);
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
    let Some(tools) = skip::needs(skip::DEPLOY_TOOLS, tools()) else {
        return;
    };
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

/// `--set-file addressPools.content=…`: a ConfigMap, mounted, passed as --address-pools
/// (to the provider and to doctor's job), with a checksum; the example pools fit the example
/// offerings, as the real binary checks them.
#[test]
fn address_pools_via_set_file() {
    let Some(tools) = skip::needs(skip::DEPLOY_TOOLS, tools()) else {
        return;
    };
    let pools_file = "deploy/examples/address-pools.dc1.json";
    let m = tools.render(&[
        "-f",
        "deploy/examples/dc1.values.yaml",
        "--set-file",
        "offerings.content=deploy/examples/offerings.dc1.json",
        "--set-file",
        &format!("addressPools.content={pools_file}"),
    ]);
    let pools_cm = m.get("ConfigMap", &format!("{RELEASE}-address-pools"));
    let pools = pools_cm["data"]["address-pools.json"].as_str().unwrap();
    let wanted = std::fs::read_to_string(repo_root().join(pools_file)).unwrap();
    assert_eq!(pools.trim(), wanted.trim());
    let in_pod = "/etc/bigfleet/address-pools/address-pools.json";
    assert_eq!(m.arg("--address-pools").as_deref(), Some(in_pod));
    assert_eq!(
        m.volume("address-pools").unwrap()["configMap"]["name"],
        format!("{RELEASE}-address-pools").as_str()
    );
    assert_eq!(m.mount("address-pools").unwrap()["readOnly"], true);
    let annotations = &m.deployment()["spec"]["template"]["metadata"]["annotations"];
    assert!(annotations["checksum/address-pools"].is_string());
    let offerings_cm = m.get("ConfigMap", &format!("{RELEASE}-offerings"));
    let (_dir1, pools_local) = temp_file("address-pools.json", pools);
    let (_dir2, offerings_local) = temp_file(
        "offerings.json",
        offerings_cm["data"]["offerings.json"].as_str().unwrap(),
    );
    let mut args = m.args();
    args.push("--use-fake-backend".to_owned());
    let files = [
        (in_pod, pools_local.as_str()),
        ("/etc/bigfleet/offerings/offerings.json", &offerings_local),
    ];
    let (ok, stderr) = binary_with_chart_args(&args, &files);
    assert!(ok, "{stderr}");
    assert_eq!(tools.render(&[]).arg("--address-pools"), None);
}

/// `--set-file ignition.template=…` with a delivery: a ConfigMap, mounted, passed as
/// --ignition-template and --ignition-delivery (to the provider and to doctor's job), with a
/// checksum; the real binary accepts the example template for a type that boots by Ignition.
#[test]
fn an_ignition_template_via_set_file() {
    let Some(tools) = skip::needs(skip::DEPLOY_TOOLS, tools()) else {
        return;
    };
    let template_file = "deploy/examples/node.ign";
    let (_types_dir, types) = temp_file(
        "types.json",
        r#"{"flatcar.small": {"vcpu": 2, "memory_mib": 4096, "boot": "ignition"}}"#,
    );
    let (_offerings_dir, offerings) = temp_file(
        "offerings.json",
        r#"[{"instance_type": "flatcar.small", "zone": "rack1", "count": 2}]"#,
    );
    let m = tools.render(&[
        "--set-file",
        &format!("ignition.template={template_file}"),
        "--set",
        "ignition.delivery=config-drive",
        "--set-file",
        &format!("instanceTypes.content={types}"),
        "--set-file",
        &format!("offerings.content={offerings}"),
    ]);
    let template_cm = m.get("ConfigMap", &format!("{RELEASE}-ignition"));
    let template = template_cm["data"]["template.ign"].as_str().unwrap();
    let wanted = std::fs::read_to_string(repo_root().join(template_file)).unwrap();
    assert_eq!(template.trim(), wanted.trim());
    let in_pod = "/etc/bigfleet/ignition/template.ign";
    assert_eq!(m.arg("--ignition-template").as_deref(), Some(in_pod));
    assert_eq!(
        m.arg("--ignition-delivery").as_deref(),
        Some("config-drive")
    );
    assert_eq!(m.mount("ignition").unwrap()["readOnly"], true);
    let annotations = &m.deployment()["spec"]["template"]["metadata"]["annotations"];
    assert!(annotations["checksum/ignition"].is_string());
    let (_dir, template_local) = temp_file("template.ign", template);
    let mut args = m.args();
    args.push("--use-fake-backend".to_owned());
    let files = [
        (in_pod, template_local.as_str()),
        ("/etc/bigfleet/offerings/offerings.json", &offerings),
        ("/etc/bigfleet/instance-types/instance-types.json", &types),
    ];
    let (ok, stderr) = binary_with_chart_args(&args, &files);
    assert!(ok, "{stderr}");
    let plain = tools.render(&[]);
    assert_eq!(plain.arg("--ignition-template"), None);
    assert_eq!(plain.arg("--ignition-delivery"), None);
}

#[test]
fn tls_and_mtls_mount_the_secret_and_wire_the_flags() {
    let Some(tools) = skip::needs(skip::DEPLOY_TOOLS, tools()) else {
        return;
    };
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
    let Some(tools) = skip::needs(skip::DEPLOY_TOOLS, tools()) else {
        return;
    };
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
    let Some(tools) = skip::needs(skip::DEPLOY_TOOLS, tools()) else {
        return;
    };
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
    let Some(tools) = skip::needs(skip::DEPLOY_TOOLS, tools()) else {
        return;
    };
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
    let Some(tools) = skip::needs(skip::DEPLOY_TOOLS, tools()) else {
        return;
    };
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
    let Some(tools) = skip::needs(skip::DEPLOY_TOOLS, tools()) else {
        return;
    };
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
    let Some(tools) = skip::needs(skip::DEPLOY_TOOLS, tools()) else {
        return;
    };
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

/// The libvirt backend's NIC, CPU and budget values reach the container's args, from `--set`
/// and from a values file alike, and the real binary accepts them; unset, they pass no flag,
/// so the binary's own defaults apply.
#[test]
fn nic_cpu_and_budget_values_reach_the_flags() {
    let Some(tools) = skip::needs(skip::DEPLOY_TOOLS, tools()) else {
        return;
    };
    let defaults = tools.render(&[]);
    for flag in ["--nic", "--cpu", "--host-budget", "--agent-budget"] {
        assert_eq!(defaults.arg(flag), None, "{flag} without its value");
    }
    let nics = |m: &Manifests| -> Vec<String> {
        m.args()
            .into_iter()
            .filter(|a| a.starts_with("--nic="))
            .collect()
    };
    let set = tools.render(&[
        "--set",
        "libvirt.nics={bridge=br0,direct=eth1:vepa}",
        "--set",
        "libvirt.cpu=Skylake-Server\\,+pcid\\,-hle",
        "--set",
        "libvirt.hostBudget=3,libvirt.agentBudget=2,libvirt.hostConnections=3",
        "--set",
        "libvirt.hostMaxClientRequests=4",
        // --set reads 2.5 as a string; --set-json as the number it is.
        "--set-json",
        "libvirt.diskAllocationRatio=2.5",
        "--set",
        "libvirt.seedPool=seeds",
    ]);
    assert_eq!(nics(&set), ["--nic=bridge=br0", "--nic=direct=eth1:vepa"]);
    assert_eq!(
        set.arg("--cpu").as_deref(),
        Some("Skylake-Server,+pcid,-hle")
    );
    assert_eq!(set.arg("--host-budget").as_deref(), Some("3"));
    assert_eq!(set.arg("--agent-budget").as_deref(), Some("2"));
    assert_eq!(set.arg("--host-connections").as_deref(), Some("3"));
    assert_eq!(set.arg("--host-max-client-requests").as_deref(), Some("4"));
    assert_eq!(set.arg("--disk-allocation-ratio").as_deref(), Some("2.5"));
    assert_eq!(set.arg("--seed-pool").as_deref(), Some("seeds"));
    let (ok, stderr) = binary_with_chart_args(&set.args(), &[]);
    assert!(ok, "{stderr}");

    let (_dir, values) = temp_file(
        "libvirt.values.yaml",
        "libvirt:\n  nics: [network=default]\n  cpu: host-model\n  hostBudget: 6\n  agentBudget: 6\n",
    );
    let file = tools.render(&["-f", &values]);
    assert_eq!(nics(&file), ["--nic=network=default"]);
    assert_eq!(file.arg("--cpu").as_deref(), Some("host-model"));
    assert_eq!(file.arg("--host-budget").as_deref(), Some("6"));
    assert_eq!(file.arg("--agent-budget").as_deref(), Some("6"));
    assert_eq!(
        file.arg("--host-connections"),
        None,
        "unset: the binary sizes it"
    );
    assert_eq!(file.arg("--host-max-client-requests"), None);
    assert_eq!(file.arg("--disk-allocation-ratio"), None);
    assert_eq!(
        file.arg("--seed-pool"),
        None,
        "unset: the seeds share --storage-pool"
    );
    let (ok, stderr) = binary_with_chart_args(&file.args(), &[]);
    assert!(ok, "{stderr}");
}

/// The schema refuses NIC, CPU and budget values the binary would refuse, and the chart the
/// combinations it would, each naming the value.
#[test]
fn bad_nic_cpu_and_budget_values_are_refused_at_render_time() {
    let Some(tools) = skip::needs(skip::DEPLOY_TOOLS, tools()) else {
        return;
    };
    for (set, expected) in [
        ("libvirt.nics={br0}", "/libvirt/nics/0"),
        ("libvirt.nics={direct=eth0:bogus}", "/libvirt/nics/0"),
        ("libvirt.nics={network=}", "/libvirt/nics/0"),
        ("libvirt.cpu=host model", "/libvirt/cpu"),
        ("libvirt.cpu=kvm64\\,pcid", "/libvirt/cpu"),
        ("libvirt.hostBudget=0", "/libvirt/hostBudget"),
        ("libvirt.agentBudget=0", "/libvirt/agentBudget"),
        ("libvirt.hostBudget=many", "/libvirt/hostBudget"),
        ("libvirt.hostConnections=0", "/libvirt/hostConnections"),
        (
            "libvirt.hostBudget=2,libvirt.hostConnections=3",
            "libvirt.hostConnections (3)",
        ),
        ("libvirt.hostConnections=8", "libvirt.hostConnections (8)"),
        (
            "libvirt.hostMaxClientRequests=2",
            "/libvirt/hostMaxClientRequests",
        ),
        (
            "libvirt.diskAllocationRatio=0",
            "/libvirt/diskAllocationRatio",
        ),
        (
            "libvirt.diskAllocationRatio=-1",
            "/libvirt/diskAllocationRatio",
        ),
        (
            "libvirt.hostBudget=2,libvirt.agentBudget=3",
            "libvirt.agentBudget (3)",
        ),
        (
            "libvirt.nics={bridge=br0},libvirt.network=br-net",
            "network=br-net",
        ),
    ] {
        let error = tools.render_error(&["--set", set]);
        assert!(error.contains(expected), "{set}: {error}");
    }
}
