//! The real libvirt backend end to end: the binary against a libvirt test-driver host
//! (`--connect test:///…/node.xml --image base.qcow2`), driven over gRPC. Create and Delete
//! define, start, destroy and undefine real (in-memory) domains; Configure needs a qemu
//! guest agent, which the test driver does not have, so it must fail with a clear error.

use std::path::Path;
use std::process::Command;

use bigfleet_libvirt_libvirt::fixture::Fixture;
use bigfleet_libvirt_proto::v1alpha1 as pb;
use pb::MachineState as S;

use crate::harness::*;

/// A host big enough for every built-in slot under the default reserve and ratios.
fn node(dir: &Path) -> String {
    let fixture = Fixture {
        cpus: 32,
        memory_mib: 256 * 1024,
        ..Fixture::default()
    };
    fixture.write(dir, "node.xml").expect("write the fixture")
}

fn start(dir: &Path) -> Server {
    let connect = format!("--connect={}", node(dir));
    Server::start(&[
        connect.as_str(),
        "--image=base.qcow2",
        "--provider=e2e",
        "--seed-count=4",
    ])
}

#[tokio::test]
async fn create_and_delete_drive_real_domains_over_grpc() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path());
    let mut c = server.client().await;
    let speculative = list(&mut c, &[S::Speculative], 0, b"").await.machines;
    assert_eq!(speculative.len(), 4, "every slot fits the host");
    let id = pick(&server, &mut c).await;
    create(&mut c, &id, None).await.expect("Create");
    let idle = reach(&mut c, &id, S::Idle, SETTLE).await;
    let host = idle.host.clone().expect("an Idle machine has a host");
    assert_eq!(host.provider, "e2e");
    assert!(host.r#ref.starts_with("local/bigfleet-"), "{host:?}");
    assert_eq!(idle.last_error, "");
    delete(&mut c, &id, None).await.expect("Delete");
    let gone = reach(&mut c, &id, S::Speculative, SETTLE).await;
    assert!(!host_set(&gone), "Delete clears the host: {gone:?}");
    // The slot can be created again: the first domain really was undefined.
    create(&mut c, &id, None).await.expect("Create again");
    reach(&mut c, &id, S::Idle, SETTLE).await;
}

#[tokio::test]
async fn configure_fails_clearly_without_a_guest_agent() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path());
    let mut c = server.client().await;
    let id = walk_to_idle(&server, &mut c).await;
    configure(&mut c, &id, "e2e-cluster", &[], None)
        .await
        .expect("Configure is accepted");
    let failed = reach(&mut c, &id, S::Failed, SETTLE).await;
    let error = &failed.last_error;
    assert!(error.contains("guest agent"), "{error}");
    assert!(error.contains("not supported"), "{error}");
    assert!(
        !error.contains("conformance"),
        "the blob never reaches last_error"
    );
}

fn refused(args: &[&str]) -> String {
    let output = Command::new(binary())
        .arg("offerings")
        .args(args)
        .output()
        .expect("run bigfleet-libvirt");
    assert!(!output.status.success(), "{args:?} must be refused");
    String::from_utf8_lossy(&output.stderr).into_owned()
}

#[test]
fn the_libvirt_backend_needs_an_image_and_refuses_fault_hooks() {
    let dir = tempfile::tempdir().unwrap();
    let connect = format!("--connect={}", node(dir.path()));
    let error = refused(&[connect.as_str()]);
    assert!(error.contains("--image is required"), "{error}");
    let error = refused(&[connect.as_str(), "--image=base.qcow2", "--fake-fault-hooks"]);
    assert!(error.contains("--fake-fault-hooks"), "{error}");
    let error = refused(&[
        connect.as_str(),
        "--image=base.qcow2",
        "--cpu-allocation-ratio=0",
    ]);
    assert!(error.contains("--cpu-allocation-ratio"), "{error}");
    for bad in ["0", "-1", "inf"] {
        let flag = format!("--disk-allocation-ratio={bad}");
        let error = refused(&[connect.as_str(), "--image=base.qcow2", &flag]);
        assert!(
            error.contains("--disk-allocation-ratio must be a finite number above 0"),
            "{bad}: {error}"
        );
    }
}

/// `offerings` over a test-driver node with `--image` set: the flags a budget check needs.
struct Plan {
    connect: String,
    _dir: tempfile::TempDir,
}

impl Plan {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        Self {
            connect: format!("--connect={}", node(dir.path())),
            _dir: dir,
        }
    }

    /// The plan's flags plus `extra`.
    fn args(&self, extra: &[&str]) -> Vec<String> {
        let mut args = vec![self.connect.clone(), "--image=base.qcow2".to_owned()];
        args.extend(extra.iter().map(|a| (*a).to_owned()));
        args
    }

    /// The error `offerings` refuses the plan plus `extra` with.
    fn refuse(&self, extra: &[&str]) -> String {
        let args = self.args(extra);
        refused(&args.iter().map(String::as_str).collect::<Vec<_>>())
    }
}

#[test]
fn the_host_and_agent_budgets_are_checked() {
    let plan = Plan::new();
    let (with, refuse) = (|e: &[&str]| plan.args(e), |e: &[&str]| plan.refuse(e));
    let error = refuse(&["--host-budget=0"]);
    assert!(
        error.contains("--host-budget must be at least 1"),
        "{error}"
    );
    assert!(error.contains("the default is 7"), "{error}");
    let error = refuse(&["--host-budget=2", "--agent-budget=3"]);
    assert!(
        error.contains("--agent-budget must be between 1 and --host-budget (2), got 3"),
        "{error}"
    );
    let error = refuse(&["--agent-budget=0"]);
    assert!(
        error.contains("--agent-budget must be between 1"),
        "{error}"
    );
    let error = refuse(&["--host-connections=0"]);
    assert!(
        error.contains("--host-connections must be at least 1; leave it unset"),
        "{error}"
    );
    assert!(error.contains("4 for --host-budget 7"), "{error}");
    let error = refuse(&["--host-budget=3", "--host-connections=4"]);
    assert!(
        error.contains("--host-connections 4 is more than --host-budget 3"),
        "{error}"
    );
    assert!(error.contains("use 3 or fewer"), "{error}");
    // The environment variable is the same flag.
    let output = Command::new(binary())
        .arg("offerings")
        .args(with(&[]))
        .env("BIGFLEET_LIBVIRT_HOST_BUDGET", "0")
        .output()
        .expect("run bigfleet-libvirt");
    let error = String::from_utf8_lossy(&output.stderr);
    assert!(
        !output.status.success(),
        "BIGFLEET_LIBVIRT_HOST_BUDGET=0 must be refused"
    );
    assert!(
        error.contains("--host-budget must be at least 1"),
        "{error}"
    );
    // In range, the plan is accepted.
    let output = Command::new(binary())
        .arg("offerings")
        .args(with(&[
            "--host-budget=8",
            "--agent-budget=2",
            "--host-connections=4",
        ]))
        .output()
        .expect("run bigfleet-libvirt");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
}

#[test]
fn the_connections_are_checked_against_the_stated_max_client_requests() {
    let plan = Plan::new();
    let (with, refuse) = (|e: &[&str]| plan.args(e), |e: &[&str]| plan.refuse(e));
    // The spread must keep every connection below the hosts' stated max_client_requests.
    let error = refuse(&["--host-budget=8", "--host-connections=3"]);
    assert!(
        error.contains("--host-connections 3 puts up to 3 of --host-budget 8's calls"),
        "{error}"
    );
    assert!(
        error.contains("not below --host-max-client-requests 5"),
        "{error}"
    );
    assert!(
        error.contains("use --host-connections 4 or more"),
        "{error}"
    );
    let error = refuse(&["--host-max-client-requests=2"]);
    assert!(
        error.contains("--host-max-client-requests 2 is below 3"),
        "{error}"
    );
    assert!(
        error.contains("raise max_client_requests in the hosts' libvirtd.conf"),
        "{error}"
    );
    let error = refuse(&["--host-max-client-requests=3", "--host-connections=4"]);
    assert!(
        error.contains("not below --host-max-client-requests 3"),
        "{error}"
    );
    // One connection per call fits a limit of 3 (the environment variable is the flag).
    let output = Command::new(binary())
        .arg("offerings")
        .args(with(&["--host-connections=7"]))
        .env("BIGFLEET_LIBVIRT_HOST_MAX_CLIENT_REQUESTS", "3")
        .output()
        .expect("run bigfleet-libvirt");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
}
