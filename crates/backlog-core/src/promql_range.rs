//! The window a rate query averages over, read from its PromQL (pure).
//!
//! A rate read through `rate(…[5m])` lags a change for five minutes; one read through
//! `rate(…[5s])` for five seconds. The decision waits a window after a change of replicas
//! before it trusts a completion rate as capacity, so it has to know which window the
//! user's query spans: taken from the query itself, instead of assuming a typical one.

/// Seconds of the longest range selector (`[5m]`) or subquery range (`[30m:1m]`) in `expr`;
/// `None` when it has none (a recording rule's name, an instant vector).
///
/// Brackets inside string literals (a label value such as `"a[1m]"`) or comments (`# was
/// [1h]`) and brackets that do not hold a duration are not ranges. A duration is Prometheus'
/// syntax: one or more `<number><unit>` with units `ms`, `s`, `m`, `h`, `d`, `w`, `y`, or a
/// number of seconds.
pub fn longest_range_seconds(expr: &str) -> Option<f64> {
    let mut longest: Option<f64> = None;
    let mut quote: Option<char> = None;
    let mut escaped = false;
    let mut comment = false;
    for (at, c) in expr.char_indices() {
        // A `#` outside a string comments out the rest of its line: a range there is none.
        if comment {
            comment = c != '\n';
            continue;
        }
        if let Some(open) = quote {
            // Backticks are raw strings in PromQL: no escapes inside them.
            if escaped {
                escaped = false;
            } else if c == '\\' && open != '`' {
                escaped = true;
            } else if c == open {
                quote = None;
            }
            continue;
        }
        match c {
            '"' | '\'' | '`' => quote = Some(c),
            '#' => comment = true,
            '[' => {
                let rest = &expr[at + 1..];
                let Some(close) = rest.find(']') else {
                    return longest;
                };
                let inside = &rest[..close];
                // A subquery `[range:resolution]` averages over its range.
                let range = inside.split(':').next().unwrap_or(inside);
                if let Some(seconds) = prometheus_duration_seconds(range.trim()) {
                    longest = Some(longest.map_or(seconds, |l| l.max(seconds)));
                }
            }
            _ => {}
        }
    }
    longest
}

/// Seconds of a Prometheus duration (`1h30m`, `5m`, `250ms`, or `300` seconds); `None` when
/// `text` is not one or is zero.
fn prometheus_duration_seconds(text: &str) -> Option<f64> {
    if text.is_empty() {
        return None;
    }
    if let Ok(seconds) = text.parse::<f64>() {
        return (seconds.is_finite() && seconds > 0.0).then_some(seconds);
    }
    let mut rest = text;
    let mut total = 0.0;
    while !rest.is_empty() {
        let digits = rest.find(|c: char| !c.is_ascii_digit())?;
        if digits == 0 {
            return None;
        }
        let number: f64 = rest[..digits].parse().ok()?;
        let after = &rest[digits..];
        let (unit_seconds, unit_len) = if after.starts_with("ms") {
            (0.001, 2)
        } else {
            let unit = match after.chars().next()? {
                's' => 1.0,
                'm' => 60.0,
                'h' => 3600.0,
                'd' => 86_400.0,
                'w' => 7.0 * 86_400.0,
                'y' => 365.0 * 86_400.0,
                _ => return None,
            };
            (unit, 1)
        };
        total += number * unit_seconds;
        rest = &after[unit_len..];
    }
    (total.is_finite() && total > 0.0).then_some(total)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn a_rate_query_spans_its_range() {
        let expr = r#"sum(rate(consumer_events_completed_total{consumer="orders"}[5m]))"#;
        assert_eq!(longest_range_seconds(expr), Some(300.0));
        assert_eq!(longest_range_seconds("rate(x[5s])"), Some(5.0));
        assert_eq!(longest_range_seconds("rate(x[1h30m])"), Some(5400.0));
        assert_eq!(longest_range_seconds("rate(x[250ms])"), Some(0.25));
        assert_eq!(longest_range_seconds("rate(x[90])"), Some(90.0));
    }

    #[test]
    fn the_longest_of_several_ranges_is_the_window() {
        let expr = "sum(rate(a[1m])) + sum(increase(b[2m])) / 120";
        assert_eq!(longest_range_seconds(expr), Some(120.0));
    }

    #[test]
    fn a_subquery_spans_its_range_not_its_resolution() {
        assert_eq!(
            longest_range_seconds("max_over_time(rate(x[1m])[10m:30s])"),
            Some(600.0)
        );
        assert_eq!(longest_range_seconds("avg_over_time(x[5m:])"), Some(300.0));
    }

    #[test]
    fn brackets_in_label_values_are_not_ranges() {
        assert_eq!(
            longest_range_seconds(r#"sum(rate(x{path="/a[10m]", q='[1h]', r=`[2h]`}[30s]))"#),
            Some(30.0)
        );
        assert_eq!(
            longest_range_seconds(r#"sum(x{path="quote \" then [10m]"})"#),
            None
        );
    }

    #[test]
    fn brackets_in_comments_are_not_ranges() {
        assert_eq!(
            longest_range_seconds("sum(rate(done[1m])) # was [1h] before the recording rule"),
            Some(60.0)
        );
        // A comment ends with its line; a `#` inside a string starts none.
        assert_eq!(
            longest_range_seconds("sum(rate(a[1m])) # [1h]\n+ sum(rate(b{x=\"#\"}[2m]))"),
            Some(120.0)
        );
    }

    #[test]
    fn a_query_without_a_range_has_no_window() {
        assert_eq!(longest_range_seconds("job:events_completed:rate5m"), None);
        assert_eq!(longest_range_seconds("sum(x) [ oops"), None);
        assert_eq!(longest_range_seconds("x[]"), None);
        assert_eq!(longest_range_seconds("x[5parsecs]"), None);
        assert_eq!(longest_range_seconds("x[0s]"), None);
    }

    proptest! {
        #[test]
        fn any_written_range_is_read_back(
            hours in 0u32..48, minutes in 0u32..60, seconds in 0u32..60,
            label in "[a-z\\[\\]:0-9]{0,12}",
        ) {
            prop_assume!(hours + minutes + seconds > 0);
            let mut range = String::new();
            for (value, unit) in [(hours, "h"), (minutes, "m"), (seconds, "s")] {
                if value > 0 {
                    range.push_str(&format!("{value}{unit}"));
                }
            }
            let expr = format!("sum(rate(x{{l=\"{label}\"}}[{range}]))");
            let expected = f64::from(hours * 3600 + minutes * 60 + seconds);
            prop_assert_eq!(longest_range_seconds(&expr), Some(expected));
        }

        #[test]
        fn no_text_makes_it_panic(expr in "\\PC{0,64}") {
            let _ = longest_range_seconds(&expr);
        }
    }
}
