//! Unit tests for `list_stream`: the streamed message is exactly tonic's, what a stream
//! holds is given back with it, and the send-progress deadline cuts a stopped reader only.

use bigfleet_libvirt_domain::ListQuery;
use bigfleet_libvirt_proto::wire::EncodedMachineList;
use http_body_util::BodyExt;

use super::*;
use crate::list_budget::{ListBudget, STREAM_WORKING};

const DEADLINE: Duration = Duration::from_secs(30);

/// A streamed answer of 1000 machines (200 bytes each, shared with `memo`) as the layer makes
/// it from the handler's response, its whole message, and the cut counter.
async fn streamed(
    budget: &ListBudget,
    memo: &[Arc<[u8]>],
) -> (tonic::body::Body, Vec<u8>, Counter) {
    let list = EncodedMachineList {
        machines: memo.to_vec(),
        revision: b"42".to_vec(),
    };
    let whole = list.encode_to_vec();
    let reservation = budget.reserve(STREAM_WORKING).await;
    let answer = budget.keep(list, &ListQuery::default(), 42);
    // What tonic makes of the empty stand-in: its message frame, then trailers.
    let mut trailers = http::HeaderMap::new();
    trailers.insert("grpc-status", http::HeaderValue::from_static("0"));
    let stand_in = futures::stream::iter([
        Ok::<_, tonic::Status>(Frame::data(Bytes::from_static(&[0, 0, 0, 0, 0]))),
        Ok(Frame::trailers(trailers)),
    ]);
    let body = tonic::body::Body::new(http_body_util::StreamBody::new(stand_in));
    let mut response = http::Response::new(body);
    let cut = Counter::default();
    response.extensions_mut().insert(StreamedList::new(
        answer,
        reservation,
        DEADLINE,
        cut.clone(),
    ));
    (release_when_sent(response).into_body(), whole, cut)
}

fn memo() -> Vec<Arc<[u8]>> {
    let machine: Vec<u8> = (0..200u8).collect();
    vec![Arc::from(machine); 1000]
}

#[tokio::test]
async fn a_streamed_answer_is_the_whole_message_and_what_it_holds_lives_with_the_stream() {
    let budget = ListBudget::new(4);
    let memo = memo();
    let (mut body, whole, cut) = streamed(&budget, &memo).await;
    assert!(budget.in_use() >= STREAM_WORKING, "held while streamed");
    let mut data = Vec::new();
    let mut frames = 0;
    let mut status = None;
    while let Some(frame) = body.frame().await {
        match frame.expect("frame").into_data() {
            Ok(piece) => {
                assert!(piece.len() <= CHUNK + 256);
                data.extend_from_slice(&piece);
                frames += 1;
            }
            Err(frame) => status = frame.into_trailers().ok(),
        }
    }
    assert!(
        frames > 3,
        "streamed in pieces, not whole ({frames} frames)"
    );
    assert_eq!(data[0], 0);
    assert_eq!(
        u32::from_be_bytes(data[1..5].try_into().unwrap()) as usize,
        whole.len()
    );
    assert_eq!(
        &data[5..],
        &whole[..],
        "exactly the message tonic would have sent"
    );
    assert_eq!(status.expect("trailers")["grpc-status"], "0");
    assert_eq!(
        budget.in_use(),
        0,
        "given back once the last piece was taken"
    );
    assert_eq!(cut.get(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_reader_that_takes_nothing_for_the_deadline_loses_its_stream() {
    let budget = ListBudget::new(4);
    let memo = memo();
    let (mut body, _, cut) = streamed(&budget, &memo).await;
    body.frame().await.expect("prefix").expect("prefix");
    body.frame().await.expect("piece").expect("piece");
    let held = budget.in_use();
    assert!(held >= STREAM_WORKING, "{held} bytes held while read");
    tokio::time::sleep(DEADLINE - Duration::from_secs(1)).await;
    assert_eq!(cut.get(), 0, "not yet");
    assert_eq!(budget.in_use(), held);
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(cut.get(), 1, "cut at the deadline");
    assert_eq!(
        budget.in_use(),
        0,
        "the answer and the stream's share given back"
    );
    let error = body
        .frame()
        .await
        .expect("an error, not the rest")
        .expect_err("the stream is reset");
    assert_eq!(error.code(), tonic::Code::Cancelled);
    let reason = std::error::Error::source(&error)
        .and_then(|source| source.downcast_ref::<h2::Error>())
        .and_then(h2::Error::reason);
    assert_eq!(reason, Some(h2::Reason::CANCEL), "hyper resets with CANCEL");
}

#[tokio::test(start_paused = true)]
async fn a_slow_reader_that_keeps_taking_pieces_is_not_cut() {
    let budget = ListBudget::new(4);
    let memo = memo();
    let (mut body, whole, cut) = streamed(&budget, &memo).await;
    let mut read = 0;
    while let Some(frame) = body.frame().await {
        if let Ok(piece) = frame.expect("never cut").into_data() {
            read += piece.len();
        }
        tokio::time::sleep(DEADLINE - Duration::from_secs(1)).await;
    }
    assert_eq!(read, whole.len() + 5);
    assert_eq!(cut.get(), 0);
}
