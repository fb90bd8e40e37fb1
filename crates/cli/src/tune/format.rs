//! The log formats `tune` reads, one line at a time: Common and Combined Log Format (as
//! nginx and Apache write them), JSON lines with configurable field names, and CSV
//! `timestamp,key,cost`.

use std::borrow::Cow;

use clap::ValueEnum;
use serde_json::Value;

use super::time::{self, Stamp};

/// Which format the log lines are in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum Format {
    /// Common Log Format, or Combined (referer and user agent quoted after the byte
    /// count) and any further quoted fields nginx or Apache append:
    /// `host ident user [10/Oct/2000:13:55:36 -0700] "GET /a HTTP/1.1" 200 2326 "ref" "ua"`.
    Clf,
    /// One JSON object a line; field names set with the --json-* options.
    Json,
    /// `timestamp,key,cost`: time (RFC 3339, epoch seconds or a CLF date), the key, and
    /// the cost in whole tokens. A first line `timestamp,key,cost` is skipped.
    Csv,
}

/// What identifies the bucket a request is charged to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum KeyChoice {
    /// The client address (CLF's host, the JSON client field, CSV's key column).
    Client,
    /// A named field: in CLF `ident`, `user`, `referer`, `user-agent`, or `extraN` for the
    /// N-th quoted field after the user agent; in JSON any field (`a.b` for nested).
    Field(String),
    /// The first segment of the path: `api` for `/api/v1/users?id=3`, `/` for `/`.
    FirstSegment,
    /// One key for every request: a global limit.
    Constant,
}

impl KeyChoice {
    /// Parses `client`, `path`, `global` or `field:NAME`.
    pub(crate) fn parse(text: &str) -> Result<KeyChoice, String> {
        match text {
            "client" => Ok(KeyChoice::Client),
            "path" => Ok(KeyChoice::FirstSegment),
            "global" => Ok(KeyChoice::Constant),
            _ => match text.strip_prefix("field:") {
                Some(name) if !name.is_empty() => Ok(KeyChoice::Field(name.to_string())),
                _ => Err(format!(
                    "the key must be client, path (its first segment), global, or \
                     field:NAME, got `{text}`"
                )),
            },
        }
    }
}

/// Field names of JSON-lines logs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct JsonFields {
    /// The time: RFC 3339 or CLF text, or epoch seconds (a number or a string).
    pub(crate) time: String,
    /// The client address (the key `client`).
    pub(crate) client: String,
    /// The HTTP method.
    pub(crate) method: String,
    /// The path (the query string, if any, is ignored).
    pub(crate) path: String,
    /// The cost in whole tokens, if the log carries one; else the work classes decide.
    pub(crate) cost: Option<String>,
}

/// One request read from a line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Record<'a> {
    pub(crate) stamp: Stamp,
    pub(crate) key: Cow<'a, str>,
    pub(crate) method: Cow<'a, str>,
    /// The path without its query string.
    pub(crate) path: Cow<'a, str>,
    /// The cost the line states (CSV, or the JSON cost field); `None` lets the work
    /// classes decide.
    pub(crate) cost: Option<u64>,
}

/// Reads lines of one format with one key choice.
#[derive(Clone, Debug)]
pub(crate) struct LineParser {
    format: Format,
    key: KeyChoice,
    json: JsonFields,
}

/// The largest cost a line may state.
pub(crate) const MAX_COST: u64 = u32::MAX as u64;

impl LineParser {
    /// A parser, or a message when the key choice does not apply to the format.
    pub(crate) fn new(format: Format, key: KeyChoice, json: JsonFields) -> Result<Self, String> {
        if format == Format::Csv && matches!(key, KeyChoice::Field(_) | KeyChoice::FirstSegment) {
            return Err(
                "CSV logs carry their key in the key column: use --key client (that column) \
                 or --key global"
                    .into(),
            );
        }
        if let (Format::Clf, KeyChoice::Field(name)) = (format, &key) {
            clf_field_index(name)?;
        }
        Ok(LineParser { format, key, json })
    }

    /// The format read.
    pub(crate) fn format(&self) -> Format {
        self.format
    }

    /// Whether a CSV line is the header row, skipped.
    pub(crate) fn is_header(&self, line: &str) -> bool {
        self.format == Format::Csv && line.trim().eq_ignore_ascii_case("timestamp,key,cost")
    }

    /// Parses one line (without its line break).
    ///
    /// # Errors
    ///
    /// What is wrong with the line, for the bad-line report.
    pub(crate) fn parse<'a>(&self, line: &'a str) -> Result<Record<'a>, String> {
        match self.format {
            Format::Clf => self.clf(line),
            Format::Json => self.json(line),
            Format::Csv => self.csv(line),
        }
    }

    fn clf<'a>(&self, line: &'a str) -> Result<Record<'a>, String> {
        let mut rest = line.trim_end();
        let host = token(&mut rest).ok_or("no client address")?;
        let ident = token(&mut rest).ok_or("no ident field")?;
        let user = token(&mut rest).ok_or("no user field")?;
        let rest_t = rest.trim_start();
        let inner = rest_t.strip_prefix('[').ok_or("no [date] field")?;
        let end = inner.find(']').ok_or("unterminated [date] field")?;
        let stamp = time::parse_clf(&inner[..end])
            .ok_or_else(|| format!("bad date `{}`", &inner[..end]))?;
        rest = &inner[end + 1..];
        let request = quoted(&mut rest).ok_or("no quoted request field")?;
        let status = token(&mut rest).ok_or("no status field")?;
        if status.len() != 3 || !status.bytes().all(|b| b.is_ascii_digit()) {
            return Err(format!("bad status `{status}`"));
        }
        let bytes = token(&mut rest).ok_or("no byte count field")?;
        if bytes != "-" && !bytes.bytes().all(|b| b.is_ascii_digit()) {
            return Err(format!("bad byte count `{bytes}`"));
        }
        // The request line is `METHOD TARGET PROTOCOL`; a malformed one (nginx logs
        // `"-"` or raw bytes for some refused connections) has no method or path.
        let mut words = request.splitn(3, ' ');
        let (method, path) = match (words.next(), words.next()) {
            (Some(m), Some(target)) if !m.is_empty() => (m, strip_query(target)),
            _ => ("", ""),
        };
        let key: Cow<'a, str> = match &self.key {
            KeyChoice::Client => Cow::Borrowed(host),
            KeyChoice::Constant => Cow::Borrowed("global"),
            KeyChoice::FirstSegment => first_segment(path),
            KeyChoice::Field(name) => match name.as_str() {
                "ident" => Cow::Borrowed(ident),
                "user" => Cow::Borrowed(user),
                "host" | "client" => Cow::Borrowed(host),
                _ => {
                    let index = clf_field_index(name)?.unwrap_or(0);
                    let mut field = None;
                    for _ in 0..=index {
                        field = quoted(&mut rest);
                        if field.is_none() {
                            break;
                        }
                    }
                    field
                        .map(unescape)
                        .ok_or_else(|| format!("no `{name}` field"))?
                }
            },
        };
        Ok(Record {
            stamp,
            key,
            method: Cow::Borrowed(method),
            path: Cow::Borrowed(path),
            cost: None,
        })
    }

    fn json<'a>(&self, line: &'a str) -> Result<Record<'a>, String> {
        let value: Value =
            serde_json::from_str(line).map_err(|e| format!("not a JSON object: {e}"))?;
        if !value.is_object() {
            return Err("not a JSON object".into());
        }
        let f = &self.json;
        let time_value = lookup(&value, &f.time).ok_or_else(|| format!("no `{}` field", f.time))?;
        let stamp = match time_value {
            Value::String(s) => time::parse_any(s),
            Value::Number(n) => time::parse_epoch(&n.to_string()),
            _ => None,
        }
        .ok_or_else(|| format!("bad time in `{}`: {time_value}", f.time))?;
        let method = lookup(&value, &f.method).and_then(text).unwrap_or_default();
        let path = lookup(&value, &f.path).and_then(text).unwrap_or_default();
        let path = strip_query(&path).to_string();
        let key = match &self.key {
            KeyChoice::Client => lookup(&value, &f.client)
                .and_then(text)
                .ok_or_else(|| format!("no `{}` field", f.client))?,
            KeyChoice::Field(name) => lookup(&value, name)
                .and_then(text)
                .ok_or_else(|| format!("no `{name}` field"))?,
            KeyChoice::FirstSegment => first_segment(&path).into_owned(),
            KeyChoice::Constant => "global".to_string(),
        };
        let cost = match &f.cost {
            None => None,
            Some(name) => {
                let v = lookup(&value, name).ok_or_else(|| format!("no `{name}` field"))?;
                Some(cost_of(&text(v).unwrap_or_default())?)
            }
        };
        Ok(Record {
            stamp,
            key: Cow::Owned(key),
            method: Cow::Owned(method),
            path: Cow::Owned(path),
            cost,
        })
    }

    fn csv<'a>(&self, line: &'a str) -> Result<Record<'a>, String> {
        let fields = csv_fields(line)?;
        let [time, key, cost] = &fields[..] else {
            return Err(format!(
                "expected 3 comma-separated fields (timestamp,key,cost), got {}",
                fields.len()
            ));
        };
        let stamp = time::parse_any(time).ok_or_else(|| format!("bad timestamp `{time}`"))?;
        let cost = cost_of(cost)?;
        let key = match self.key {
            KeyChoice::Constant => Cow::Borrowed("global"),
            _ => key.clone(),
        };
        Ok(Record {
            stamp,
            key,
            method: Cow::Borrowed(""),
            path: Cow::Borrowed(""),
            cost: Some(cost),
        })
    }
}

/// Where a named CLF field is: `None` for the fields before the request (`ident`,
/// `user`, `host`), else the index of the quoted field after the byte count.
fn clf_field_index(name: &str) -> Result<Option<usize>, String> {
    match name {
        "ident" | "user" | "host" | "client" => Ok(None),
        "referer" | "referrer" => Ok(Some(0)),
        "user-agent" | "user_agent" => Ok(Some(1)),
        other => match other.strip_prefix("extra").map(str::parse::<usize>) {
            Some(Ok(n)) if n >= 1 => Ok(Some(n + 1)),
            _ => Err(format!(
                "CLF has no field `{other}`: use ident, user, referer, user-agent or extraN \
                 (N from 1, the quoted fields after the user agent)"
            )),
        },
    }
}

fn cost_of(text: &str) -> Result<u64, String> {
    match text.trim().parse::<u64>() {
        Ok(c) if (1..=MAX_COST).contains(&c) => Ok(c),
        _ => Err(format!(
            "the cost must be a whole number of tokens from 1 to {MAX_COST}, got `{text}`"
        )),
    }
}

/// A JSON field by name; a dotted name (`request.path`) walks nested objects when no
/// field has the whole name.
fn lookup<'v>(value: &'v Value, name: &str) -> Option<&'v Value> {
    if let Some(v) = value.get(name) {
        return Some(v);
    }
    let mut v = value;
    for part in name.split('.') {
        v = v.get(part)?;
    }
    Some(v)
}

/// A JSON scalar as text (strings as they are, numbers and booleans printed).
fn text(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}

/// The next space-separated token, advancing `rest` past it.
fn token<'a>(rest: &mut &'a str) -> Option<&'a str> {
    let s = rest.trim_start_matches(' ');
    if s.is_empty() {
        return None;
    }
    let end = s.find(' ').unwrap_or(s.len());
    *rest = &s[end..];
    Some(&s[..end])
}

/// The next double-quoted field (backslash escapes kept, to be undone by [`unescape`]),
/// advancing `rest` past it.
fn quoted<'a>(rest: &mut &'a str) -> Option<&'a str> {
    let s = rest.trim_start_matches(' ').strip_prefix('"')?;
    let bytes = s.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'\\' => i += 2,
            b'"' => {
                *rest = &s[i + 1..];
                return Some(&s[..i]);
            }
            _ => i += 1,
        }
    }
    None
}

/// Undoes the backslash escapes nginx and Apache write in quoted fields (`\"`, `\\`,
/// `\xHH` left as is).
fn unescape(s: &str) -> Cow<'_, str> {
    if !s.contains('\\') {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == '\\' {
            match chars.next() {
                Some(n @ ('"' | '\\')) => out.push(n),
                Some(n) => {
                    out.push('\\');
                    out.push(n);
                }
                None => out.push('\\'),
            }
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

fn strip_query(target: &str) -> &str {
    let end = target.find(['?', '#']).unwrap_or(target.len());
    &target[..end]
}

/// The first segment of a path: `api` for `/api/v1`, `/` when there is none. An
/// absolute URL (`http://host/a`, proxies' request lines) counts from its path.
pub(crate) fn first_segment(path: &str) -> Cow<'_, str> {
    let path = match path.find("://") {
        Some(i) => {
            let after = &path[i + 3..];
            after.find('/').map_or("", |j| &after[j..])
        }
        None => path,
    };
    let trimmed = path.trim_start_matches('/');
    let end = trimmed.find('/').unwrap_or(trimmed.len());
    if end == 0 {
        Cow::Borrowed("/")
    } else {
        Cow::Borrowed(&trimmed[..end])
    }
}

/// The fields of a CSV line (RFC 4180: a field in double quotes may hold commas, and
/// `""` inside it stands for one quote).
fn csv_fields(line: &str) -> Result<Vec<Cow<'_, str>>, String> {
    let mut fields = Vec::with_capacity(3);
    let mut rest = line;
    loop {
        if let Some(q) = rest.strip_prefix('"') {
            let mut value = String::new();
            let mut s = q;
            loop {
                let i = s.find('"').ok_or("unterminated quoted field")?;
                value.push_str(&s[..i]);
                s = &s[i + 1..];
                if let Some(more) = s.strip_prefix('"') {
                    value.push('"');
                    s = more;
                } else {
                    break;
                }
            }
            fields.push(Cow::Owned(value));
            match s.strip_prefix(',') {
                Some(more) => rest = more,
                None if s.trim().is_empty() => return Ok(fields),
                None => return Err("text after a closing quote".into()),
            }
        } else {
            match rest.find(',') {
                Some(i) => {
                    fields.push(Cow::Borrowed(rest[..i].trim()));
                    rest = &rest[i + 1..];
                }
                None => {
                    fields.push(Cow::Borrowed(rest.trim()));
                    return Ok(fields);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields() -> JsonFields {
        JsonFields {
            time: "time".into(),
            client: "remote_addr".into(),
            method: "method".into(),
            path: "path".into(),
            cost: None,
        }
    }

    fn parser(format: Format, key: &str) -> LineParser {
        LineParser::new(format, KeyChoice::parse(key).unwrap(), fields()).unwrap()
    }

    const T: u64 = 971_211_336_000_000_000;

    #[test]
    fn common_log_format_reads_client_time_method_and_path() {
        let line = r#"127.0.0.1 - frank [10/Oct/2000:13:55:36 -0700] "GET /apache_pb.gif?x=1 HTTP/1.0" 200 2326"#;
        let r = parser(Format::Clf, "client").parse(line).unwrap();
        assert_eq!(r.key, "127.0.0.1");
        assert_eq!(r.stamp.nanos, T);
        assert!(r.stamp.whole_second);
        assert_eq!((&*r.method, &*r.path), ("GET", "/apache_pb.gif"));
        assert_eq!(r.cost, None);
        let r = parser(Format::Clf, "field:user").parse(line).unwrap();
        assert_eq!(r.key, "frank");
    }

    #[test]
    fn missing_byte_count_and_ipv6_clients_parse() {
        let line = r#"2001:db8::ff00:42:8329 - - [10/Oct/2000:20:55:36 +0000] "HEAD /health HTTP/1.1" 304 -"#;
        let r = parser(Format::Clf, "client").parse(line).unwrap();
        assert_eq!(r.key, "2001:db8::ff00:42:8329");
        assert_eq!(r.stamp.nanos, T);
        assert_eq!(r.method, "HEAD");
    }

    #[test]
    fn combined_format_quoted_fields_keep_their_spaces() {
        let line = r#"::1 - - [10/Oct/2000:22:25:36 +0130] "POST /api/v1/export HTTP/2.0" 201 12 "https://example.com/a b" "Mozilla/5.0 (X11; \"Linux\" x86_64)" "key-7""#;
        let p = parser(Format::Clf, "field:user-agent");
        let r = p.parse(line).unwrap();
        assert_eq!(r.key, r#"Mozilla/5.0 (X11; "Linux" x86_64)"#);
        assert_eq!(r.stamp.nanos, T);
        assert_eq!(
            parser(Format::Clf, "field:referer")
                .parse(line)
                .unwrap()
                .key,
            "https://example.com/a b"
        );
        assert_eq!(
            parser(Format::Clf, "field:extra1").parse(line).unwrap().key,
            "key-7"
        );
        assert_eq!(parser(Format::Clf, "path").parse(line).unwrap().key, "api");
        assert!(
            parser(Format::Clf, "field:extra2")
                .parse(line)
                .unwrap_err()
                .contains("no `extra2` field")
        );
        let err = LineParser::new(
            Format::Clf,
            KeyChoice::parse("field:cookie").unwrap(),
            fields(),
        );
        assert!(err.unwrap_err().contains("use ident, user"));
    }

    #[test]
    fn malformed_request_lines_parse_without_method_or_path() {
        let line = r#"10.0.0.1 - - [10/Oct/2000:20:55:36 +0000] "-" 400 0 "-" "-""#;
        let r = parser(Format::Clf, "path").parse(line).unwrap();
        assert_eq!((&*r.method, &*r.path, &*r.key), ("", "", "/"));
    }

    #[test]
    fn broken_clf_lines_say_what_is_wrong() {
        for (line, why) in [
            ("", "no client address"),
            ("1.2.3.4 - - 10/Oct/2000", "no [date]"),
            ("1.2.3.4 - - [10/Oct/2000:20:55:36 +0000", "unterminated"),
            (
                "1.2.3.4 - - [10/Oct/2000:20:55:36] \"GET / HTTP/1.1\" 200 1",
                "bad date",
            ),
            (
                "1.2.3.4 - - [10/Oct/2000:20:55:36 +0000] GET / 200 1",
                "no quoted request",
            ),
            (
                "1.2.3.4 - - [10/Oct/2000:20:55:36 +0000] \"GET /",
                "no quoted request",
            ),
            (
                "1.2.3.4 - - [10/Oct/2000:20:55:36 +0000] \"GET / HTTP/1.1\" OK 1",
                "bad status",
            ),
            (
                "1.2.3.4 - - [10/Oct/2000:20:55:36 +0000] \"GET / HTTP/1.1\" 200",
                "no byte count",
            ),
            (
                "1.2.3.4 - - [10/Oct/2000:20:55:36 +0000] \"GET / HTTP/1.1\" 200 12k",
                "bad byte count",
            ),
        ] {
            let err = parser(Format::Clf, "client").parse(line).unwrap_err();
            assert!(err.contains(why), "{line:?}: {err}");
        }
    }

    #[test]
    fn json_lines_use_the_configured_field_names() {
        let line = r#"{"time":"2000-10-10T20:55:36.5Z","remote_addr":"2001:db8::1","method":"GET","path":"/search/q?x=1","user":{"id":42}}"#;
        let r = parser(Format::Json, "client").parse(line).unwrap();
        assert_eq!(r.key, "2001:db8::1");
        assert_eq!(r.stamp.nanos, T + 500_000_000);
        assert!(!r.stamp.whole_second);
        assert_eq!(r.path, "/search/q");
        assert_eq!(
            parser(Format::Json, "field:user.id")
                .parse(line)
                .unwrap()
                .key,
            "42"
        );
        assert_eq!(
            parser(Format::Json, "path").parse(line).unwrap().key,
            "search"
        );
        let epoch = r#"{"time":971211336,"remote_addr":"a"}"#;
        let r = parser(Format::Json, "client").parse(epoch).unwrap();
        assert_eq!(r.stamp.nanos, T);
        assert!(r.stamp.whole_second);
        let clf_time = r#"{"time":"10/Oct/2000:13:55:36 -0700","remote_addr":"a"}"#;
        assert_eq!(
            parser(Format::Json, "client")
                .parse(clf_time)
                .unwrap()
                .stamp
                .nanos,
            T
        );
        let mut f = fields();
        f.cost = Some("weight".into());
        let p = LineParser::new(Format::Json, KeyChoice::Client, f).unwrap();
        let costed = r#"{"time":971211336,"remote_addr":"a","weight":"7"}"#;
        assert_eq!(p.parse(costed).unwrap().cost, Some(7));
        let zero = r#"{"time":971211336,"remote_addr":"a","weight":0}"#;
        assert!(p.parse(zero).unwrap_err().contains("from 1 to"));
    }

    #[test]
    fn broken_json_lines_say_what_is_wrong() {
        for (line, why) in [
            ("{", "not a JSON object"),
            ("[1,2]", "not a JSON object"),
            (r#"{"remote_addr":"a"}"#, "no `time` field"),
            (r#"{"time":"yesterday","remote_addr":"a"}"#, "bad time"),
            (r#"{"time":971211336}"#, "no `remote_addr` field"),
        ] {
            let err = parser(Format::Json, "client").parse(line).unwrap_err();
            assert!(err.contains(why), "{line:?}: {err}");
        }
    }

    #[test]
    fn csv_lines_read_time_key_and_cost_with_quotes() {
        let p = parser(Format::Csv, "client");
        assert!(p.is_header("timestamp,key,cost"));
        assert!(!p.is_header("971211336,a,1"));
        let r = p.parse("971211336.25,tenant-1,3").unwrap();
        assert_eq!(
            (r.stamp.nanos, &*r.key, r.cost),
            (T + 250_000_000, "tenant-1", Some(3))
        );
        let r = p
            .parse(r#"2000-10-10T22:55:36+02:00,"acme, inc. ""west""",2"#)
            .unwrap();
        assert_eq!(
            (r.stamp.nanos, &*r.key, r.cost),
            (T, r#"acme, inc. "west""#, Some(2))
        );
        let r = parser(Format::Csv, "global")
            .parse("971211336,x,1")
            .unwrap();
        assert_eq!(r.key, "global");
        for (line, why) in [
            ("971211336,a", "expected 3"),
            ("971211336,a,1,2", "expected 3"),
            ("noon,a,1", "bad timestamp"),
            ("971211336,a,0", "from 1 to"),
            ("971211336,a,-1", "from 1 to"),
            ("971211336,\"a,1", "unterminated"),
            ("971211336,\"a\"b,1", "after a closing quote"),
        ] {
            let err = p.parse(line).unwrap_err();
            assert!(err.contains(why), "{line:?}: {err}");
        }
        assert!(LineParser::new(Format::Csv, KeyChoice::FirstSegment, fields()).is_err());
    }

    #[test]
    fn first_segments_ignore_scheme_host_and_slashes() {
        assert_eq!(first_segment("/api/v1/x"), "api");
        assert_eq!(first_segment("api"), "api");
        assert_eq!(first_segment("//a//b"), "a");
        assert_eq!(first_segment("/"), "/");
        assert_eq!(first_segment(""), "/");
        assert_eq!(first_segment("http://h.example/v2/x"), "v2");
        assert_eq!(first_segment("http://h.example"), "/");
    }
}
