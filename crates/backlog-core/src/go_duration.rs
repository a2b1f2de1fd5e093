//! Go duration strings (`250ms`, `1m30s`, `1h0m0s`): the form Kubernetes users read and write.
//!
//! Parsing accepts Go's syntax and computes the value as kube-rs does (each component is its
//! unit times the number as an `f64`), so the operator accepts exactly what the rest of the
//! Kubernetes tool chain accepts, without depending on a Kubernetes client. Formatting follows Go's `time.Duration.String()`
//! with one deliberate difference: microseconds are written `us` (ASCII) rather than `µs`.
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
/// most one decimal point. Refuses any string whose value could exceed [`MAX_GO_DURATION`]
/// before adding it up: `Duration::mul_f64` panics when a product overflows, so the bound
/// keeps every input panic-free.
fn magnitude(text: &str) -> Result<Duration, GoDurationError> {
    let unsigned = text.strip_prefix(['+', '-']).unwrap_or(text);
    if unsigned == "0" {
        return Ok(Duration::ZERO);
    }
    if unsigned.is_empty() {
        return Err(GoDurationError::Malformed);
    }
    let mut rest = unsigned;
    let mut total_nanos = 0.0_f64;
    let mut total = Duration::ZERO;
    while !rest.is_empty() {
        let number_end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or(GoDurationError::Malformed)?;
        let (number, after_number) = rest.split_at(number_end);
        let has_digit = number.chars().any(|c| c.is_ascii_digit());
        if !has_digit || number.matches('.').count() > 1 {
            return Err(GoDurationError::Malformed);
        }
        let unit_end = after_number
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(after_number.len());
        let (unit, after_unit) = after_number.split_at(unit_end);
        let (unit_nanos, unit_duration) = match unit {
            "ns" => (1.0, Duration::from_nanos(1)),
            "us" | "\u{00b5}s" | "\u{03bc}s" => (1e3, Duration::from_micros(1)),
            "ms" => (1e6, Duration::from_millis(1)),
            "s" => (1e9, Duration::from_secs(1)),
            "m" => (60e9, Duration::from_secs(60)),
            "h" => (3600e9, Duration::from_secs(3600)),
            _ => return Err(GoDurationError::Malformed),
        };
        let value: f64 = number.parse().map_err(|_| GoDurationError::Malformed)?;
        total_nanos += value * unit_nanos;
        // Not exact near the limit, but a generous bound: it only has to keep the parser
        // away from overflow; the exact limit is checked on the parsed value.
        if total_nanos > 2.0 * MAX_GO_DURATION.as_nanos() as f64 {
            return Err(GoDurationError::TooLong);
        }
        total += unit_duration.mul_f64(value);
        rest = after_unit;
    }
    Ok(total)
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
