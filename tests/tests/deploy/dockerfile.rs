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
