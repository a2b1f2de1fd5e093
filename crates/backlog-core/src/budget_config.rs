//! A BacklogBudget spec, checked and converted into the numbers the decision works with.
//!
//! The API server already refuses most bad specs; this is the defense in depth for objects
//! stored before a rule existed, and it gives every problem a message naming the field.
//!
//! [`BudgetDefinition`] is the spec as written, without the API server's schema rules: the
//! BacklogBudget API type and the simulator's scenarios both convert into it.

use serde::{Deserialize, Serialize};
use thiserror::Error;

use super::duration::{DurationError, non_negative_seconds, positive_seconds};

/// The fields of a BacklogBudget spec the scaling decision reads, as written (durations in
/// Go syntax); the queries themselves stay with the API type, only which ones exist matters.
#[derive(Clone, Debug, PartialEq)]
pub struct BudgetDefinition {
    pub min_replicas: i32,
    pub max_replicas: i32,
    pub completion_deadline: String,
    pub poll_interval: String,
    /// `spec.partitionCount`.
    pub partition_count: Option<i32>,
    /// Whether `metrics.partitions` is set.
    pub partitions_queried: bool,
    /// Whether `metrics.oldestUnfinishedAge` is set.
    pub oldest_age_queried: bool,
    /// Whether `metrics.produceRate` is set.
    pub produce_rate_queried: bool,
    /// Whether `metrics.completionRate` is set.
    pub completion_rate_queried: bool,
    /// `metrics.rateWindow`: the window the rate queries average over, as written.
    pub rate_window: Option<String>,
    /// The longest range selector in the rate queries, in seconds (see
    /// [`crate::promql_range`]).
    pub rate_queries_range_seconds: Option<f64>,
    pub capacity: Option<CapacityDefinition>,
    pub scaling: ScalingDefinition,
    pub alerts: AlertsDefinition,
}

/// Consumer capacity, with the JSON shape of `spec.capacity`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct CapacityDefinition {
    /// Events per second one replica completes; `None` = measure it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub per_replica_rate: Option<f64>,
    /// Share of capacity kept for retries; default 0.1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reserved_retry_share: Option<f64>,
}

/// How scaling is paced, with the JSON shape and defaults of `spec.scaling`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ScalingDefinition {
    #[serde(default = "default_target_drain_time")]
    pub target_drain_time: String,
    #[serde(default = "zero_duration")]
    pub scale_up_stabilization: String,
    #[serde(default = "default_scale_down_stabilization")]
    pub scale_down_stabilization: String,
    /// 0 = unlimited.
    #[serde(default)]
    pub max_step: i32,
    #[serde(default = "zero_duration")]
    pub rebalance_cost: String,
    /// How long a new consumer pod takes to start, assumed until one start is seen.
    #[serde(default = "default_pod_start_time")]
    pub pod_start_time: String,
    /// Most changes in any hour, besides the ones the deadline needs; none = no cap.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_changes_per_hour: Option<i32>,
    /// Economy is entered again no sooner than this after it ended; "0s" = never entered.
    #[serde(default = "default_economy_dwell")]
    pub economy_dwell: String,
}

impl Default for ScalingDefinition {
    fn default() -> Self {
        Self {
            target_drain_time: default_target_drain_time(),
            scale_up_stabilization: zero_duration(),
            scale_down_stabilization: default_scale_down_stabilization(),
            max_step: 0,
            rebalance_cost: zero_duration(),
            pod_start_time: default_pod_start_time(),
            max_changes_per_hour: None,
            economy_dwell: default_economy_dwell(),
        }
    }
}

/// Alert thresholds as fractions of the deadline, with the JSON shape and defaults of
/// `spec.alerts` (who to tell is not the decision's business).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct AlertsDefinition {
    #[serde(default = "default_warning_at")]
    pub warning_at: f64,
    #[serde(default = "default_critical_at")]
    pub critical_at: f64,
}

impl Default for AlertsDefinition {
    fn default() -> Self {
        Self {
            warning_at: default_warning_at(),
            critical_at: default_critical_at(),
        }
    }
}

/// The default `spec.pollInterval`.
pub fn default_poll_interval() -> String {
    "15s".to_owned()
}
fn default_target_drain_time() -> String {
    "5m".to_owned()
}
fn default_scale_down_stabilization() -> String {
    "3m".to_owned()
}
/// The default `spec.scaling.economyDwell`.
pub fn default_economy_dwell() -> String {
    "1h".to_owned()
}
/// The default `spec.scaling.podStartTime`.
pub fn default_pod_start_time() -> String {
    "30s".to_owned()
}
fn zero_duration() -> String {
    "0s".to_owned()
}
fn default_warning_at() -> f64 {
    0.5
}
fn default_critical_at() -> f64 {
    0.8
}

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
    /// How long a new pod takes to start until one start is seen (`scaling.podStartTime`).
    pub pod_start_seconds: f64,
    /// Most changes in any hour besides the necessary ones; `None` = no cap.
    pub max_changes_per_hour: Option<u32>,
    /// How long after economy ended it may not be entered again; 0 = economy off.
    pub economy_dwell_seconds: f64,
    /// Configured per-replica completion rate; `None` = measure it.
    pub per_replica_rate: Option<f64>,
    pub reserved_retry_share: f64,
    pub warning_at: f64,
    pub critical_at: f64,
    pub partitions: PartitionSource,
    pub oldest_age_configured: bool,
    pub produce_rate_configured: bool,
    pub completion_rate_configured: bool,
    /// The window the produce and completion rates average over: `metrics.rateWindow`, else
    /// the longest range in their queries, else [`DEFAULT_RATE_WINDOW_SECONDS`].
    pub rate_window_seconds: f64,
}

/// The rate window assumed when neither `metrics.rateWindow` nor a range in the rate queries
/// says: a typical `rate(…[1m])`.
pub const DEFAULT_RATE_WINDOW_SECONDS: f64 = 60.0;

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
    #[error("spec.scaling.maxChangesPerHour ({0}) must be at least 1; leave it out for no cap")]
    MaxChangesPerHour(i32),
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
    /// What a replica completing `per_replica_rate` leaves for new events once the share kept
    /// for retries is set aside: the rate every count is planned with.
    pub fn usable_rate(&self, per_replica_rate: f64) -> f64 {
        per_replica_rate * (1.0 - self.reserved_retry_share)
    }

    pub fn from_spec(spec: &BudgetDefinition) -> Result<Self, BudgetSpecError> {
        if spec.min_replicas < 1 || spec.min_replicas > spec.max_replicas {
            return Err(BudgetSpecError::ReplicaRange {
                min: spec.min_replicas,
                max: spec.max_replicas,
            });
        }
        let partitions = match (spec.partition_count, spec.partitions_queried) {
            (Some(count), false) if count >= 1 => PartitionSource::Fixed(count as u32),
            (Some(count), false) => return Err(BudgetSpecError::PartitionCount(count)),
            (None, true) => PartitionSource::Query,
            _ => return Err(BudgetSpecError::PartitionSource),
        };
        let capacity = spec.capacity.clone().unwrap_or_default();
        let per_replica_rate = match capacity.per_replica_rate {
            Some(rate) if rate.is_finite() && rate > 0.0 => Some(rate),
            Some(rate) => return Err(BudgetSpecError::PerReplicaRate(rate)),
            None if !spec.completion_rate_queried => {
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
        let max_changes_per_hour = match spec.scaling.max_changes_per_hour {
            None => None,
            Some(count) => match u32::try_from(count) {
                Ok(count) if count >= 1 => Some(count),
                _ => return Err(BudgetSpecError::MaxChangesPerHour(count)),
            },
        };
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
            pod_start_seconds: non_negative_seconds(
                "scaling.podStartTime",
                &scaling.pod_start_time,
            )?,
            max_changes_per_hour,
            economy_dwell_seconds: non_negative_seconds(
                "scaling.economyDwell",
                &scaling.economy_dwell,
            )?,
            per_replica_rate,
            reserved_retry_share,
            warning_at,
            critical_at,
            partitions,
            oldest_age_configured: spec.oldest_age_queried,
            produce_rate_configured: spec.produce_rate_queried,
            completion_rate_configured: spec.completion_rate_queried,
            rate_window_seconds: match &spec.rate_window {
                Some(window) => positive_seconds("metrics.rateWindow", window)?,
                None => spec
                    .rate_queries_range_seconds
                    .unwrap_or(DEFAULT_RATE_WINDOW_SECONDS),
            },
        })
    }
}

/// A budget for unit tests (here and in the controllers): 12 partitions of 250 events/s, a
/// 10-minute deadline, 15 s polls, no retry share, no rebalance cost; tests adjust fields with
/// struct update syntax.
pub fn example() -> BudgetConfig {
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
        pod_start_seconds: 30.0,
        max_changes_per_hour: None,
        economy_dwell_seconds: 3600.0,
        per_replica_rate: Some(250.0),
        reserved_retry_share: 0.0,
        warning_at: 0.5,
        critical_at: 0.8,
        partitions: PartitionSource::Fixed(12),
        oldest_age_configured: true,
        produce_rate_configured: true,
        completion_rate_configured: false,
        rate_window_seconds: DEFAULT_RATE_WINDOW_SECONDS,
    }
}
