//! The API types as the core's plain definitions: the same fields without the API server's
//! schema rules, which is all the decisions and the consumer library need.

use crate::core::budget_config::{
    AlertsDefinition, BudgetDefinition, CapacityDefinition, ScalingDefinition,
};
use crate::core::event_class::{ClassDefinition, PauseDefinition};
use crate::core::promql_range::longest_range_seconds;
use crate::core::retry_policy::{
    BackoffDefinition, ClassificationRule as RuleDefinition, RetryBudgetDefinition,
    RetryPolicyDefinition,
};

use super::backlog_budget::{
    Alerts, BacklogBudgetSpec, Capacity, EventClass, PausePolicy, Scaling,
};
use super::retry_policy::{Backoff, ClassificationRule, RetryBudget, RetryPolicySpec};

impl From<&RetryPolicySpec> for RetryPolicyDefinition {
    fn from(spec: &RetryPolicySpec) -> Self {
        Self {
            max_attempts: spec.max_attempts,
            backoff: BackoffDefinition::from(&spec.backoff),
            classification: spec
                .classification
                .iter()
                .map(RuleDefinition::from)
                .collect(),
            default_class: spec.default_class,
            retry_budget: RetryBudgetDefinition::from(&spec.retry_budget),
        }
    }
}

impl From<&Backoff> for BackoffDefinition {
    fn from(backoff: &Backoff) -> Self {
        Self {
            base: backoff.base.clone(),
            cap: backoff.cap.clone(),
            jitter: backoff.jitter,
        }
    }
}

impl From<&ClassificationRule> for RuleDefinition {
    fn from(rule: &ClassificationRule) -> Self {
        Self {
            error_codes: rule.error_codes.clone(),
            class: rule.class,
        }
    }
}

impl From<&RetryBudget> for RetryBudgetDefinition {
    fn from(budget: &RetryBudget) -> Self {
        Self {
            max_retry_ratio: budget.max_retry_ratio,
        }
    }
}

impl From<&EventClass> for ClassDefinition {
    fn from(class: &EventClass) -> Self {
        Self {
            name: class.name.clone(),
            min_rate: class.min_rate,
            mode: class.mode,
            pause_policy: PauseDefinition::from(&class.pause_policy),
        }
    }
}

impl From<&PausePolicy> for PauseDefinition {
    fn from(policy: &PausePolicy) -> Self {
        Self {
            threshold: policy.threshold,
            for_: policy.for_.clone(),
            open_duration: policy.open_duration.clone(),
            max_open_duration: policy.max_open_duration.clone(),
            probe_ratio: policy.probe_ratio,
        }
    }
}

impl From<&BacklogBudgetSpec> for BudgetDefinition {
    fn from(spec: &BacklogBudgetSpec) -> Self {
        Self {
            min_replicas: spec.min_replicas,
            max_replicas: spec.max_replicas,
            completion_deadline: spec.completion_deadline.clone(),
            poll_interval: spec.poll_interval.clone(),
            partition_count: spec.partition_count,
            partitions_queried: spec.metrics.partitions.is_some(),
            oldest_age_queried: spec.metrics.oldest_unfinished_age.is_some(),
            produce_rate_queried: spec.metrics.produce_rate.is_some(),
            completion_rate_queried: spec.metrics.completion_rate.is_some(),
            rate_window: spec.metrics.rate_window.clone(),
            rate_queries_range_seconds: [&spec.metrics.produce_rate, &spec.metrics.completion_rate]
                .into_iter()
                .flatten()
                .filter_map(|query| longest_range_seconds(query))
                .reduce(f64::max),
            capacity: spec.capacity.as_ref().map(CapacityDefinition::from),
            scaling: ScalingDefinition::from(&spec.scaling),
            alerts: AlertsDefinition::from(&spec.alerts),
        }
    }
}

impl From<&Capacity> for CapacityDefinition {
    fn from(capacity: &Capacity) -> Self {
        Self {
            per_replica_rate: capacity.per_replica_rate,
            reserved_retry_share: capacity.reserved_retry_share,
        }
    }
}

impl From<&Scaling> for ScalingDefinition {
    fn from(scaling: &Scaling) -> Self {
        Self {
            target_drain_time: scaling.target_drain_time.clone(),
            scale_up_stabilization: scaling.scale_up_stabilization.clone(),
            scale_down_stabilization: scaling.scale_down_stabilization.clone(),
            max_step: scaling.max_step,
            rebalance_cost: scaling.rebalance_cost.clone(),
            pod_start_time: scaling.pod_start_time.clone(),
            max_changes_per_hour: scaling.max_changes_per_hour,
            economy_dwell: scaling.economy_dwell.clone(),
        }
    }
}

impl From<&Alerts> for AlertsDefinition {
    fn from(alerts: &Alerts) -> Self {
        Self {
            warning_at: alerts.warning_at,
            critical_at: alerts.critical_at,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::budget_config::{BudgetConfig, BudgetSpecError, PartitionSource};

    /// The API types and the plain definitions are read from the same files (budgets,
    /// scenarios, control documents): their defaults must agree.
    #[test]
    fn defaults_agree_with_the_api_types() {
        assert_eq!(
            PauseDefinition::from(&PausePolicy::default()),
            PauseDefinition::default()
        );
        assert_eq!(
            ScalingDefinition::from(&Scaling::default()),
            ScalingDefinition::default()
        );
        assert_eq!(
            AlertsDefinition::from(&Alerts::default()),
            AlertsDefinition::default()
        );
        assert_eq!(
            RetryBudgetDefinition::from(&RetryBudget::default()),
            RetryBudgetDefinition::default()
        );
        let spec: BacklogBudgetSpec = serde_yaml::from_str(BASE).unwrap();
        assert_eq!(
            spec.poll_interval,
            crate::core::budget_config::default_poll_interval()
        );
        let policy = r#"{"maxAttempts": 3, "backoff": {"base": "1s", "cap": "2s"}}"#;
        let spec: RetryPolicySpec = serde_json::from_str(policy).unwrap();
        let definition: RetryPolicyDefinition = serde_json::from_str(policy).unwrap();
        assert_eq!(RetryPolicyDefinition::from(&spec), definition);
    }

    fn spec(yaml: &str) -> BacklogBudgetSpec {
        serde_yaml::from_str(yaml).unwrap()
    }

    fn config(spec: &BacklogBudgetSpec) -> Result<BudgetConfig, BudgetSpecError> {
        BudgetConfig::from_spec(&BudgetDefinition::from(spec))
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
        let config = config(&spec(BASE)).unwrap();
        assert_eq!(config.poll_interval_seconds, 15.0);
        assert_eq!(config.target_drain_seconds, 300.0);
        assert_eq!(config.scale_down_stabilization_seconds, 180.0);
        assert_eq!(config.reserved_retry_share, 0.1);
        assert_eq!(config.partitions, PartitionSource::Fixed(6));
        assert_eq!(config.max_step, 0);
    }

    #[test]
    fn the_rate_window_is_stated_else_read_from_the_rate_queries_else_a_minute() {
        let mut budget = spec(BASE);
        assert_eq!(config(&budget).unwrap().rate_window_seconds, 60.0);
        budget.metrics.produce_rate = Some("sum(rate(offsets[2m]))".into());
        budget.metrics.completion_rate =
            Some(r#"sum(rate(completed{path="[1h]"}[5m:15s]))"#.into());
        assert_eq!(config(&budget).unwrap().rate_window_seconds, 300.0);
        budget.metrics.rate_window = Some("30s".into());
        assert_eq!(config(&budget).unwrap().rate_window_seconds, 30.0);
        budget.metrics.rate_window = Some("a while".into());
        assert!(
            config(&budget)
                .unwrap_err()
                .to_string()
                .contains("spec.metrics.rateWindow")
        );
    }

    #[test]
    fn refuses_with_field_names() {
        let mut bad = spec(BASE);
        bad.min_replicas = 11;
        assert!(
            config(&bad)
                .unwrap_err()
                .to_string()
                .contains("spec.minReplicas")
        );
        let mut bad = spec(BASE);
        bad.completion_deadline = "soon".into();
        assert!(
            config(&bad)
                .unwrap_err()
                .to_string()
                .contains("spec.completionDeadline")
        );
        let mut bad = spec(BASE);
        bad.metrics.partitions = Some("p".into());
        assert_eq!(config(&bad), Err(BudgetSpecError::PartitionSource));
        let mut bad = spec(BASE);
        bad.capacity = None;
        assert_eq!(config(&bad), Err(BudgetSpecError::NoCapacitySource));
    }
}
