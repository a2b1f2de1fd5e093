//! A BacklogBudget spec, checked and converted into the numbers the decision works with.
//!
//! The API server already refuses most bad specs; this is the defense in depth for objects
//! stored before a rule existed, and it gives every problem a message naming the field.

use thiserror::Error;

use super::duration::{DurationError, non_negative_seconds, positive_seconds};
use crate::api::backlog_budget::BacklogBudgetSpec;

/// Where the partition count comes from.
#[derive(Clone, Debug, PartialEq)]
pub enum PartitionSource {
    Fixed(u32),
    Query,
}

/// Everything the scaling decision needs from the spec, validated.
#[derive(Clone, Debug, PartialEq)]
pub struct BudgetConfig {
    pub min_replicas: u32,
    pub max_replicas: u32,
    pub deadline_seconds: f64,
    pub poll_interval_seconds: f64,
    pub target_drain_seconds: f64,
    pub scale_up_stabilization_seconds: f64,
    pub scale_down_stabilization_seconds: f64,
    /// 0 = unlimited.
    pub max_step: u32,
    pub rebalance_cost_seconds: f64,
    /// Configured per-replica completion rate; `None` = measure it.
    pub per_replica_rate: Option<f64>,
    pub reserved_retry_share: f64,
    pub warning_at: f64,
    pub critical_at: f64,
    pub partitions: PartitionSource,
    pub oldest_age_configured: bool,
    pub produce_rate_configured: bool,
    pub completion_rate_configured: bool,
}

/// A spec the operator cannot work with.
#[derive(Clone, Debug, Error, PartialEq)]
pub enum BudgetSpecError {
    #[error(transparent)]
    Duration(#[from] DurationError),
    #[error("spec.minReplicas ({min}) must be between 1 and spec.maxReplicas ({max})")]
    ReplicaRange { min: i32, max: i32 },
    #[error(
        "give the partition count exactly once: spec.partitionCount or spec.metrics.partitions"
    )]
    PartitionSource,
    #[error("spec.partitionCount ({0}) must be at least 1")]
    PartitionCount(i32),
    #[error("spec.{field} ({value}) must be within [{min}, {max}]")]
    OutOfRange {
        field: &'static str,
        value: f64,
        min: f64,
        max: f64,
    },
    #[error("spec.capacity.perReplicaRate ({0}) must be greater than 0")]
    PerReplicaRate(f64),
    #[error(
        "spec.capacity.perReplicaRate is unset and spec.metrics.completionRate is unset too; set one so capacity can be known"
    )]
    NoCapacitySource,
    #[error("spec.alerts.warningAt ({warning}) must be below spec.alerts.criticalAt ({critical})")]
    AlertOrder { warning: f64, critical: f64 },
    #[error("spec.scaling.maxStep ({0}) must not be negative")]
    MaxStep(i32),
}

fn in_range(field: &'static str, value: f64, min: f64, max: f64) -> Result<f64, BudgetSpecError> {
    if value.is_finite() && (min..=max).contains(&value) {
        Ok(value)
    } else {
        Err(BudgetSpecError::OutOfRange {
            field,
            value,
            min,
            max,
        })
    }
}

impl BudgetConfig {
    pub fn from_spec(spec: &BacklogBudgetSpec) -> Result<Self, BudgetSpecError> {
        if spec.min_replicas < 1 || spec.min_replicas > spec.max_replicas {
            return Err(BudgetSpecError::ReplicaRange {
                min: spec.min_replicas,
                max: spec.max_replicas,
            });
        }
        let partitions = match (spec.partition_count, &spec.metrics.partitions) {
            (Some(count), None) if count >= 1 => PartitionSource::Fixed(count as u32),
            (Some(count), None) => return Err(BudgetSpecError::PartitionCount(count)),
            (None, Some(_)) => PartitionSource::Query,
            _ => return Err(BudgetSpecError::PartitionSource),
        };
        let capacity = spec.capacity.clone().unwrap_or_default();
        let per_replica_rate = match capacity.per_replica_rate {
            Some(rate) if rate.is_finite() && rate > 0.0 => Some(rate),
            Some(rate) => return Err(BudgetSpecError::PerReplicaRate(rate)),
            None if spec.metrics.completion_rate.is_none() => {
                return Err(BudgetSpecError::NoCapacitySource);
            }
            None => None,
        };
        let reserved_retry_share = in_range(
            "capacity.reservedRetryShare",
            capacity.reserved_retry_share.unwrap_or(0.1),
            0.0,
            0.9,
        )?;
        let warning_at = in_range("alerts.warningAt", spec.alerts.warning_at, 0.0, 1.0)?;
        let critical_at = in_range("alerts.criticalAt", spec.alerts.critical_at, 0.0, 1.0)?;
        if warning_at >= critical_at {
            return Err(BudgetSpecError::AlertOrder {
                warning: warning_at,
                critical: critical_at,
            });
        }
        if spec.scaling.max_step < 0 {
            return Err(BudgetSpecError::MaxStep(spec.scaling.max_step));
        }
        let scaling = &spec.scaling;
        Ok(Self {
            min_replicas: spec.min_replicas as u32,
            max_replicas: spec.max_replicas as u32,
            deadline_seconds: positive_seconds("completionDeadline", &spec.completion_deadline)?,
            poll_interval_seconds: positive_seconds("pollInterval", &spec.poll_interval)?,
            target_drain_seconds: positive_seconds(
                "scaling.targetDrainTime",
                &scaling.target_drain_time,
            )?,
            scale_up_stabilization_seconds: non_negative_seconds(
                "scaling.scaleUpStabilization",
                &scaling.scale_up_stabilization,
            )?,
            scale_down_stabilization_seconds: non_negative_seconds(
                "scaling.scaleDownStabilization",
                &scaling.scale_down_stabilization,
            )?,
            max_step: scaling.max_step as u32,
            rebalance_cost_seconds: non_negative_seconds(
                "scaling.rebalanceCost",
                &scaling.rebalance_cost,
            )?,
            per_replica_rate,
            reserved_retry_share,
            warning_at,
            critical_at,
            partitions,
            oldest_age_configured: spec.metrics.oldest_unfinished_age.is_some(),
            produce_rate_configured: spec.metrics.produce_rate.is_some(),
            completion_rate_configured: spec.metrics.completion_rate.is_some(),
        })
    }
}

/// A budget for unit tests: 12 partitions of 250 events/s, a 10-minute deadline, 15 s polls,
/// no retry share, no rebalance cost; tests adjust fields with struct update syntax.
#[cfg(test)]
pub(crate) fn example() -> BudgetConfig {
    BudgetConfig {
        min_replicas: 1,
        max_replicas: 20,
        deadline_seconds: 600.0,
        poll_interval_seconds: 15.0,
        target_drain_seconds: 300.0,
        scale_up_stabilization_seconds: 0.0,
        scale_down_stabilization_seconds: 300.0,
        max_step: 0,
        rebalance_cost_seconds: 0.0,
        per_replica_rate: Some(250.0),
        reserved_retry_share: 0.0,
        warning_at: 0.5,
        critical_at: 0.8,
        partitions: PartitionSource::Fixed(12),
        oldest_age_configured: true,
        produce_rate_configured: true,
        completion_rate_configured: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(yaml: &str) -> BacklogBudgetSpec {
        serde_yaml::from_str(yaml).unwrap()
    }

    const BASE: &str = r#"
scaleTargetRef: {kind: Deployment, name: c}
minReplicas: 1
maxReplicas: 10
completionDeadline: 10m
metrics: {backlog: lag}
partitionCount: 6
capacity: {perReplicaRate: 100}
"#;

    #[test]
    fn applies_defaults() {
        let config = BudgetConfig::from_spec(&spec(BASE)).unwrap();
        assert_eq!(config.poll_interval_seconds, 15.0);
        assert_eq!(config.target_drain_seconds, 300.0);
        assert_eq!(config.scale_down_stabilization_seconds, 180.0);
        assert_eq!(config.reserved_retry_share, 0.1);
        assert_eq!(config.partitions, PartitionSource::Fixed(6));
        assert_eq!(config.max_step, 0);
    }

    #[test]
    fn refuses_with_field_names() {
        let mut bad = spec(BASE);
        bad.min_replicas = 11;
        assert!(
            BudgetConfig::from_spec(&bad)
                .unwrap_err()
                .to_string()
                .contains("spec.minReplicas")
        );
        let mut bad = spec(BASE);
        bad.completion_deadline = "soon".into();
        assert!(
            BudgetConfig::from_spec(&bad)
                .unwrap_err()
                .to_string()
                .contains("spec.completionDeadline")
        );
        let mut bad = spec(BASE);
        bad.metrics.partitions = Some("p".into());
        assert_eq!(
            BudgetConfig::from_spec(&bad),
            Err(BudgetSpecError::PartitionSource)
        );
        let mut bad = spec(BASE);
        bad.capacity = None;
        assert_eq!(
            BudgetConfig::from_spec(&bad),
            Err(BudgetSpecError::NoCapacitySource)
        );
    }
}
