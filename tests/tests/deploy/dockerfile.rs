//! `deploy/Dockerfile`: hadolint passes, and the image has the shape the install guide
//! relies on (distroless, non-root, built from the repository root).

use super::*;

#[test]
fn hadolint_passes_on_the_dockerfile() {
    let Some(tools) = skip::needs(skip::DEPLOY_TOOLS, tools()) else {
        return;
    };
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
            &"FROM ${RUST_IMAGE} AS build",
            &"FROM scratch AS debug",
            &"FROM scratch AS sbom",
            &"FROM ${RUNTIME_IMAGE}"
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
    // ... with the package records and the SBOM (tests/tests/image.rs runs the same scripts).
    assert!(
        dockerfile.contains(
            "deploy/sbom.sh /staging /staging/usr/share/doc/bigfleet-libvirt/sbom.cdx.json"
        ),
        "the build writes the SBOM into the runtime tree with deploy/sbom.sh"
    );
    assert!(
        dockerfile.contains("scripts/install-cargo-tools.sh cargo-cyclonedx"),
        "cargo-cyclonedx comes from the pinned installer"
    );
    assert!(runtime_copies_only_the_staging(&code));
    // The runtime stage has no RUN (there is no shell) and ends as the non-root user.
    let runtime = &code[code
        .iter()
        .position(|l| l.starts_with("FROM ${RUNTIME_IMAGE}"))
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

/// The base images are build arguments declared before the first FROM (the only place a FROM
/// can read them), defaulting to the Debian 12 tags, so `--build-arg NAME=image:tag@sha256:...`
/// pins each by digest; every FROM other than scratch reads one.
#[test]
fn base_images_are_arguments_that_take_a_digest() {
    let dockerfile = std::fs::read_to_string(repo_root().join("deploy/Dockerfile")).unwrap();
    let code: Vec<&str> = dockerfile
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .collect();
    let first_from = code.iter().position(|l| l.starts_with("FROM ")).unwrap();
    let args: Vec<(&str, &str)> = code[..first_from]
        .iter()
        .filter_map(|l| l.strip_prefix("ARG "))
        .filter_map(|a| a.split_once('='))
        .collect();
    assert_eq!(
        args,
        [
            ("RUST_IMAGE", "rust:1-bookworm"),
            ("RUNTIME_IMAGE", "gcr.io/distroless/cc-debian12:nonroot")
        ]
    );
    for from in code.iter().filter(|l| l.starts_with("FROM ")) {
        let image = from.split_whitespace().nth(1).unwrap();
        assert!(
            image == "scratch" || args.iter().any(|(name, _)| image == format!("${{{name}}}")),
            "{from}: a base image must be one of the ARGs, or a digest cannot be passed"
        );
    }
    // Both defaults are the same Debian release: the runtime receives the build's libraries.
    assert!(args[0].1.ends_with("bookworm") && args[1].1.contains("debian12"));
    // The procedure is documented.
    let readme = std::fs::read_to_string(repo_root().join("deploy/README.md")).unwrap();
    for needle in [
        "--build-arg RUST_IMAGE=",
        "--build-arg RUNTIME_IMAGE=",
        "image.digest=",
    ] {
        assert!(readme.contains(needle), "deploy/README.md shows {needle}");
    }
}

/// The runtime stage takes exactly the staged tree from the build stage.
fn runtime_copies_only_the_staging(code: &[&str]) -> bool {
    let runtime = code
        .iter()
        .skip_while(|l| !l.starts_with("FROM ${RUNTIME_IMAGE}"));
    let copies: Vec<&&str> = runtime.filter(|l| l.starts_with("COPY")).collect();
    copies == [&"COPY --from=build /staging/ /"]
}
