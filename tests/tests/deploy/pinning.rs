//! What the chart does for supply-chain and exposure hygiene (issue 29): the image pinned by
//! digest with the version label kept a valid label, the pull policy left to Kubernetes,
//! NodePort/LoadBalancer refused with plaintext gRPC unless overridden, a size limit on the
//! state emptyDir, and the doctor Job given only the TLS keys it needs.

use serde_json::Value;

use super::*;

/// A well-formed digest (sha256 of nothing in particular).
const DIGEST: &str = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
const REPOSITORY: &str = "ghcr.io/your-org/bigfleet-libvirt";

/// Every `app.kubernetes.io/version` label of every rendered object and pod template.
fn version_labels(m: &Manifests) -> Vec<String> {
    fn walk(v: &Value, out: &mut Vec<String>) {
        match v {
            Value::Object(map) => {
                if let Some(Value::String(s)) = map
                    .get("labels")
                    .and_then(|l| l.get("app.kubernetes.io/version"))
                {
                    out.push(s.clone());
                }
                map.values().for_each(|v| walk(v, out));
            }
            Value::Array(items) => items.iter().for_each(|v| walk(v, out)),
            _ => {}
        }
    }
    let mut out = Vec::new();
    m.docs.iter().for_each(|d| walk(d, &mut out));
    out
}

/// Every container of every rendered pod template (the Deployment's and the doctor Job's).
fn containers(m: &Manifests) -> Vec<&Value> {
    m.docs
        .iter()
        .filter_map(|d| d["spec"]["template"]["spec"]["containers"].as_array())
        .flatten()
        .collect()
}

/// Kubernetes' label-value syntax: at most 63 characters, alphanumerics, '-', '_' and '.',
/// starting and ending with an alphanumeric (or empty).
fn is_label_value(s: &str) -> bool {
    let ok_char = |c: char| c.is_ascii_alphanumeric() || "-_.".contains(c);
    s.is_empty()
        || (s.len() <= 63
            && s.chars().all(ok_char)
            && s.starts_with(|c: char| c.is_ascii_alphanumeric())
            && s.ends_with(|c: char| c.is_ascii_alphanumeric()))
}

#[test]
fn image_digest_pins_every_container_and_labels_keep_the_tag() {
    let Some(tools) = skip::needs(skip::DEPLOY_TOOLS, tools()) else {
        return;
    };
    let digest = format!("image.digest={DIGEST}");
    // The doctor hook too: both pod templates must run the pinned image.
    for (extra, version) in [("", "0.1.0"), (",image.tag=1.2.3", "1.2.3")] {
        let set = format!("{digest},doctor.hook.enabled=true{extra}");
        let m = tools.render(&["--set", &set]);
        let images: Vec<&Value> = containers(&m).iter().map(|c| &c["image"]).collect();
        assert_eq!(images.len(), 2, "the Deployment and the doctor Job");
        for image in images {
            assert_eq!(image, &format!("{REPOSITORY}@{DIGEST}"), "{set}");
        }
        let labels = version_labels(&m);
        assert!(!labels.is_empty());
        assert!(labels.iter().all(|l| l == version), "{set}: {labels:?}");
        let (ok, stdout, stderr) =
            tools.run("helm", &["lint", "--strict", "deploy/helm", "--set", &set]);
        assert!(
            ok && stdout.contains("0 chart(s) failed"),
            "{set}:\n{stdout}{stderr}"
        );
    }
    // Without a digest the tag names the image, as before.
    let by_tag = tools.render(&["--set", "image.tag=1.2.3"]);
    assert_eq!(by_tag.container()["image"], format!("{REPOSITORY}:1.2.3"));
}

#[test]
fn a_digest_in_the_tag_or_a_malformed_digest_is_refused() {
    let Some(tools) = skip::needs(skip::DEPLOY_TOOLS, tools()) else {
        return;
    };
    for (set, expected) in [
        (format!("image.tag={DIGEST}"), "set image.digest"),
        (format!("image.tag=1.2.3@{DIGEST}"), "set image.digest"),
        ("image.tag=-rc1".to_owned(), "is not an image tag"),
        ("image.digest=sha256:abc".to_owned(), "/image/digest"),
        ("image.digest=0123abcd".to_owned(), "/image/digest"),
    ] {
        let error = tools.render_error(&["--set", &set]);
        assert!(error.contains(expected), "{set}: {error}");
    }
}

/// A long or oddly ended tag still gives a valid label (labels are checked by
/// kubernetes-validate too, through `render`).
#[test]
fn the_version_label_is_valid_label_syntax_for_any_tag() {
    let Some(tools) = skip::needs(skip::DEPLOY_TOOLS, tools()) else {
        return;
    };
    let long = format!("v1.2.3-{}_", "a".repeat(100));
    for tag in ["1.2.3", "latest", "_build.7", long.as_str()] {
        let m = tools.render(&["--set", &format!("image.tag={tag}")]);
        assert_eq!(m.container()["image"], format!("{REPOSITORY}:{tag}"));
        for label in version_labels(&m) {
            assert!(is_label_value(&label), "tag {tag:?} gave label {label:?}");
        }
    }
}

#[test]
fn pull_policy_is_left_to_kubernetes_unless_set() {
    let Some(tools) = skip::needs(skip::DEPLOY_TOOLS, tools()) else {
        return;
    };
    // The install guide's `tag: latest`: Kubernetes' default for :latest is Always, which
    // an explicit IfNotPresent would override and keep a stale image on the node.
    let (_dir, values) = temp_file("dc1.values.yaml", GUIDE_VALUES);
    let guide = tools.render(&["-f", &values, "--set", "doctor.hook.enabled=true"]);
    let all = containers(&guide);
    assert_eq!(all.len(), 2);
    for c in all {
        assert!(c.get("imagePullPolicy").is_none(), "{c}");
    }
    for policy in ["Always", "IfNotPresent", "Never"] {
        let set = format!("image.pullPolicy={policy},doctor.hook.enabled=true");
        let m = tools.render(&["--set", &set]);
        for c in containers(&m) {
            assert_eq!(c["imagePullPolicy"], policy, "{set}");
        }
    }
}

#[test]
fn node_port_and_load_balancer_need_tls_or_an_explicit_override() {
    let Some(tools) = skip::needs(skip::DEPLOY_TOOLS, tools()) else {
        return;
    };
    for kind in ["NodePort", "LoadBalancer"] {
        let error = tools.render_error(&["--set", &format!("service.type={kind}")]);
        assert!(
            error.contains("/tls/enabled") && error.contains("/service/allowPlaintext"),
            "{kind}: the error must name both ways out: {error}"
        );
        for set in [
            format!("service.type={kind},tls.enabled=true,tls.secretName=grpc-tls"),
            format!("service.type={kind},service.allowPlaintext=true"),
        ] {
            let m = tools.render(&["--set", &set]);
            assert_eq!(m.get("Service", RELEASE)["spec"]["type"], kind, "{set}");
        }
    }
    // ClusterIP stays open to plaintext (the default).
    let m = tools.render(&[]);
    assert_eq!(m.get("Service", RELEASE)["spec"]["type"], "ClusterIP");
}

#[test]
fn the_state_empty_dir_has_a_size_limit() {
    let Some(tools) = skip::needs(skip::DEPLOY_TOOLS, tools()) else {
        return;
    };
    for (set, limit) in [
        ("state.enabled=true", "1Gi"),
        ("state.enabled=true,state.persistence.size=3Gi", "3Gi"),
    ] {
        let m = tools.render(&["--set", set]);
        assert_eq!(
            m.volume("state").unwrap()["emptyDir"]["sizeLimit"],
            limit,
            "{set}"
        );
    }
}

#[test]
fn the_doctor_job_mounts_only_the_tls_keys_it_needs() {
    let Some(tools) = skip::needs(skip::DEPLOY_TOOLS, tools()) else {
        return;
    };
    for (set, keys) in [
        (
            "tls.enabled=true,tls.secretName=grpc-tls",
            vec!["tls.crt", "tls.key"],
        ),
        (
            "tls.enabled=true,tls.mtls=true,tls.secretName=grpc-tls",
            vec!["tls.crt", "tls.key", "ca.crt"],
        ),
    ] {
        let m = tools.render(&["--set", &format!("{set},doctor.hook.enabled=true")]);
        let job = m.get("Job", &format!("{RELEASE}-doctor"));
        let volumes = job["spec"]["template"]["spec"]["volumes"]
            .as_array()
            .unwrap();
        let tls = volumes
            .iter()
            .find(|v| v["name"] == "tls")
            .expect("tls volume");
        let items: Vec<&str> = tls["secret"]["items"]
            .as_array()
            .unwrap_or_else(|| panic!("{set}: the doctor mounts the whole Secret: {tls}"))
            .iter()
            .map(|i| i["key"].as_str().unwrap())
            .collect();
        assert_eq!(items, keys, "{set}");
        assert_eq!(tls["secret"]["defaultMode"], 0o440);
    }
}
