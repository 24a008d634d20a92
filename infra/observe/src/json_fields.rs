//! How the JSON log layer keeps a span's fields between its log lines. tracing-subscriber's
//! own `JsonFields` stores them as one JSON object and, on every `Span::record` after the
//! first, parses that object, adds the new fields and writes it again; the rpc span records
//! its operation id, zone, code and outcome as the call goes, so a Create paid four parses
//! and rewrites before its one log line. [`AppendedJsonFields`] writes the same object
//! and appends later fields to it instead (`{"a":1}` then `b=2` is `{"a":1,"b":2}`). A field
//! recorded twice appears twice in the stored text; the JSON event formatter parses the
//! stored object into a map when it writes a line, where the later value wins, so the lines
//! are exactly those `JsonFields` gives.

use std::fmt;

use tracing_subscriber::field::{RecordFields, VisitOutput};
use tracing_subscriber::fmt::FormatFields;
use tracing_subscriber::fmt::FormattedFields;
use tracing_subscriber::fmt::format::{JsonVisitor, Writer};

/// JSON span fields that a later record appends to rather than rewrites.
#[derive(Debug, Default)]
pub struct AppendedJsonFields;

impl<'writer> FormatFields<'writer> for AppendedJsonFields {
    fn format_fields<R: RecordFields>(
        &self,
        mut writer: Writer<'writer>,
        fields: R,
    ) -> fmt::Result {
        let mut visitor = JsonVisitor::new(&mut writer);
        fields.record(&mut visitor);
        visitor.finish()
    }

    fn add_fields(
        &self,
        current: &'writer mut FormattedFields<Self>,
        fields: &tracing::span::Record<'_>,
    ) -> fmt::Result {
        if current.fields.is_empty() {
            return self.format_fields(current.as_writer(), fields);
        }
        let mut added = String::new();
        self.format_fields(Writer::new(&mut added), fields)?;
        // Both are JSON objects: `{` … `}`. Nothing added is `{}`.
        let (Some(body), true) = (added.strip_prefix('{'), current.fields.ends_with('}')) else {
            return Err(fmt::Error);
        };
        if body == "}" {
            return Ok(());
        }
        current.fields.pop();
        if !current.fields.ends_with('{') {
            current.fields.push(',');
        }
        current.fields.push_str(body);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use tracing::field::Empty;
    use tracing_subscriber::fmt::MakeWriter;
    use tracing_subscriber::layer::SubscriberExt;

    use super::AppendedJsonFields;

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

    /// The JSON lines a span recorded in steps gives, with `fields` as the layer's field
    /// store.
    fn lines<N>(fields: N) -> Vec<serde_json::Value>
    where
        N: for<'w> tracing_subscriber::fmt::FormatFields<'w> + Send + Sync + 'static,
    {
        let out = Lines::default();
        let layer = tracing_subscriber::fmt::layer()
            .json()
            .fmt_fields(fields)
            .without_time()
            .with_writer(out.clone());
        let subscriber = tracing_subscriber::registry().with(layer);
        tracing::subscriber::with_default(subscriber, || {
            let outer = tracing::info_span!("rpc", method = "Create", zone = Empty, code = Empty);
            let _outer = outer.enter();
            tracing::info!("before any record");
            outer.record("zone", "rackA");
            outer.record("code", "Ok");
            let inner = tracing::info_span!("transition", kind = "create", outcome = Empty);
            let _inner = inner.enter();
            inner.record("outcome", "succeeded");
            outer.record("zone", "rackB \"quoted\"");
            outer.record("code", 7);
            tracing::info!(dur_ms = 1.5, "rpc");
        });
        let text = String::from_utf8(out.0.lock().unwrap().clone()).unwrap();
        text.lines()
            .map(|l| serde_json::from_str(l).expect("each line is JSON"))
            .collect()
    }

    #[test]
    fn lines_are_those_of_tracing_subscribers_own_json_fields() {
        let appended = lines(AppendedJsonFields);
        let rewritten = lines(tracing_subscriber::fmt::format::JsonFields::new());
        assert_eq!(appended, rewritten);
        // And the later value of a field recorded twice is the one on the line.
        let last = &appended[1];
        let rpc = &last["spans"][0];
        assert_eq!(rpc["zone"], "rackB \"quoted\"", "{last}");
        assert_eq!(rpc["code"], 7, "{last}");
        assert_eq!(rpc["method"], "Create", "{last}");
        assert_eq!(last["span"]["outcome"], "succeeded", "{last}");
        assert_eq!(last["span"]["kind"], "create", "{last}");
    }
}
