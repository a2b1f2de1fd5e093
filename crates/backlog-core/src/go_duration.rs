//! Go duration strings (`250ms`, `1m30s`, `1h0m0s`): the form Kubernetes users read and write.
//!
//! Parsing accepts Go's syntax and computes the value as Go's `time.ParseDuration` does (and
//! so CEL's `duration()` at admission), to the nanosecond, so the operator reads a duration as
//! the API server checked it, without depending on a Go runtime. Formatting follows Go's
//! `time.Duration.String()` with one deliberate difference: microseconds are written `us`
//! (ASCII) rather than `µs`.
//! Go's `time.ParseDuration`, CEL's `duration()` and this crate's parser all accept `us`, and
//! an ASCII-only document is easier to handle in every language.

use std::time::Duration;

use thiserror::Error;

/// The longest duration Go can represent (`math.MaxInt64` nanoseconds,
/// `2562047h47m16.854775807s`). Longer strings are refused, as Go's parser refuses them.
pub const MAX_GO_DURATION: Duration = Duration::new(9_223_372_036, 854_775_807);

const NANOS_PER_MICRO: u128 = 1_000;
const NANOS_PER_MILLI: u128 = 1_000_000;
const NANOS_PER_SECOND: u128 = 1_000_000_000;

/// Why a string is not a usable Go duration.
#[derive(Clone, Copy, Debug, Error, PartialEq, Eq)]
pub enum GoDurationError {
    /// Not of the form `[sign](number unit)+`, with units ns, us, µs, ms, s, m or h.
    #[error("not Go duration syntax (a number and a unit, repeated: 250ms, 1m30s, 2h)")]
    Malformed,
    /// A negative duration (other than `-0`).
    #[error("negative")]
    Negative,
    /// Longer than [`MAX_GO_DURATION`].
    #[error("longer than the largest Go duration, 2562047h47m16.854775807s")]
    TooLong,
}

/// Parses a Go duration string such as `250ms`, `1.5s` or `1h30m`.
///
/// Negative values are refused (nothing in a retry policy may be negative); `-0s` is zero.
///
/// ```
/// use std::time::Duration;
/// use backlog_core::go_duration::parse_go_duration;
///
/// assert_eq!(parse_go_duration("1m30s"), Ok(Duration::from_secs(90)));
/// assert_eq!(parse_go_duration("1000ms"), parse_go_duration("1s"));
/// assert!(parse_go_duration("soon").is_err());
/// ```
pub fn parse_go_duration(text: &str) -> Result<Duration, GoDurationError> {
    let magnitude = magnitude(text)?;
    if text.starts_with('-') && !magnitude.is_zero() {
        return Err(GoDurationError::Negative);
    }
    if magnitude > MAX_GO_DURATION {
        return Err(GoDurationError::TooLong);
    }
    Ok(magnitude)
}

/// The unsigned value of `[+-]?(number unit)+` or `[+-]?0`, where a number is digits with at
/// most one decimal point, computed as Go's `time.ParseDuration` computes it (and so CEL's
/// `duration()`): whole numbers exactly, fractions as `float64(f) * (unit / scale)` truncated
/// to whole nanoseconds, and fraction digits past what an `int64` holds ignored. `1ms0.6ns`
/// is then 1ms here as it is at admission, never a nanosecond more.
fn magnitude(text: &str) -> Result<Duration, GoDurationError> {
    let unsigned = text.strip_prefix(['+', '-']).unwrap_or(text);
    if unsigned == "0" {
        return Ok(Duration::ZERO);
    }
    if unsigned.is_empty() {
        return Err(GoDurationError::Malformed);
    }
    // Go's bound while adding up: 1<<63 (the sign is applied after).
    const BOUND: u64 = 1 << 63;
    let mut rest = unsigned.as_bytes();
    let mut total: u64 = 0;
    while !rest.is_empty() {
        let (whole, after_whole, whole_digits) = leading_int(rest)?;
        let mut fraction = (0_u64, 1.0_f64, 0_usize);
        let mut after_number = after_whole;
        if let Some((b'.', after_point)) = after_whole.split_first() {
            let (digits, scale, after_fraction, count) = leading_fraction(after_point);
            fraction = (digits, scale, count);
            after_number = after_fraction;
        }
        if whole_digits == 0 && fraction.2 == 0 {
            return Err(GoDurationError::Malformed);
        }
        let unit_end = after_number
            .iter()
            .position(|b| *b == b'.' || b.is_ascii_digit())
            .unwrap_or(after_number.len());
        let (unit, after_unit) = after_number.split_at(unit_end);
        let unit_nanos: u64 = match unit {
            b"ns" => 1,
            // `µs` (U+00B5) and `μs` (U+03BC) in UTF-8, as Go accepts them.
            b"us" | b"\xc2\xb5s" | b"\xce\xbcs" => 1_000,
            b"ms" => 1_000_000,
            b"s" => 1_000_000_000,
            b"m" => 60_000_000_000,
            b"h" => 3_600_000_000_000,
            _ => return Err(GoDurationError::Malformed),
        };
        if whole > BOUND / unit_nanos {
            return Err(GoDurationError::TooLong);
        }
        let mut value = whole * unit_nanos;
        let (digits, scale, _) = fraction;
        if digits > 0 {
            // At most 3.6e12 (an hour of nanoseconds), so the cast cannot saturate.
            value += (digits as f64 * (unit_nanos as f64 / scale)) as u64;
            if value > BOUND {
                return Err(GoDurationError::TooLong);
            }
        }
        total = total
            .checked_add(value)
            .filter(|sum| *sum <= BOUND)
            .ok_or(GoDurationError::TooLong)?;
        rest = after_unit;
    }
    Ok(Duration::from_nanos(total))
}

/// Go's `leadingInt`: the leading digits as a number (refused when it overflows 1<<63), the
/// rest, and how many digits there were.
fn leading_int(text: &[u8]) -> Result<(u64, &[u8], usize), GoDurationError> {
    let count = text.iter().take_while(|b| b.is_ascii_digit()).count();
    let mut value: u64 = 0;
    for digit in &text[..count] {
        if value > (1 << 63) / 10 {
            return Err(GoDurationError::TooLong);
        }
        value = value * 10 + u64::from(digit - b'0');
        if value > 1 << 63 {
            return Err(GoDurationError::TooLong);
        }
    }
    Ok((value, &text[count..], count))
}

/// Go's `leadingFraction`: the leading digits as a number with its scale (digits past the
/// point where the number would overflow are consumed but not counted), the rest, and how many digits there were.
fn leading_fraction(text: &[u8]) -> (u64, f64, &[u8], usize) {
    let count = text.iter().take_while(|b| b.is_ascii_digit()).count();
    let mut value: u64 = 0;
    let mut scale = 1.0_f64;
    let mut overflowed = false;
    for digit in &text[..count] {
        if overflowed {
            continue;
        }
        if value > (i64::MAX as u64) / 10 {
            overflowed = true;
            continue;
        }
        let next = value * 10 + u64::from(digit - b'0');
        if next > 1 << 63 {
            overflowed = true;
            continue;
        }
        value = next;
        scale *= 10.0;
    }
    (value, scale, &text[count..], count)
}

/// Formats a duration the way Go's `time.Duration.String()` does, except that microseconds
/// are written `us`: `0s`, `750ns`, `1.5us`, `100ms`, `1.5s`, `2m30s`, `1h0m0s`.
///
/// The output parses back to the same duration with [`parse_go_duration`], with Go's
/// `time.ParseDuration` and with CEL's `duration()`.
///
/// ```
/// use std::time::Duration;
/// use backlog_core::go_duration::format_go_duration;
///
/// assert_eq!(format_go_duration(Duration::from_millis(1500)), "1.5s");
/// assert_eq!(format_go_duration(Duration::from_millis(100)), "100ms");
/// assert_eq!(format_go_duration(Duration::from_secs(150)), "2m30s");
/// assert_eq!(format_go_duration(Duration::from_secs(3600)), "1h0m0s");
/// ```
pub fn format_go_duration(duration: Duration) -> String {
    let nanos = duration.as_nanos();
    if nanos == 0 {
        return "0s".to_owned();
    }
    if nanos < NANOS_PER_MICRO {
        return format!("{nanos}ns");
    }
    if nanos < NANOS_PER_MILLI {
        return format!("{}us", decimal(nanos, NANOS_PER_MICRO, 3));
    }
    if nanos < NANOS_PER_SECOND {
        return format!("{}ms", decimal(nanos, NANOS_PER_MILLI, 6));
    }
    let whole_seconds = nanos / NANOS_PER_SECOND;
    let hours = whole_seconds / 3600;
    let minutes = whole_seconds / 60 % 60;
    let seconds_nanos = nanos % (60 * NANOS_PER_SECOND);
    let seconds = decimal(seconds_nanos, NANOS_PER_SECOND, 9);
    match (hours, minutes) {
        (0, 0) => format!("{seconds}s"),
        (0, minutes) => format!("{minutes}m{seconds}s"),
        (hours, minutes) => format!("{hours}h{minutes}m{seconds}s"),
    }
}

/// `value / unit` as a decimal with trailing zeros (and a bare point) removed, where `unit` is
/// `10^fraction_digits`.
fn decimal(value: u128, unit: u128, fraction_digits: usize) -> String {
    let whole = value / unit;
    let fraction = value % unit;
    if fraction == 0 {
        return whole.to_string();
    }
    let digits = format!("{fraction:0fraction_digits$}");
    format!("{whole}.{}", digits.trim_end_matches('0'))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn parses_go_syntax() {
        assert_eq!(parse_go_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_go_duration("1h30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_go_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_go_duration("300ms"), Ok(Duration::from_millis(300)));
        assert_eq!(parse_go_duration("10us"), Ok(Duration::from_micros(10)));
        assert_eq!(parse_go_duration("10µs"), Ok(Duration::from_micros(10)));
        assert_eq!(parse_go_duration("0"), Ok(Duration::ZERO));
        assert_eq!(parse_go_duration("-0s"), Ok(Duration::ZERO));
        assert_eq!(parse_go_duration("+2s"), Ok(Duration::from_secs(2)));
    }

    #[test]
    fn refuses_what_go_refuses() {
        for text in [
            "", "5", "s", "abc", "1.2.3s", "5 s", "5sec", "1e3s", "+-5s", ".s",
        ] {
            assert_eq!(
                parse_go_duration(text),
                Err(GoDurationError::Malformed),
                "{text:?}"
            );
        }
        assert_eq!(parse_go_duration("-5s"), Err(GoDurationError::Negative));
    }

    #[test]
    fn refuses_huge_values_without_panicking() {
        for text in [
            "99999999999999999999999h",
            "2562048h",
            "9300000000000000000ns",
            "2562047h2562047h",
        ] {
            assert_eq!(
                parse_go_duration(text),
                Err(GoDurationError::TooLong),
                "{text:?}"
            );
        }
        assert_eq!(
            parse_go_duration("2562047h47m16.854775807s"),
            Ok(MAX_GO_DURATION)
        );
    }

    /// What Go 1.26's `time.ParseDuration` returns (nanoseconds; `None`: refused). Fractions
    /// are truncated, digits past an int64 ignored, and the largest value is accepted.
    #[test]
    fn agrees_with_go_to_the_nanosecond() {
        let cases: [(&str, Option<u64>); 15] = [
            ("1ms0.6ns", Some(1_000_000)),
            ("0.6ns", Some(0)),
            ("1.9999999999ns", Some(1)),
            ("0.333333333333h", Some(1_199_999_999_998)),
            ("0.0000000001h", Some(360)),
            ("0.0000000009s", Some(0)),
            ("1.0000000009s", Some(1_000_000_000)),
            ("59.999999999999m", Some(3_599_999_999_999)),
            (".81ns1\u{03bc}s", Some(1_000)),
            (".139099603082462819\u{00b5}s", Some(139)),
            ("1.00000000000000000000000001s", Some(1_000_000_000)),
            ("3.7000000000000000000000009m", Some(222_000_000_000)),
            ("0.99999999999999999999h", Some(3_600_000_000_000)),
            ("9223372036854775807ns", Some(9_223_372_036_854_775_807)),
            ("9223372036854775808ns", None),
        ];
        for (text, nanos) in cases {
            assert_eq!(
                parse_go_duration(text).ok(),
                nanos.map(Duration::from_nanos),
                "{text:?}"
            );
        }
    }

    #[test]
    fn formats_like_go() {
        let cases = [
            (Duration::ZERO, "0s"),
            (Duration::from_nanos(750), "750ns"),
            (Duration::from_nanos(1_500), "1.5us"),
            (Duration::from_millis(100), "100ms"),
            (Duration::from_micros(1_250), "1.25ms"),
            (Duration::from_millis(1_500), "1.5s"),
            (Duration::from_secs(1), "1s"),
            (Duration::from_secs(59), "59s"),
            (Duration::from_secs(60), "1m0s"),
            (Duration::from_secs(150), "2m30s"),
            (Duration::from_secs(3600), "1h0m0s"),
            (Duration::from_millis(3_600_500), "1h0m0.5s"),
            (MAX_GO_DURATION, "2562047h47m16.854775807s"),
        ];
        for (duration, text) in cases {
            assert_eq!(format_go_duration(duration), text);
        }
    }

    proptest! {
        #[test]
        fn formatting_then_parsing_is_the_identity(
            nanos in prop_oneof![0u64..1_000_000_000, 0..=MAX_GO_DURATION.as_nanos() as u64],
        ) {
            let duration = Duration::from_nanos(nanos);
            prop_assert_eq!(parse_go_duration(&format_go_duration(duration)), Ok(duration));
        }

        #[test]
        fn whole_milliseconds_round_trip(millis in 0u64..86_400_000) {
            let duration = Duration::from_millis(millis);
            prop_assert_eq!(parse_go_duration(&format_go_duration(duration)), Ok(duration));
        }

        #[test]
        fn never_panics(text in "[-+0-9.a-zµ]{0,24}") {
            let _ = parse_go_duration(&text);
        }
    }
}
