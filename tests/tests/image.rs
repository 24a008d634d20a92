//! The container image's contents, tested without Docker (CI has no daemon and no base
//! image). `deploy/stage-runtime.sh` — the script `deploy/Dockerfile` runs — assembles the
//! runtime tree from the binary under test; the binary then runs inside that tree alone,
//! through `chroot --userspec=65532:65532` (the image's uid), so a library the script fails
//! to stage, or a file the binary expects outside the tree, breaks the test as it would
//! break the image. Needs root for `chroot` (CI runs as root); elsewhere the tests fail,
//! unless `BIGFLEET_SKIP_ROOT_TESTS=1` (`harness/skip.rs`).
//!
//! The chroot holds the staged tree and nothing else (the test driver's node file, where a
//! test needs it): no shell, no `/etc`, no `/proc`, no `/tmp`. The distroless base layer
//! adds a few files on top of that (`/etc/passwd`, CA certificates, `/tmp`), so a binary
//! that runs here runs in the image.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use bigfleet_libvirt_libvirt::fixture::Fixture;
use bigfleet_libvirt_proto::v1alpha1 as pb;

use crate::harness::*;

/// The image's user (`USER 65532:65532` in the Dockerfile).
const NONROOT: &str = "65532:65532";

/// A staged runtime tree in a temporary directory.
struct Tree {
    _dir: tempfile::TempDir,
    root: PathBuf,
    /// The host's `chroot`, resolved before the child's environment is cleared.
    chroot: PathBuf,
    /// The script's file listing and total.
    listing: String,
}

impl Tree {
    /// Stages the binary under test, or says why this machine cannot run the test.
    fn stage() -> Result<Tree, String> {
        if !nix_is_root() {
            return Err("chroot needs root (CI runs as root)".to_owned());
        }
        let chroot = which::which("chroot")
            .map_err(|e| format!("chroot (coreutils) is not installed: {e}"))?;
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
        Ok(Tree {
            _dir: dir,
            root,
            chroot,
            listing,
        })
    }

    /// `chroot --userspec=65532:65532 <tree> /usr/local/bin/bigfleet-libvirt`, with an
    /// environment as bare as the image's.
    fn command(&self) -> Command {
        let mut command = Command::new(&self.chroot);
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
