//! Five-field cron expressions (`minute hour day-of-month month
//! day-of-week`, UTC) with `*`, lists, ranges and steps, as in crontab(5).
//! Parsed once, with errors that name the field; matched per minute.

use time::OffsetDateTime;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CronExpr {
    source: String,
    minutes: u64,
    hours: u64,
    days: u64,
    months: u64,
    weekdays: u64,
    /// crontab(5): when both day fields are restricted, either may match.
    days_restricted: bool,
    weekdays_restricted: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("cron {field}: {message}")]
pub struct CronError {
    pub field: &'static str,
    pub message: String,
}

/// The fields and their ranges: the console API's, whose OpenAPI document
/// states them as a pattern.
const FIELDS: [(&str, u32, u32); 5] = edgeloop_api::triggers::CRON_FIELDS;

/// Decimal digits only: `u32::from_str` would also take a sign (`+5`),
/// which crontab(5) does not.
fn number(text: &str) -> Option<u32> {
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse().ok()
}

fn parse_field(field: &'static str, text: &str, lo: u32, hi: u32) -> Result<u64, CronError> {
    let bad = |message: String| CronError { field, message };
    let mut bits = 0u64;
    for part in text.split(',') {
        let (range, step) = match part.split_once('/') {
            Some((r, s)) => {
                let step = number(s).ok_or_else(|| bad(format!("step {s:?} is not a number")))?;
                // A step past the field's largest value names only the start.
                if !(1..=hi).contains(&step) {
                    return Err(bad(format!("a step must be 1 to {hi}")));
                }
                (r, step)
            }
            None => (part, 1),
        };
        let (start, end) = if range == "*" {
            (lo, hi)
        } else if let Some((a, b)) = range.split_once('-') {
            let a = number(a).ok_or_else(|| bad(format!("{a:?} is not a number")))?;
            let b = number(b).ok_or_else(|| bad(format!("{b:?} is not a number")))?;
            (a, b)
        } else {
            let v = number(range)
                .ok_or_else(|| bad(format!("{range:?} is not a number, range or *")))?;
            // `5/15` means 5, 20, 35, 50.
            (v, if part.contains('/') { hi } else { v })
        };
        if start < lo || end > hi || start > end {
            return Err(bad(format!("{start}-{end} is outside {lo}-{hi}")));
        }
        let mut v = start;
        while v <= end {
            bits |= 1 << v;
            v += step;
        }
    }
    Ok(bits)
}

impl std::str::FromStr for CronExpr {
    type Err = CronError;

    fn from_str(s: &str) -> Result<CronExpr, CronError> {
        let parts: Vec<&str> = s.split_whitespace().collect();
        if parts.len() != 5 {
            return Err(CronError {
                field: "expression",
                message: format!("expected 5 fields, got {}", parts.len()),
            });
        }
        let mut masks = [0u64; 5];
        for (i, ((name, lo, hi), text)) in FIELDS.iter().zip(&parts).enumerate() {
            masks[i] = parse_field(name, text, *lo, *hi)?;
        }
        // Sunday is 0 or 7.
        if masks[4] & (1 << 7) != 0 {
            masks[4] |= 1;
        }
        Ok(CronExpr {
            source: parts.join(" "),
            minutes: masks[0],
            hours: masks[1],
            days: masks[2],
            months: masks[3],
            weekdays: masks[4],
            days_restricted: parts[2] != "*",
            weekdays_restricted: parts[4] != "*",
        })
    }
}

impl CronExpr {
    pub fn as_str(&self) -> &str {
        &self.source
    }

    /// Whether the minute containing `t` (UTC) is one the expression names.
    pub fn matches(&self, t: OffsetDateTime) -> bool {
        let t = t.to_offset(time::UtcOffset::UTC);
        let has = |mask: u64, v: u8| mask & (1 << v) != 0;
        let day = has(self.days, t.day());
        let weekday = has(self.weekdays, t.weekday().number_days_from_sunday());
        let day_ok = match (self.days_restricted, self.weekdays_restricted) {
            (true, true) => day || weekday,
            _ => day && weekday,
        };
        has(self.minutes, t.minute())
            && has(self.hours, t.hour())
            && has(self.months, u8::from(t.month()))
            && day_ok
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use time::macros::datetime;

    #[test]
    fn matching_table() {
        let cases = [
            ("* * * * *", datetime!(2026-11-30 04:43 UTC), true),
            ("0 2 * * *", datetime!(2026-11-30 02:00 UTC), true),
            ("0 2 * * *", datetime!(2026-11-30 02:01 UTC), false),
            ("*/15 * * * *", datetime!(2026-11-30 10:45 UTC), true),
            ("*/15 * * * *", datetime!(2026-11-30 10:44 UTC), false),
            ("5/15 * * * *", datetime!(2026-11-30 10:50 UTC), true),
            ("0 2-4 * * *", datetime!(2026-11-30 03:00 UTC), true),
            ("0 2,14 * * *", datetime!(2026-11-30 14:00 UTC), true),
            // 2026-11-30 is a Monday (1); Sunday is 0 or 7.
            ("0 0 * * 1", datetime!(2026-11-30 00:00 UTC), true),
            ("0 0 * * 7", datetime!(2026-11-29 00:00 UTC), true),
            ("0 0 * * 1-5", datetime!(2026-11-29 00:00 UTC), false),
            // Both day fields restricted: either matches.
            ("0 0 1 * 1", datetime!(2026-11-30 00:00 UTC), true),
            ("0 0 1 * 2", datetime!(2026-11-30 00:00 UTC), false),
            ("0 0 * 12 *", datetime!(2026-11-30 00:00 UTC), false),
        ];
        for (expr, t, want) in cases {
            let c: CronExpr = expr.parse().unwrap();
            assert_eq!(c.matches(t), want, "{expr} at {t}");
        }
    }

    #[test]
    fn errors_name_the_field() {
        let cases = [
            ("* * * *", "expression"),
            ("60 * * * *", "minute"),
            ("* 24 * * *", "hour"),
            ("* * 0 * *", "day-of-month"),
            ("* * * 13 *", "month"),
            ("* * * * 8", "day-of-week"),
            ("*/0 * * * *", "minute"),
            ("*/60 * * * *", "minute"),
            ("+5 * * * *", "minute"),
            ("* */4294967295 * * *", "hour"),
            ("5-1 * * * *", "minute"),
            ("x * * * *", "minute"),
        ];
        for (expr, field) in cases {
            let err = expr.parse::<CronExpr>().unwrap_err();
            assert_eq!(err.field, field, "{expr}: {err}");
        }
    }
}
