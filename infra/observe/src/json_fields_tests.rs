//! The JSON lines of `AppendedJsonFields` and `JsonLine` against tracing-subscriber's own JSON
//! format on the same events: the same values on every line.

use std::sync::{Arc, Mutex};

use tracing::field::Empty;
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::layer::SubscriberExt;

use super::AppendedJsonFields;
use crate::json_line::JsonLine;

#[derive(Clone, Default)]
struct Lines(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Lines {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> MakeWriter<'a> for Lines {
    type Writer = Lines;
    fn make_writer(&'a self) -> Lines {
        self.clone()
    }
}

impl Lines {
    fn text(&self) -> String {
        String::from_utf8(self.0.lock().unwrap().clone()).unwrap()
    }
}

#[derive(Debug)]
#[allow(dead_code, reason = "read through Debug only")]
struct Shape {
    name: &'static str,
    quoted: &'static str,
}

/// Spans recorded in steps, fields recorded twice, odd values, events inside, beside and
/// outside spans.
fn scenario() {
    let outer = tracing::info_span!("rpc", method = "Create", zone = Empty, code = Empty);
    let _outer = outer.enter();
    tracing::info!("before any record");
    outer.record("zone", "rackA");
    outer.record("code", "Ok");
    let inner = tracing::info_span!("transition", kind = "create", outcome = Empty, r#type = ?"t");
    let _inner = inner.enter();
    inner.record("outcome", "succeeded");
    outer.record("zone", "rackB \"quoted\" \u{e9}\n\u{1}");
    outer.record("code", 7);
    tracing::info!(
        dur_ms = 1.5,
        nan = f64::NAN,
        big = u64::MAX,
        neg = -3_i64,
        ok = true,
        "rpc"
    );
    tracing::warn!(
        shape = ?Shape { name: "kvm.small", quoted: "a\"b" },
        bytes = &b"\x00ab"[..],
        "odd values"
    );
    drop(_inner);
    drop(_outer);
    tracing::info!(parent: &inner, "explicit parent, nothing entered");
    let empty = tracing::info_span!("empty");
    tracing::info!(parent: &empty, "a span without fields");
    tracing::error!(target: "elsewhere", "outside every span");
}

/// The lines `scenario` gives with tracing-subscriber's JSON format and field store.
fn reference() -> String {
    let out = Lines::default();
    let layer = tracing_subscriber::fmt::layer()
        .json()
        .fmt_fields(tracing_subscriber::fmt::format::JsonFields::new())
        .without_time()
        .with_writer(out.clone());
    tracing::subscriber::with_default(tracing_subscriber::registry().with(layer), scenario);
    out.text()
}

/// The lines `scenario` gives with the shipped binary's formatter and field store.
fn ours() -> String {
    let out = Lines::default();
    let layer = tracing_subscriber::fmt::layer()
        .fmt_fields(AppendedJsonFields)
        .event_format(JsonLine::without_time())
        .with_writer(out.clone());
    tracing::subscriber::with_default(tracing_subscriber::registry().with(layer), scenario);
    out.text()
}

fn parsed(text: &str) -> Vec<serde_json::Value> {
    text.lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

#[test]
fn lines_carry_the_values_of_tracing_subscribers_own_json_format() {
    let (ours, reference) = (ours(), reference());
    assert_eq!(
        parsed(&ours),
        parsed(&reference),
        "ours:\n{ours}\nreference:\n{reference}"
    );
    assert_eq!(ours.lines().count(), 6, "{ours}");
}

#[test]
fn a_field_recorded_twice_is_on_the_line_once_with_its_later_value() {
    let text = ours();
    let lines = parsed(&text);
    let rpc = &lines[1]["spans"][0];
    assert_eq!(rpc["zone"], "rackB \"quoted\" \u{e9}\n\u{1}", "{text}");
    assert_eq!(rpc["code"], 7, "{text}");
    assert_eq!(rpc["method"], "Create", "{text}");
    assert_eq!(lines[1]["span"]["outcome"], "succeeded", "{text}");
    assert_eq!(lines[1]["span"]["type"], "\"t\"", "{text}");
    let second = text.lines().nth(1).unwrap();
    assert_eq!(second.matches("\"zone\":").count(), 1, "{second}");
    assert_eq!(second.matches("\"code\":").count(), 1, "{second}");
}

#[test]
fn a_line_is_one_json_object_with_its_timestamp_first() {
    let out = Lines::default();
    let layer = tracing_subscriber::fmt::layer()
        .fmt_fields(AppendedJsonFields)
        .event_format(JsonLine::default())
        .with_writer(out.clone());
    tracing::subscriber::with_default(tracing_subscriber::registry().with(layer), || {
        tracing::info!(n = 1, "hello");
    });
    let text = out.text();
    assert!(text.starts_with("{\"timestamp\":\"20"), "{text}");
    assert!(text.ends_with("}\n"), "{text}");
    let line = &parsed(&text)[0];
    let stamp = line["timestamp"].as_str().unwrap();
    assert!(stamp.ends_with('Z') && stamp.contains('T'), "{stamp}");
    assert_eq!(line["fields"]["message"], "hello");
    assert_eq!(line["level"], "INFO");
}
