//! The JSON log line, written the way tracing-subscriber's JSON format writes it (`timestamp`,
//! `level`, `fields`, `target`, the event's span as `span` and the current span's scope
//! from its root as `spans`, each span's fields with its `name`), but with each span's
//! fields copied from the object [`AppendedJsonFields`] keeps rather than parsed into a map
//! and written again, which is what tracing-subscriber's formatter does for every span of
//! every line. That parse was a tenth of a Create's server CPU in the shipped binary
//! (docs/benchmarks.md). The stored object never names a field twice (see `json_fields`),
//! so the lines carry the same values; only the order of a span's keys differs (the order
//! they were recorded in, where the parse sorted them).

use std::fmt;

use tracing::{Event, Subscriber};
use tracing_serde::fields::AsMap;
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::time::{FormatTime, SystemTime};
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormattedFields};
use tracing_subscriber::registry::{LookupSpan, SpanRef};

use crate::json_fields::{AppendedJsonFields, write_json};

/// The JSON line formatter of the shipped binary's `--log-format json`.
#[derive(Debug, Default)]
pub struct JsonLine {
    /// Leave the timestamp out (for tests comparing lines).
    without_time: bool,
}

impl JsonLine {
    /// Lines without their `timestamp` (tests).
    #[must_use]
    pub fn without_time() -> Self {
        JsonLine { without_time: true }
    }
}

impl<S> FormatEvent<S, AppendedJsonFields> for JsonLine
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, AppendedJsonFields>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let normalized = tracing_log::NormalizeEvent::normalized_metadata(event);
        let meta = normalized.as_ref().unwrap_or_else(|| event.metadata());
        writer.write_char('{')?;
        if !self.without_time {
            writer.write_str("\"timestamp\":\"")?;
            SystemTime.format_time(&mut writer)?;
            writer.write_str("\",")?;
        }
        write!(writer, "\"level\":\"{}\",\"fields\":", meta.level())?;
        write_json(&mut writer, &event.field_map())?;
        writer.write_str(",\"target\":")?;
        write_json(&mut writer, meta.target())?;
        let current = event
            .parent()
            .and_then(|id| ctx.span(id))
            .or_else(|| ctx.lookup_current());
        if let Some(span) = &current {
            writer.write_str(",\"span\":")?;
            write_span(&mut writer, span)?;
            writer.write_str(",\"spans\":[")?;
            if let Some(leaf) = ctx.lookup_current() {
                for (i, span) in leaf.scope().from_root().enumerate() {
                    if i > 0 {
                        writer.write_char(',')?;
                    }
                    write_span(&mut writer, &span)?;
                }
            }
            writer.write_char(']')?;
        }
        writer.write_str("}\n")
    }
}

/// One span: its stored fields with its `name` added last.
fn write_span<S>(out: &mut Writer<'_>, span: &SpanRef<'_, S>) -> fmt::Result
where
    S: for<'a> LookupSpan<'a>,
{
    let extensions = span.extensions();
    let stored = extensions
        .get::<FormattedFields<AppendedJsonFields>>()
        .map_or("{}", |fields| fields.fields.as_str());
    let body = stored
        .strip_prefix('{')
        .and_then(|rest| rest.strip_suffix('}'))
        .ok_or(fmt::Error)?;
    out.write_char('{')?;
    if !body.is_empty() {
        out.write_str(body)?;
        out.write_char(',')?;
    }
    out.write_str("\"name\":")?;
    write_json(out, span.name())?;
    out.write_char('}')
}
