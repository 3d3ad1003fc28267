//! Human output shared by the server commands: aligned tables, `key: value`
//! blocks, and JSON fields shown as plain text. Every command renders to a
//! `String` so that tests can read what a person would see.

use serde_json::Value;

/// Columns padded to their widest cell, two spaces apart; trailing blanks
/// trimmed so that lines compare cleanly.
pub struct Table {
    header: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl Table {
    pub fn new(header: &[&str]) -> Table {
        Table {
            header: header.iter().map(|h| h.to_string()).collect(),
            rows: vec![],
        }
    }

    /// A row; missing cells are blank and extra cells are dropped, so a
    /// row can never shift the columns after it.
    pub fn row(&mut self, cells: Vec<String>) -> &mut Table {
        let mut cells = cells;
        cells.resize(self.header.len(), String::new());
        self.rows.push(cells);
        self
    }

    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    pub fn render(&self) -> String {
        let mut widths: Vec<usize> = self.header.iter().map(|h| width(h)).collect();
        for r in &self.rows {
            for (w, c) in widths.iter_mut().zip(r) {
                *w = (*w).max(width(c));
            }
        }
        let mut out = String::new();
        for r in std::iter::once(&self.header).chain(&self.rows) {
            let cells: Vec<String> = r
                .iter()
                .zip(&widths)
                .map(|(c, &w)| format!("{c}{}", " ".repeat(w - width(c))))
                .collect();
            out.push_str(cells.join("  ").trim_end());
            out.push('\n');
        }
        out
    }
}

/// Characters, not bytes: labels and messages may hold non-ASCII text, and
/// padding by bytes would misalign them.
fn width(s: &str) -> usize {
    s.chars().count()
}

/// `key:  value` lines with the values aligned.
pub fn fields(pairs: &[(&str, String)]) -> String {
    let w = pairs.iter().map(|(k, _)| k.len() + 1).max().unwrap_or(0);
    let mut out = String::new();
    for (k, v) in pairs {
        let line = format!("{:<w$}  {v}", format!("{k}:"));
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// A value as a person reads it in a table cell: strings unquoted, absent,
/// null or empty as `-`, lists comma-separated, maps as `k=v` pairs,
/// numbers as JSON writes them. Implemented for the views' field types, so
/// a command reads typed fields (`text(&job.step)`) and a renamed field
/// fails to compile.
pub trait Cell {
    fn cell(&self) -> String;
}

pub fn text<T: Cell + ?Sized>(v: &T) -> String {
    v.cell()
}

impl Cell for str {
    fn cell(&self) -> String {
        if self.is_empty() {
            "-".into()
        } else {
            self.to_string()
        }
    }
}

impl Cell for String {
    fn cell(&self) -> String {
        self.as_str().cell()
    }
}

impl Cell for bool {
    fn cell(&self) -> String {
        if *self { "yes" } else { "no" }.into()
    }
}

macro_rules! integer_cells {
    ($($t:ty),*) => {$(
        impl Cell for $t {
            fn cell(&self) -> String {
                self.to_string()
            }
        }
    )*};
}
integer_cells!(u8, u16, u32, u64, usize, i32, i64);

impl Cell for f64 {
    /// As JSON writes it (`1.0`, not `1`), so a typed cell reads as the
    /// server's JSON did.
    fn cell(&self) -> String {
        serde_json::Number::from_f64(*self).map_or_else(|| "-".into(), |n| n.to_string())
    }
}

impl<T: Cell> Cell for Option<T> {
    fn cell(&self) -> String {
        self.as_ref().map_or_else(|| "-".into(), Cell::cell)
    }
}

impl<T: Cell> Cell for [T] {
    fn cell(&self) -> String {
        if self.is_empty() {
            return "-".into();
        }
        self.iter().map(Cell::cell).collect::<Vec<_>>().join(",")
    }
}

impl<T: Cell> Cell for Vec<T> {
    fn cell(&self) -> String {
        self.as_slice().cell()
    }
}

impl<V: Cell> Cell for std::collections::BTreeMap<String, V> {
    fn cell(&self) -> String {
        if self.is_empty() {
            return "-".into();
        }
        self.iter()
            .map(|(k, v)| format!("{k}={}", v.cell()))
            .collect::<Vec<_>>()
            .join(",")
    }
}

impl Cell for edgeloop_models::Digest {
    fn cell(&self) -> String {
        self.to_string()
    }
}

impl Cell for time::OffsetDateTime {
    fn cell(&self) -> String {
        self.format(&time::format_description::well_known::Rfc3339)
            .unwrap_or_else(|_| "-".into())
    }
}

/// Free-form parts of a view (metrics, hyperparameters, evidence).
impl Cell for Value {
    fn cell(&self) -> String {
        match self {
            Value::Null => "-".into(),
            Value::String(s) => s.cell(),
            Value::Bool(b) => b.cell(),
            Value::Number(n) => n.to_string(),
            Value::Array(a) => a.cell(),
            Value::Object(o) if o.is_empty() => "-".into(),
            Value::Object(o) => o
                .iter()
                .map(|(k, v)| format!("{k}={}", v.cell()))
                .collect::<Vec<_>>()
                .join(","),
        }
    }
}

/// A time to the second: the nanoseconds the server keeps would make
/// every time column 10 characters wider.
pub trait When {
    fn when(&self) -> String;
}

pub fn when<T: When + ?Sized>(v: &T) -> String {
    v.when()
}

impl When for time::OffsetDateTime {
    fn when(&self) -> String {
        self.replace_nanosecond(0).unwrap_or(*self).cell()
    }
}

impl<T: When> When for Option<T> {
    fn when(&self) -> String {
        self.as_ref().map_or_else(|| "-".into(), When::when)
    }
}

/// An RFC 3339 string to the second; anything else as `text` shows it.
impl When for Value {
    fn when(&self) -> String {
        use time::format_description::well_known::Rfc3339;
        self.as_str()
            .and_then(|s| time::OffsetDateTime::parse(s, &Rfc3339).ok())
            .map_or_else(|| self.cell(), |t| t.when())
    }
}

/// Unix seconds as RFC 3339 (UTC), as the rest of the API writes times.
pub fn unix_time(v: &Value) -> String {
    use time::format_description::well_known::Rfc3339;
    v.as_i64()
        .and_then(|s| time::OffsetDateTime::from_unix_timestamp(s).ok())
        .and_then(|t| t.format(&Rfc3339).ok())
        .unwrap_or_else(|| "-".into())
}

/// Seconds as a person reads a duration: `42s`, `3m05s`, `2h07m`, `3d04h`
/// (the two largest units; a negative span, from clock skew, as `0s`).
pub fn duration(seconds: i64) -> String {
    let s = seconds.max(0);
    match s {
        0..=59 => format!("{s}s"),
        60..=3599 => format!("{}m{:02}s", s / 60, s % 60),
        3600..=86_399 => format!("{}h{:02}m", s / 3600, s % 3600 / 60),
        _ => format!("{}d{:02}h", s / 86_400, s % 86_400 / 3600),
    }
}

/// A number with `digits` decimals, or `-` when it is absent.
pub fn num(v: &Value, digits: usize) -> String {
    fixed(v.as_f64(), digits)
}

/// A typed number with `digits` decimals, or `-` when it is absent.
pub fn fixed(v: impl Into<Option<f64>>, digits: usize) -> String {
    match v.into() {
        Some(x) => format!("{x:.digits$}"),
        None => "-".into(),
    }
}

/// A `sha256:<hex>` digest shortened to what a person compares by eye.
pub fn short_digest(v: &Value) -> String {
    match v.as_str() {
        Some(d) => {
            let hex = d.strip_prefix("sha256:").unwrap_or(d);
            hex.chars().take(12).collect()
        }
        None => "-".into(),
    }
}

/// A byte count in binary units.
pub fn bytes(v: &Value) -> String {
    let Some(n) = v.as_u64() else {
        return "-".into();
    };
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut x = n as f64;
    let mut unit = 0;
    while x >= 1024.0 && unit < UNITS.len() - 1 {
        x /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{n} B")
    } else {
        format!("{x:.1} {}", UNITS[unit])
    }
}

/// At most `max` characters, with `…` when cut (long messages would push
/// every other column off the screen).
pub fn clip(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        return s.to_string();
    }
    let mut out: String = s.chars().take(max.saturating_sub(1)).collect();
    out.push('…');
    out
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn columns_align_and_rows_keep_their_shape() {
        let mut t = Table::new(&["NAME", "STATE", "NOTE"]);
        t.row(vec!["digits".into(), "ok".into(), "".into()]);
        t.row(vec![
            "a".into(),
            "failed".into(),
            "x".into(),
            "dropped".into(),
        ]);
        t.row(vec!["ünï".into()]);
        let out = t.render();
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), 4);
        assert_eq!(lines[0], "NAME    STATE   NOTE");
        assert_eq!(lines[1], "digits  ok");
        assert_eq!(lines[2], "a       failed  x");
        assert_eq!(lines[3], "ünï");
    }

    #[test]
    fn values_read_as_text() {
        let cases = [
            (json!(null), "-"),
            (json!(""), "-"),
            (json!("abc"), "abc"),
            (json!(true), "yes"),
            (json!(3), "3"),
            (json!(["a", "b"]), "a,b"),
            (json!({"site": "lab", "n": 2}), "n=2,site=lab"),
            (json!({}), "-"),
        ];
        for (v, want) in cases {
            assert_eq!(text(&v), want, "{v}");
        }
        assert_eq!(
            when(&json!("2026-11-30T06:00:43.102871114Z")),
            "2026-11-30T06:00:43Z"
        );
        assert_eq!(
            when(&json!("2026-11-30T06:00:43+01:00")),
            "2026-11-30T06:00:43+01:00"
        );
        assert_eq!(when(&json!(null)), "-");
        assert_eq!(when(&json!("not a time")), "not a time");
        assert_eq!(num(&json!(0.123456), 3), "0.123");
        assert_eq!(num(&json!(null), 3), "-");
        assert_eq!(
            short_digest(&json!(format!("sha256:{}", "ab".repeat(32)))),
            "abababababab"
        );
        assert_eq!(bytes(&json!(512)), "512 B");
        assert_eq!(bytes(&json!(3 * 1024 * 1024 + 1)), "3.0 MiB");
        assert_eq!(clip("abcdef", 4), "abc…");
        assert_eq!(clip("abc", 4), "abc");
        assert_eq!(unix_time(&json!(1_796_083_200)), "2026-12-01T00:00:00Z");
        assert_eq!(unix_time(&json!(null)), "-");
        for (secs, want) in [
            (-5, "0s"),
            (0, "0s"),
            (59, "59s"),
            (65, "1m05s"),
            (3600, "1h00m"),
            (7620, "2h07m"),
            (3 * 86_400 + 4 * 3600 + 59, "3d04h"),
        ] {
            assert_eq!(duration(secs), want, "{secs}");
        }
    }

    #[test]
    fn fields_align_values() {
        let out = fields(&[
            ("id", "j-1".into()),
            ("state", "running".into()),
            ("x", "".into()),
        ]);
        assert_eq!(out, "id:     j-1\nstate:  running\nx:\n");
    }
}
