//! Turning a query's raw result into a usable number, or a precise reason why not.
//!
//! An empty result is missing data, never zero: KEDA's habit of reading an empty or failed
//! query as 0 scales consumers down in the middle of an incident.

use std::fmt;

/// What a PromQL query returned, before any interpretation.
#[derive(Clone, Debug, PartialEq)]
pub enum Observation {
    /// The sample values of an instant vector or scalar (one per series).
    Samples(Vec<f64>),
    /// The query could not be evaluated (unreachable server, timeout, PromQL error).
    Failed(String),
}

/// Why a query's result cannot be used.
#[derive(Clone, Debug, PartialEq)]
pub enum MetricProblem {
    Empty,
    MultipleSeries(usize),
    NotFinite(f64),
    Negative(f64),
    QueryFailed(String),
    /// The value cannot be known yet, for the reason given.
    Unavailable(String),
}

impl fmt::Display for MetricProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MetricProblem::Empty => write!(
                f,
                "returned no sample (missing data is never read as 0; check the series exist)"
            ),
            MetricProblem::MultipleSeries(n) => write!(
                f,
                "returned {n} series; it must return exactly one (aggregate it, e.g. with sum or max)"
            ),
            MetricProblem::NotFinite(v) => write!(f, "returned {v}, which is not a finite number"),
            MetricProblem::Negative(v) => write!(f, "returned {v}; it must not be negative"),
            MetricProblem::QueryFailed(reason) => write!(f, "failed: {reason}"),
            MetricProblem::Unavailable(reason) => write!(f, "{reason}"),
        }
    }
}

/// The single finite, non-negative value of an observation.
pub fn single_value(observation: &Observation) -> Result<f64, MetricProblem> {
    match observation {
        Observation::Failed(reason) => Err(MetricProblem::QueryFailed(reason.clone())),
        Observation::Samples(samples) => match samples.as_slice() {
            [] => Err(MetricProblem::Empty),
            [value] if !value.is_finite() => Err(MetricProblem::NotFinite(*value)),
            [value] if *value < 0.0 => Err(MetricProblem::Negative(*value)),
            [value] => Ok(*value),
            many => Err(MetricProblem::MultipleSeries(many.len())),
        },
    }
}

/// A query's problem, naming the field it came from (e.g. `metrics.backlog`).
#[derive(Clone, Debug, PartialEq)]
pub struct MissingInput {
    pub field: String,
    pub problem: MetricProblem,
}

impl fmt::Display for MissingInput {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "spec.{} {}", self.field, self.problem)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_one_finite_non_negative_sample_is_a_value() {
        assert_eq!(single_value(&Observation::Samples(vec![3.0])), Ok(3.0));
        assert_eq!(single_value(&Observation::Samples(vec![0.0])), Ok(0.0));
        assert_eq!(
            single_value(&Observation::Samples(vec![])),
            Err(MetricProblem::Empty)
        );
        assert_eq!(
            single_value(&Observation::Samples(vec![1.0, 2.0])),
            Err(MetricProblem::MultipleSeries(2))
        );
        assert!(matches!(
            single_value(&Observation::Samples(vec![f64::NAN])),
            Err(MetricProblem::NotFinite(_))
        ));
        assert_eq!(
            single_value(&Observation::Samples(vec![f64::INFINITY])),
            Err(MetricProblem::NotFinite(f64::INFINITY))
        );
        assert_eq!(
            single_value(&Observation::Samples(vec![-1.0])),
            Err(MetricProblem::Negative(-1.0))
        );
        assert_eq!(
            single_value(&Observation::Failed("timeout".into())),
            Err(MetricProblem::QueryFailed("timeout".into()))
        );
    }

    #[test]
    fn problems_name_the_field() {
        let missing = MissingInput {
            field: "metrics.backlog".into(),
            problem: MetricProblem::Empty,
        };
        assert!(
            missing
                .to_string()
                .starts_with("spec.metrics.backlog returned no sample")
        );
    }
}
