//! How the JSON log layer keeps a span's fields between its log lines. tracing-subscriber's
//! own `JsonFields` gathers a span's fields into a map of `serde_json::Value`s, writes the
//! map out as one JSON object and, on every `Span::record` after the first, parses that
//! object, adds the new fields and writes it again; the rpc span records its operation id,
//! zone, code and outcome as the call goes, so a Create paid four parses and rewrites
//! before its one log line. [`AppendedJsonFields`] writes each field straight into the
//! stored object (no map, no `Value`s) and appends later fields to it instead
//! (`{"a":1}` then `b=2` is `{"a":1,"b":2}`). A later record of a field the object already
//! holds takes the slow path: the object is parsed, the later value replaces the earlier
//! one, and the object is written again. So the stored object never names a field twice,
//! and the line formatter (`json_line`) copies it onto each line as it is.
//!
//! The values are those `JsonFields` gives: numbers and booleans as JSON numbers and
//! booleans, strings as strings, bytes as an array of numbers, anything else as its `Debug`
//! text; a field named `r#type` is written `type`, and the `log.*` fields of an event that
//! came through the `log` crate are left out (they are its metadata, already on the line).

use std::fmt::{self, Write as _};

use tracing::field::{Field, Visit};
use tracing_subscriber::field::RecordFields;
use tracing_subscriber::fmt::FormatFields;
use tracing_subscriber::fmt::FormattedFields;
use tracing_subscriber::fmt::format::Writer;

/// JSON span fields written directly, and appended to rather than rewritten.
#[derive(Debug, Default)]
pub struct AppendedJsonFields;

impl<'writer> FormatFields<'writer> for AppendedJsonFields {
    fn format_fields<R: RecordFields>(
        &self,
        mut writer: Writer<'writer>,
        fields: R,
    ) -> fmt::Result {
        let mut body = String::new();
        let names = write_fields(&mut body, &fields)?;
        if names.repeated {
            // One record naming a field twice: the map keeps the later value.
            let map = parse_object(&format!("{{{body}}}"))?;
            return write_object(&mut writer, &map);
        }
        writer.write_char('{')?;
        writer.write_str(&body)?;
        writer.write_char('}')
    }

    fn add_fields(
        &self,
        current: &'writer mut FormattedFields<Self>,
        fields: &tracing::span::Record<'_>,
    ) -> fmt::Result {
        if current.fields.is_empty() {
            return self.format_fields(current.as_writer(), fields);
        }
        let mut body = String::new();
        let names = write_fields(&mut body, fields)?;
        if body.is_empty() {
            return Ok(());
        }
        let stored = &current.fields;
        if names.repeated || names.seen().iter().any(|name| holds_key(stored, name)) {
            let mut map = parse_object(stored)?;
            map.extend(parse_object(&format!("{{{body}}}"))?);
            current.fields.clear();
            return write_object(&mut current.fields, &map);
        }
        if !current.fields.ends_with('}') {
            return Err(fmt::Error);
        }
        current.fields.pop();
        if !current.fields.ends_with('{') {
            current.fields.push(',');
        }
        current.fields.push_str(&body);
        current.fields.push('}');
        Ok(())
    }
}

/// Whether the stored object has the key `name`. Inside a JSON string every `"` is escaped,
/// so `"name":` with bare quotes is a key; a false match would only take the slow path.
fn holds_key(object: &str, name: &str) -> bool {
    object
        .match_indices(name)
        .any(|(at, _)| object[..at].ends_with('"') && object[at + name.len()..].starts_with("\":"))
}

fn parse_object(text: &str) -> Result<serde_json::Map<String, serde_json::Value>, fmt::Error> {
    match serde_json::from_str(text) {
        Ok(serde_json::Value::Object(map)) => Ok(map),
        _ => Err(fmt::Error),
    }
}

fn write_object(
    out: &mut impl fmt::Write,
    map: &serde_json::Map<String, serde_json::Value>,
) -> fmt::Result {
    let text = serde_json::to_string(map).map_err(|_| fmt::Error)?;
    out.write_str(&text)
}

/// Writes the record's fields as the body of a JSON object (no braces) and says which
/// names it wrote.
fn write_fields<R: RecordFields>(out: &mut String, fields: &R) -> Result<Names, fmt::Error> {
    let mut visitor = BodyVisitor {
        out,
        names: Names::default(),
        result: Ok(()),
    };
    fields.record(&mut visitor);
    visitor.result.map(|()| visitor.names)
}

/// The names one record wrote (the first few; enough for any span of this provider), and
/// whether one came twice.
#[derive(Default)]
struct Names {
    seen: [&'static str; 16],
    count: usize,
    repeated: bool,
}

impl Names {
    fn seen(&self) -> &[&'static str] {
        &self.seen[..self.count.min(self.seen.len())]
    }

    fn add(&mut self, name: &'static str) {
        if self.seen().contains(&name) {
            self.repeated = true;
        } else if self.count < self.seen.len() {
            self.seen[self.count] = name;
            self.count += 1;
        } else {
            // Past what is tracked: let the slow path decide.
            self.repeated = true;
        }
    }
}

struct BodyVisitor<'a> {
    out: &'a mut String,
    names: Names,
    result: fmt::Result,
}

impl BodyVisitor<'_> {
    fn entry(&mut self, name: &'static str, value: &impl serde::Serialize) {
        if self.result.is_err() {
            return;
        }
        self.names.add(name);
        if !self.out.is_empty() {
            self.out.push(',');
        }
        self.result = write_json(self.out, name)
            .and_then(|()| self.out.write_char(':'))
            .and_then(|()| write_json(self.out, value));
    }
}

impl Visit for BodyVisitor<'_> {
    fn record_f64(&mut self, field: &Field, value: f64) {
        self.entry(field.name(), &value);
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.entry(field.name(), &value);
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.entry(field.name(), &value);
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.entry(field.name(), &value);
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.entry(field.name(), &value);
    }
    fn record_bytes(&mut self, field: &Field, value: &[u8]) {
        self.entry(field.name(), &value);
    }
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        let name = field.name();
        if name.starts_with("log.") {
            return;
        }
        let name = name.strip_prefix("r#").unwrap_or(name);
        self.entry(name, &format_args!("{value:?}"));
    }
}

/// Writes `value` as JSON (serde_json's escaping) into a `fmt::Write`.
pub(crate) fn write_json<T: serde::Serialize + ?Sized>(
    out: &mut impl fmt::Write,
    value: &T,
) -> fmt::Result {
    serde_json::to_writer(Utf8Out(out), value).map_err(|_| fmt::Error)
}

/// `io::Write` over a `fmt::Write`: serde_json writes only whole UTF-8 characters.
struct Utf8Out<'a, W: fmt::Write>(&'a mut W);

impl<W: fmt::Write> std::io::Write for Utf8Out<'_, W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let text = std::str::from_utf8(buf)
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))?;
        self.0
            .write_str(text)
            .map_err(|_| std::io::Error::other("the log line's writer failed"))?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
#[path = "json_fields_tests.rs"]
mod tests;
