//! Parsing the Go-style duration strings of the API into seconds.

use thiserror::Error;

/// A duration field that does not hold a usable duration.
#[derive(Clone, Debug, Error, PartialEq, Eq)]
pub enum DurationError {
    #[error("spec.{field} {value:?} is not a duration: use Go syntax such as 250ms, 30s or 5m")]
    Unparsable { field: String, value: String },
    #[error("spec.{field} {value:?} must be positive")]
    NotPositive { field: String, value: String },
}

/// Seconds of a non-negative Go duration string.
pub fn non_negative_seconds(field: &str, value: &str) -> Result<f64, DurationError> {
    // The consumer library's parser checks syntax and magnitude before converting, so no
    // input (however long its digits) can make the conversion overflow.
    crate::go_duration::parse_go_duration(value)
        .map(|duration| duration.as_secs_f64())
        .map_err(|_| DurationError::Unparsable {
            field: field.to_owned(),
            value: value.to_owned(),
        })
}

/// Seconds of a positive Go duration string.
pub fn positive_seconds(field: &str, value: &str) -> Result<f64, DurationError> {
    let seconds = non_negative_seconds(field, value)?;
    if seconds <= 0.0 {
        return Err(DurationError::NotPositive {
            field: field.to_owned(),
            value: value.to_owned(),
        });
    }
    Ok(seconds)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_go_durations() {
        assert_eq!(positive_seconds("x", "250ms"), Ok(0.25));
        assert_eq!(positive_seconds("x", "1h30m"), Ok(5400.0));
        assert_eq!(non_negative_seconds("x", "0s"), Ok(0.0));
    }

    #[test]
    fn refuses_with_the_field_name() {
        let error = positive_seconds("scaling.targetDrainTime", "soon").unwrap_err();
        assert!(error.to_string().contains("spec.scaling.targetDrainTime"));
        assert!(positive_seconds("x", "0s").is_err());
        assert!(non_negative_seconds("x", "-5s").is_err());
        assert!(non_negative_seconds("x", "99999999999999999999h").is_err());
    }
}
