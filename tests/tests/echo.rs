//! No input is echoed unbounded, against the real binary over real gRPC: an id over 1 KiB
//! is refused with INVALID_ARGUMENT and a short message before any fence mark is touched
//! (so nothing of its size is logged or persisted), and ids up to the limit come back in
//! messages cut to their first 128 bytes, escaped, with their length.

use std::path::Path;

use bigfleet_libvirt_proto::v1alpha1 as pb;
use pb::capacity_provider_client::CapacityProviderClient;
use tonic::Code;
use tonic::transport::{Channel, Endpoint};

use crate::harness::logs::log_caught_up;
use crate::harness::*;

/// A client with tonic's default limits (4 MiB decode, default HTTP/2 header limits), as
/// a shard would have: a status message that repeated a 1 MiB id would not reach it.
async fn default_client(server: &Server) -> CapacityProviderClient<Channel> {
    let channel = Endpoint::from_shared(format!("http://{}", server.addr))
        .unwrap()
        .connect()
        .await
        .unwrap();
    CapacityProviderClient::new(channel)
}

/// Bytes of log the server has written for the calls answered so far (up to and including a
/// sentinel call's line: see [`log_caught_up`]).
async fn log_bytes(server: &Server, c: &mut Client) -> usize {
    let lines = log_caught_up(server, c).await;
    lines.iter().map(|l| l.len() + 1).sum()
}

/// The state file's size; the provider creates the file at start-up, so it must be there.
fn file_size(path: &Path) -> u64 {
    std::fs::metadata(path)
        .unwrap_or_else(|e| panic!("the state file {}: {e}", path.display()))
        .len()
}

fn assert_short_invalid<T: std::fmt::Debug>(result: Result<T, tonic::Status>, field: &str) {
    let status = result.expect_err("an oversized id is refused");
    assert_eq!(status.code(), Code::InvalidArgument, "{field}: {status:?}");
    assert!(
        status.message().len() < 1024,
        "{field}: a {}-byte status message",
        status.message().len()
    );
    assert!(
        status.message().contains(field) && status.message().contains("1048576 bytes"),
        "the message names the field and its size: {}",
        status.message()
    );
}

#[tokio::test]
async fn a_megabyte_id_is_invalid_argument_with_a_short_message_and_mints_no_mark() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state.redb");
    let state_flag = format!("--state={}", state.display());
    let server = crate::harness::profiles::core_with(&[&state_flag]);
    let mut c = default_client(&server).await;
    let mut harness_client = server.client().await;
    let real = pick(&server, &mut harness_client).await;
    let big = "x".repeat(1 << 20);
    let shard = unique_shard("echo");
    let token = || tok(&shard, 1, 1);

    let log_before = log_bytes(&server, &mut harness_client).await;
    let state_before = file_size(&state);
    let create_big = pb::CreateRequest {
        machine_id: big.clone(),
        shard_id: shard.clone(),
        shard_epoch: 1,
        sequence_number: 1,
    };
    assert_short_invalid(c.create(create_big).await, "machine_id");
    let configure = pb::ConfigureRequest {
        machine_id: big.clone(),
        cluster_id: "c".into(),
        shard_id: shard.clone(),
        shard_epoch: 1,
        sequence_number: 1,
        ..Default::default()
    };
    assert_short_invalid(c.configure(configure).await, "machine_id");
    let drain = pb::DrainRequest {
        machine_id: big.clone(),
        shard_id: shard.clone(),
        shard_epoch: 1,
        sequence_number: 1,
        ..Default::default()
    };
    assert_short_invalid(c.drain(drain).await, "machine_id");
    let delete = pb::DeleteRequest {
        machine_id: big.clone(),
        shard_id: shard.clone(),
        shard_epoch: 1,
        sequence_number: 1,
    };
    assert_short_invalid(c.delete(delete).await, "machine_id");
    // A huge shard id on a real machine: refused before its mark could be minted.
    let huge_shard = pb::CreateRequest {
        machine_id: real.clone(),
        shard_id: big.clone(),
        shard_epoch: 1,
        sequence_number: 1,
    };
    assert_short_invalid(c.create(huge_shard).await, "shard_id");
    let get = c.get(pb::MachineRef { id: big.clone() }).await;
    let status = get.expect_err("a 1 MiB Get id is refused");
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert!(status.message().len() < 1024, "{}", status.message());
    // The growth includes the second sentinel's own line (a few hundred bytes).
    let calls = 6;
    let log_growth = log_bytes(&server, &mut harness_client).await - log_before;
    let state_growth = file_size(&state).saturating_sub(state_before);
    println!(
        "{calls} calls with 1 MiB ids: log grew {log_growth} bytes, state file {state_growth} bytes"
    );
    assert!(
        log_growth < calls * 4096,
        "log grew {log_growth} bytes over {calls} calls (limit 4 KiB each)"
    );
    assert!(
        state_growth < 256 * 1024,
        "the state file grew {state_growth} bytes: something of the id's size was persisted"
    );

    // No mark was minted for the real machine: the shard's very first token still works.
    let ack = create(&mut harness_client, &real, token()).await;
    assert!(
        ack.is_ok(),
        "(1,1) on the real id after the refusals: {ack:?}"
    );
}

#[tokio::test]
async fn ids_up_to_the_limit_are_echoed_cut_and_escaped() {
    let server = core();
    let mut c = default_client(&server).await;

    // Exactly 1 KiB is an id like any other (unknown here); one byte more is refused.
    let at_limit = "k".repeat(1024);
    let found = c
        .get(pb::MachineRef {
            id: at_limit.clone(),
        })
        .await;
    let status = found.expect_err("unknown id");
    assert_eq!(status.code(), Code::NotFound, "{status:?}");
    assert!(
        status.message().contains("… (1024 bytes)") && status.message().len() < 1024,
        "{}",
        status.message()
    );
    let over = c
        .get(pb::MachineRef {
            id: "k".repeat(1025),
        })
        .await;
    assert_eq!(over.expect_err("too long").code(), Code::InvalidArgument);

    // A mark minted for a long unknown id and long shard id, then a stale token: the
    // FAILED_PRECONDITION message cuts both.
    let long_id = format!("ghost-{}", "i".repeat(994));
    let long_shard = format!("shard-{}", "s".repeat(994));
    let request = |epoch| pb::CreateRequest {
        machine_id: long_id.clone(),
        shard_id: long_shard.clone(),
        shard_epoch: epoch,
        sequence_number: 1,
    };
    let first = c.create(request(2)).await.expect_err("unknown id");
    assert_eq!(first.code(), Code::NotFound, "{first:?}");
    assert!(first.message().len() < 1024, "{}", first.message());
    let stale = c.create(request(1)).await.expect_err("stale token");
    assert_eq!(stale.code(), Code::FailedPrecondition, "{stale:?}");
    assert!(
        stale.message().len() < 1024 && stale.message().matches("(1000 bytes)").count() == 2,
        "{}",
        stale.message()
    );

    // Control characters come back escaped, never raw.
    let evil = "evil\nid\u{1b}[31m";
    let status = c
        .get(pb::MachineRef { id: evil.into() })
        .await
        .expect_err("unknown id");
    assert_eq!(status.code(), Code::NotFound);
    assert!(
        status.message().contains("\\n") && status.message().contains("\\u{1b}"),
        "{}",
        status.message()
    );
    assert!(!status.message().contains('\n'), "{}", status.message());

    let mut harness_client = server.client().await;
    let log = log_caught_up(&server, &mut harness_client).await.join("\n");
    assert!(!log.contains(&long_id), "a long id was logged whole");
    assert!(
        !log.contains(&long_shard),
        "a long shard id was logged whole"
    );
    assert!(!log.contains(&at_limit), "a 1 KiB id was logged whole");
}
