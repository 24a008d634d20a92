//! The container image's contents, tested without Docker (CI has no daemon and no base
//! image). `deploy/stage-runtime.sh` — the script `deploy/Dockerfile` runs — assembles the
//! runtime tree from the binary under test; the binary then runs inside that tree alone,
//! through `chroot --userspec=65532:65532` (the image's uid), so a library the script fails
//! to stage, or a file the binary expects outside the tree, breaks the test as it would
//! break the image. Needs root for `chroot` (CI runs as root); elsewhere those tests fail,
//! unless `BIGFLEET_SKIP_ROOT_TESTS=1` (`harness/skip.rs`).
//!
//! The chroot holds the staged tree and nothing else (the test driver's node file, where a
//! test needs it): no shell, no `/etc`, no `/proc`, no `/tmp`. The distroless base layer
//! adds a few files on top of that (`/etc/passwd`, CA certificates, `/tmp`), so a binary
//! that runs here runs in the image.
//!
//! What image scanners see (issue 29), checked without root: every staged library is claimed
//! by a Debian package record in the tree (`/var/lib/dpkg/status.d`, as distroless does it),
//! and the SBOM `deploy/sbom.sh` writes names every crate the binary links, at its
//! `Cargo.lock` version, and every staged Debian package.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use bigfleet_libvirt_libvirt::fixture::Fixture;
use bigfleet_libvirt_proto::v1alpha1 as pb;

use crate::harness::*;

/// The image's user (`USER 65532:65532` in the Dockerfile).
const NONROOT: &str = "65532:65532";

/// A staged runtime tree in a temporary directory (also used by `qemu_remote::image`).
pub(crate) struct Tree {
    _dir: tempfile::TempDir,
    pub(crate) root: PathBuf,
    /// The host's `chroot`, resolved before the child's environment is cleared (None: the
    /// tree is only inspected, nothing runs in it).
    chroot: Option<PathBuf>,
    /// The script's file listing and total.
    listing: String,
}

impl Tree {
    /// Stages the binary under test for running it in a chroot, or says why this machine
    /// cannot run the test.
    pub(crate) fn stage() -> Result<Tree, String> {
        if !nix_is_root() {
            return Err("chroot needs root (CI runs as root)".to_owned());
        }
        let chroot = which::which("chroot")
            .map_err(|e| format!("chroot (coreutils) is not installed: {e}"))?;
        Ok(Tree::stage_files(Some(chroot)))
    }

    /// Stages the binary under test (no root needed: nothing runs inside the tree).
    fn stage_files(chroot: Option<PathBuf>) -> Tree {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("tree");
        let script = repo_root().join("deploy/stage-runtime.sh");
        let out = Command::new(&script)
            .arg(binary())
            .arg(&root)
            .arg(dir.path().join("debug"))
            .output()
            .expect("run deploy/stage-runtime.sh");
        let listing = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "deploy/stage-runtime.sh failed:\n{listing}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        Tree {
            _dir: dir,
            root,
            chroot,
            listing,
        }
    }

    /// `chroot --userspec=65532:65532 <tree> /usr/local/bin/bigfleet-libvirt`, with an
    /// environment as bare as the image's.
    pub(crate) fn command(&self) -> Command {
        let chroot = self
            .chroot
            .as_ref()
            .expect("a tree staged with Tree::stage");
        let mut command = Command::new(chroot);
        command
            .arg(format!("--userspec={NONROOT}"))
            .arg(&self.root)
            .arg("/usr/local/bin/bigfleet-libvirt")
            .env_clear()
            .env("PATH", "/usr/local/bin");
        command
    }

    /// Copies a file into the tree (readable by everyone) and returns its path inside it.
    fn add(&self, from: &Path, inside: &str) -> String {
        let target = self.root.join(inside.trim_start_matches('/'));
        std::fs::create_dir_all(target.parent().unwrap()).unwrap();
        std::fs::copy(from, &target).unwrap();
        inside.to_owned()
    }
}

fn nix_is_root() -> bool {
    // `id -u` avoids unsafe libc calls (the workspace forbids unsafe code).
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

fn repo_root() -> PathBuf {
    crate::harness::repo_root()
}

/// `/healthz` answers ok and `/readyz` ready, as the seed's smoke test expects.
async fn smoke(server: &Server) {
    let metrics = server.metrics_addr.expect("metrics address");
    let (status, _, body) = http_get(metrics, "/healthz").await.unwrap();
    assert_eq!((status, body.trim()), (200, "ok"));
    let mut last = (0, String::new());
    for _ in 0..100 {
        let (status, _, body) = http_get(metrics, "/readyz").await.unwrap();
        if status == 200 {
            assert_eq!(body.trim(), "ready");
            return;
        }
        last = (status, body);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("/readyz never became ready inside the tree: {last:?}");
}

#[tokio::test]
async fn the_staged_tree_runs_the_fake_backend_as_nonroot() {
    let Some(tree) = skip::needs(skip::ROOT, Tree::stage()) else {
        return;
    };
    let total = tree.listing.lines().last().unwrap_or_default().to_owned();
    println!("runtime tree of the binary under test: {total} bytes");
    let server = Server::start_command(tree.command(), &["--seed-count=4"]);
    smoke(&server).await;
    let mut c = server.client().await;
    let listed = list_all(&mut c).await;
    assert_eq!(listed.machines.len(), 4, "the fake's four slots");
    assert!(
        server.log_text().contains("IN-MEMORY fake"),
        "{}",
        server.log_text()
    );
}

#[tokio::test]
async fn the_staged_tree_reaches_ready_on_the_libvirt_test_driver() {
    let Some(tree) = skip::needs(skip::ROOT, Tree::stage()) else {
        return;
    };
    let outside = tempfile::tempdir().unwrap();
    let fixture = Fixture {
        cpus: 32,
        memory_mib: 256 * 1024,
        ..Fixture::default()
    };
    fixture.write(outside.path(), "node.xml").unwrap();
    let node = tree.add(&outside.path().join("node.xml"), "/fixture/node.xml");
    let connect = format!("--connect=test://{node}");
    let server = Server::start_command(
        tree.command(),
        &[&connect, "--image=base.qcow2", "--seed-count=2"],
    );
    smoke(&server).await;
    let mut c = server.client().await;
    let listed = list_all(&mut c).await;
    assert!(
        !listed.machines.is_empty(),
        "the test-driver host offers slots"
    );
    let speculative = listed
        .machines
        .iter()
        .filter(|m| m.state == pb::MachineState::Speculative as i32)
        .count();
    assert_eq!(speculative, listed.machines.len());
}

#[test]
fn the_image_refuses_qemu_ssh_because_it_has_no_ssh_client() {
    let Some(tree) = skip::needs(skip::ROOT, Tree::stage()) else {
        return;
    };
    let child = tree
        .command()
        .args([
            "--connect=rack1=qemu+ssh://bigfleet@host-a/system",
            "--image=base.qcow2",
            "--addr=127.0.0.1:0",
            "--metrics-addr=127.0.0.1:0",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run the binary in the tree");
    // Refused at start-up means it exits on its own; still running means it started
    // serving a host it can never reach.
    let (status, stderr) = exit_within(child, Duration::from_secs(10));
    let status = status.unwrap_or_else(|| panic!("still running after 10 s without ssh: {stderr}"));
    assert!(
        !status.success(),
        "exited 0 without an ssh client: {stderr}"
    );
    for needle in [
        "--connect rack1=",
        "\"ssh\"",
        "not installed",
        "qemu+libssh://",
    ] {
        assert!(stderr.contains(needle), "missing {needle:?} in: {stderr}");
    }
}

/// The tree's regular files, relative to its root.
fn files_under(root: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut dirs = vec![root.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let entry = entry.unwrap();
            let kind = entry.file_type().unwrap();
            if kind.is_dir() {
                dirs.push(entry.path());
            } else if kind.is_file() {
                out.push(entry.path().strip_prefix(root).unwrap().to_path_buf());
            }
        }
    }
    out.sort();
    out
}

/// The files the image ships from Debian packages: all but the binary, the package records
/// and the SBOM (which the build writes itself).
fn staged_libraries(root: &Path) -> Vec<PathBuf> {
    files_under(root)
        .into_iter()
        .filter(|f| {
            f != Path::new("usr/local/bin/bigfleet-libvirt")
                && !f.starts_with("var/lib/dpkg")
                && !f.starts_with("usr/share/doc/bigfleet-libvirt")
        })
        .collect()
}

/// `field: value` of a dpkg stanza.
fn stanza_field<'a>(stanza: &'a str, field: &str) -> Option<&'a str> {
    let prefix = format!("{field}: ");
    stanza.lines().find_map(|l| l.strip_prefix(prefix.as_str()))
}

/// A package's installed version on this machine, as dpkg reports it.
fn installed_version(package: &str) -> String {
    let out = Command::new("dpkg-query")
        .args(["-W", "-f=${Version}", package])
        .output()
        .expect("run dpkg-query");
    assert!(out.status.success(), "dpkg-query -W {package}: {out:?}");
    String::from_utf8(out.stdout).unwrap()
}

/// MD5 of each file (`md5sum`, coreutils), in order.
fn md5s(root: &Path, files: &[PathBuf]) -> Vec<String> {
    let out = Command::new("md5sum")
        .current_dir(root)
        .args(files)
        .output()
        .expect("run md5sum");
    assert!(out.status.success(), "md5sum: {out:?}");
    let text = String::from_utf8(out.stdout).unwrap();
    let sums: Vec<String> = text
        .lines()
        .map(|l| l.split_whitespace().next().unwrap().to_owned())
        .collect();
    assert_eq!(sums.len(), files.len());
    sums
}

/// The package records of a staged tree: package name -> (stanza, checksum -> file).
fn package_records(
    root: &Path,
) -> std::collections::BTreeMap<String, (String, Vec<(String, String)>)> {
    let records = root.join("var/lib/dpkg/status.d");
    let mut out = std::collections::BTreeMap::new();
    let Ok(entries) = std::fs::read_dir(&records) else {
        return out;
    };
    for entry in entries {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_str().unwrap().to_owned();
        if name.ends_with(".md5sums") {
            continue;
        }
        let stanza = std::fs::read_to_string(&path).unwrap();
        let sums = std::fs::read_to_string(records.join(format!("{name}.md5sums")))
            .unwrap_or_else(|e| panic!("{name} has no {name}.md5sums: {e}"));
        let sums = sums
            .lines()
            .map(|l| {
                let (sum, file) = l
                    .split_once("  ")
                    .unwrap_or_else(|| panic!("{name}.md5sums: {l:?}"));
                (sum.to_owned(), file.to_owned())
            })
            .collect();
        out.insert(name, (stanza, sums));
    }
    out
}

/// A record is a valid dpkg stanza named after its package, for the version installed here,
/// with a file list.
fn assert_current_record(name: &str, stanza: &str, sums: &[(String, String)]) {
    assert_eq!(stanza_field(stanza, "Package"), Some(name), "{stanza}");
    assert_eq!(
        stanza_field(stanza, "Status"),
        Some("install ok installed"),
        "{name}"
    );
    assert!(stanza_field(stanza, "Architecture").is_some(), "{name}");
    let version = stanza_field(stanza, "Version").unwrap_or_else(|| panic!("{name}: no Version"));
    assert_eq!(
        version,
        installed_version(name),
        "{name}: the record is not the installed package"
    );
    assert!(!sums.is_empty(), "{name}.md5sums lists no file");
}

#[test]
fn every_staged_library_maps_to_a_debian_package_record() {
    let tree = Tree::stage_files(None);
    let libraries = staged_libraries(&tree.root);
    assert!(
        libraries
            .iter()
            .any(|l| l.to_string_lossy().contains("libvirt.so")),
        "libvirt is staged: {libraries:?}"
    );
    let records = package_records(&tree.root);
    assert!(
        !records.is_empty(),
        "the tree has no package records in var/lib/dpkg/status.d, so a scanner sees none of \
         its {} libraries",
        libraries.len()
    );
    for (name, (stanza, sums)) in &records {
        assert_current_record(name, stanza, sums);
    }
    // Each staged library's content is a file some record claims (by checksum: the staged
    // path may be a symlink's name or the other side of the merged /usr).
    let mut unclaimed = Vec::new();
    let mut claimed_by = std::collections::BTreeSet::new();
    for (library, sum) in libraries.iter().zip(md5s(&tree.root, &libraries)) {
        let owner = records
            .iter()
            .find(|(_, (_, sums))| sums.iter().any(|(s, _)| *s == sum));
        match owner {
            Some((name, _)) => {
                claimed_by.insert(name.clone());
            }
            None => unclaimed.push(library.clone()),
        }
    }
    assert!(
        unclaimed.is_empty(),
        "staged files no package record claims (a scanner cannot see them): {unclaimed:?}"
    );
    // No record for a package that ships nothing in the image.
    let extra: Vec<&String> = records
        .keys()
        .filter(|n| !claimed_by.contains(*n))
        .collect();
    assert!(
        extra.is_empty(),
        "records of packages the tree has no file of: {extra:?}"
    );
    println!(
        "{} staged libraries from {} Debian packages, each with its record",
        libraries.len(),
        records.len()
    );
}

/// `cargo tree` lines `name vX.Y.Z[ (path)][ (*)]` -> crates (name, version), the workspace's
/// own included.
fn tree_crates(args: &[&str]) -> std::collections::BTreeSet<(String, String)> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let out = Command::new(cargo)
        .current_dir(repo_root())
        .args([
            "tree",
            "--locked",
            "--offline",
            "-p",
            "bigfleet-libvirt",
            "--prefix",
            "none",
        ])
        .args(["--target", &host_target(), "-f", "{p}"])
        .args(args)
        .output()
        .expect("run cargo tree");
    assert!(
        out.status.success(),
        "cargo tree {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .filter_map(|l| {
            let mut words = l.split_whitespace();
            let name = words.next()?;
            let version = words.next()?.strip_prefix('v')?;
            Some((name.to_owned(), version.to_owned()))
        })
        .collect()
}

fn host_target() -> String {
    let out = Command::new("rustc")
        .arg("-vV")
        .output()
        .expect("run rustc -vV");
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("host: ").map(str::to_owned))
        .expect("rustc -vV names the host")
}

/// cargo-cyclonedx from scripts/install-cargo-tools.sh (built when missing). A failed install
/// fails the test with the installer's message, unless BIGFLEET_SKIP_DEPLOY_TOOLS=1.
fn install_cyclonedx() -> Result<(), String> {
    let out = Command::new("bash")
        .arg(repo_root().join("scripts/install-cargo-tools.sh"))
        .arg("cargo-cyclonedx")
        .stdin(Stdio::null())
        .output()
        .expect("run scripts/install-cargo-tools.sh");
    if out.status.success() {
        return Ok(());
    }
    Err(format!(
        "scripts/install-cargo-tools.sh cargo-cyclonedx failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    ))
}

/// Runs deploy/sbom.sh on a staged tree and returns the SBOM.
fn write_sbom(tree: &Tree) -> serde_json::Value {
    let sbom_path = tree
        .root
        .join("usr/share/doc/bigfleet-libvirt/sbom.cdx.json");
    let out = Command::new(repo_root().join("deploy/sbom.sh"))
        .arg(&tree.root)
        .arg(&sbom_path)
        .stdin(Stdio::null())
        .output()
        .expect("run deploy/sbom.sh");
    assert!(
        out.status.success(),
        "deploy/sbom.sh failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let sbom: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&sbom_path).unwrap()).unwrap();
    assert_eq!(sbom["bomFormat"], "CycloneDX");
    sbom
}

/// The crates an SBOM names, (name, version) from each `pkg:cargo/<name>@<version>[?...]`
/// purl, the described package's own included.
fn sbom_crates(sbom: &serde_json::Value) -> std::collections::BTreeSet<(String, String)> {
    let root = &sbom["metadata"]["component"];
    assert_eq!(
        root["name"], "bigfleet-libvirt",
        "the SBOM describes the binary's package"
    );
    sbom["components"]
        .as_array()
        .expect("components")
        .iter()
        .chain(std::iter::once(root))
        .filter_map(|c| c["purl"].as_str()?.strip_prefix("pkg:cargo/"))
        .filter_map(|p| {
            let p = p.split('?').next().unwrap();
            let (name, version) = p.rsplit_once('@')?;
            Some((name.to_owned(), version.to_owned()))
        })
        .collect()
}

/// The SBOM names every crate the binary links, no test-only crate, and only crates of
/// Cargo.lock at their locked versions. Returns the linked crates.
fn assert_sbom_covers_the_binary(
    in_sbom: &std::collections::BTreeSet<(String, String)>,
) -> std::collections::BTreeSet<(String, String)> {
    // Linked into the binary: its normal dependencies for this target, proc-macros aside
    // (they run in the compiler, they are not linked).
    let linked = tree_crates(&["-e", "normal,no-proc-macro"]);
    assert!(linked.iter().any(|(n, _)| n == "tonic"), "{linked:?}");
    let missing: Vec<_> = linked.difference(in_sbom).collect();
    assert!(
        missing.is_empty(),
        "crates the binary links that the SBOM does not name: {missing:?}"
    );
    // No test-only crate: the direct dev-dependencies the binary does not link.
    // (cargo-cyclonedx resolves features over the whole workspace, so a crate that only a
    // dev-dependency's feature or an optional dependency brings in may be named too: the
    // SBOM may say more than the binary links, never less.)
    let dev_only: Vec<(String, String)> = tree_crates(&["-e", "dev", "--depth", "1"])
        .difference(&linked)
        .cloned()
        .collect();
    assert!(dev_only.iter().any(|(n, _)| n == "insta"), "{dev_only:?}");
    let test_only: Vec<_> = dev_only.iter().filter(|c| in_sbom.contains(*c)).collect();
    assert!(
        test_only.is_empty(),
        "the SBOM names test-only crates: {test_only:?}"
    );
    let lock = std::fs::read_to_string(repo_root().join("Cargo.lock")).unwrap();
    for (name, version) in in_sbom {
        let entry = format!("name = \"{name}\"\nversion = \"{version}\"\n");
        assert!(
            lock.contains(&entry),
            "{name} {version} is not in Cargo.lock"
        );
    }
    linked
}

#[test]
fn the_sbom_names_the_crates_the_binary_links_and_the_staged_debian_packages() {
    let Some(()) = skip::needs(skip::DEPLOY_TOOLS, install_cyclonedx()) else {
        return;
    };
    let tree = Tree::stage_files(None);
    let sbom = write_sbom(&tree);
    let in_sbom = sbom_crates(&sbom);
    let linked = assert_sbom_covers_the_binary(&in_sbom);
    // Every staged Debian package, at the version its record gives.
    let records = package_records(&tree.root);
    assert!(!records.is_empty());
    for (name, (stanza, _)) in &records {
        let version = stanza_field(stanza, "Version").unwrap();
        let component = sbom["components"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| {
                c["name"] == name.as_str()
                    && c["purl"]
                        .as_str()
                        .is_some_and(|p| p.starts_with("pkg:deb/debian/"))
            })
            .unwrap_or_else(|| panic!("the SBOM does not name the Debian package {name}"));
        assert_eq!(component["version"], version, "{name}");
    }
    println!(
        "SBOM: {} crates (the binary links {}), {} Debian packages",
        in_sbom.len(),
        linked.len(),
        records.len()
    );
}
