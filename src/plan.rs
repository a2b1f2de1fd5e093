//! `backlog-operator plan FILE`: partitions, the useful consumer range, storage, batch limits
//! and key-skew warnings for a topic and its consumer group, and a BacklogBudget that fits
//! them (`maxReplicas` never above the partitions). The arithmetic is
//! [`backlog_core::capacity_plan`]; this module reads the plan file and prints.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::api::backlog_budget::{
    BacklogBudget, BacklogBudgetSpec, Capacity, MetricQueries, ScaleTargetRef, WorkloadInfo,
};
use crate::core::capacity_plan::{self, CapacityPlan, ConsumerSpeed, PlanError, PlanInput};
use crate::core::format;
use crate::core::go_duration::{format_go_duration, parse_go_duration};

/// How `plan` prints.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// A table for people, then the BacklogBudget.
    Table,
    /// JSON for machines.
    Json,
    /// YAML: the plan, then the BacklogBudget as a second document.
    Yaml,
}

/// The plan file. Durations are Go durations (`20ms`, `24h`); sizes are bytes or a number
/// with B, KB, MB, GB (powers of 1000) or KiB, MiB, GiB (powers of 1024).
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PlanFile {
    /// Events per second at peak.
    pub target_throughput: f64,
    /// Reserve over the target; 1.5 keeps half again.
    #[serde(default = "default_headroom")]
    pub headroom: f64,
    /// Events per second one partition sustains.
    pub partition_throughput: f64,
    pub consumer: ConsumerFile,
    pub message_size: Size,
    pub retention: String,
    /// Copies of each partition.
    pub replicas: u32,
    #[serde(default)]
    pub consumer_timeout: Option<String>,
    /// Hot partition keys and their share of all traffic (0 to 1).
    #[serde(default)]
    pub key_skew: BTreeMap<String, f64>,
    /// Names for the BacklogBudget skeleton.
    #[serde(default)]
    pub budget: BudgetFile,
}

fn default_headroom() -> f64 {
    1.5
}

/// One consumer's speed: exactly one of `rate`, `processingTime` or `batch`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ConsumerFile {
    /// Measured events per second of one consumer.
    #[serde(default)]
    pub rate: Option<f64>,
    /// Time per message when consuming one at a time.
    #[serde(default)]
    pub processing_time: Option<String>,
    #[serde(default)]
    pub batch: Option<BatchFile>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BatchFile {
    pub size: u32,
    pub processing_time: String,
    #[serde(default)]
    pub commit_time: Option<String>,
}

/// Names the BacklogBudget skeleton uses.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BudgetFile {
    #[serde(default = "default_name")]
    pub name: String,
    #[serde(default)]
    pub namespace: Option<String>,
    /// The consumer Deployment; defaults to `name`.
    #[serde(default)]
    pub deployment: Option<String>,
    #[serde(default = "default_name")]
    pub topic: String,
    /// Defaults to `name`.
    #[serde(default)]
    pub consumer_group: Option<String>,
    #[serde(default = "default_deadline")]
    pub completion_deadline: String,
}

impl Default for BudgetFile {
    fn default() -> Self {
        Self {
            name: default_name(),
            namespace: None,
            deployment: None,
            topic: default_name(),
            consumer_group: None,
            completion_deadline: default_deadline(),
        }
    }
}

fn default_name() -> String {
    "my-consumer".to_owned()
}

fn default_deadline() -> String {
    "10m".to_owned()
}

/// A size in bytes, written as a number or with a unit.
#[derive(Clone, Debug, Deserialize)]
#[serde(untagged)]
pub enum Size {
    Bytes(f64),
    Text(String),
}

/// Why a plan file cannot be planned. Messages name the field and the fix.
#[derive(Debug, Error)]
pub enum PlanFileError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} is not a plan file: {source}")]
    NotPlan {
        path: String,
        #[source]
        source: serde_yaml::Error,
    },
    #[error("{path}: {field} {value:?} is not a duration: use Go syntax such as 20ms, 45s or 24h")]
    Duration {
        path: String,
        field: &'static str,
        value: String,
    },
    #[error(
        "{path}: messageSize {value:?} is not a size: give bytes (1024) or a number with B, KB, MB, GB, KiB, MiB or GiB"
    )]
    Size { path: String, value: String },
    #[error(
        "{path}: consumer needs exactly one of rate (events/s), processingTime (per message) or batch (size, processingTime, commitTime); it has {given}"
    )]
    ConsumerSpeed { path: String, given: usize },
    #[error("{path}: {source}")]
    Plan {
        path: String,
        #[source]
        source: PlanError,
    },
    #[error("cannot encode the plan: {0}")]
    Encode(String),
}

/// What `plan` prints.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PlanReport {
    pub plan: CapacityPlan,
    pub budget: BacklogBudget,
}

/// Plans the file at `path`.
pub fn plan_file(path: &Path) -> Result<PlanReport, PlanFileError> {
    let shown = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|source| PlanFileError::Read {
        path: shown.clone(),
        source,
    })?;
    plan_text(&shown, &text)
}

/// Plans `text`; `path` only names the source in errors.
pub fn plan_text(path: &str, text: &str) -> Result<PlanReport, PlanFileError> {
    let file: PlanFile = serde_yaml::from_str(text).map_err(|source| PlanFileError::NotPlan {
        path: path.to_owned(),
        source,
    })?;
    let input = plan_input(path, &file)?;
    let plan = capacity_plan::plan(&input).map_err(|source| PlanFileError::Plan {
        path: path.to_owned(),
        source,
    })?;
    let budget = budget_skeleton(&file.budget, &plan);
    Ok(PlanReport { plan, budget })
}

fn seconds(path: &str, field: &'static str, value: &str) -> Result<f64, PlanFileError> {
    parse_go_duration(value)
        .map(|duration| duration.as_secs_f64())
        .map_err(|_| PlanFileError::Duration {
            path: path.to_owned(),
            field,
            value: value.to_owned(),
        })
}

fn plan_input(path: &str, file: &PlanFile) -> Result<PlanInput, PlanFileError> {
    let consumer = &file.consumer;
    let given = [
        consumer.rate.is_some(),
        consumer.processing_time.is_some(),
        consumer.batch.is_some(),
    ]
    .into_iter()
    .filter(|&given| given)
    .count();
    let speed = match (consumer.rate, &consumer.processing_time, &consumer.batch) {
        (Some(rate), None, None) => ConsumerSpeed::Rate(rate),
        (None, Some(time), None) => ConsumerSpeed::PerMessage {
            processing_seconds: seconds(path, "consumer.processingTime", time)?,
        },
        (None, None, Some(batch)) => ConsumerSpeed::Batch {
            size: batch.size,
            processing_seconds: seconds(
                path,
                "consumer.batch.processingTime",
                &batch.processing_time,
            )?,
            commit_seconds: batch
                .commit_time
                .as_deref()
                .map(|time| seconds(path, "consumer.batch.commitTime", time))
                .transpose()?
                .unwrap_or(0.0),
        },
        _ => {
            return Err(PlanFileError::ConsumerSpeed {
                path: path.to_owned(),
                given,
            });
        }
    };
    Ok(PlanInput {
        target_throughput: file.target_throughput,
        headroom: file.headroom,
        partition_throughput: file.partition_throughput,
        consumer: speed,
        message_bytes: size_bytes(path, &file.message_size)?,
        retention_seconds: seconds(path, "retention", &file.retention)?,
        replicas: file.replicas,
        consumer_timeout_seconds: file
            .consumer_timeout
            .as_deref()
            .map(|time| seconds(path, "consumerTimeout", time))
            .transpose()?,
        key_shares: file.key_skew.clone(),
    })
}

fn size_bytes(path: &str, size: &Size) -> Result<f64, PlanFileError> {
    let text = match size {
        Size::Bytes(bytes) => return Ok(*bytes),
        Size::Text(text) => text.trim(),
    };
    let refuse = || PlanFileError::Size {
        path: path.to_owned(),
        value: text.to_owned(),
    };
    let split = text
        .find(|c: char| c.is_ascii_alphabetic())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: f64 = number.trim().parse().map_err(|_| refuse())?;
    let multiplier = match unit.trim() {
        "" | "B" => 1.0,
        "KB" | "kB" => 1e3,
        "MB" => 1e6,
        "GB" => 1e9,
        "KiB" => 1024.0,
        "MiB" => 1024.0 * 1024.0,
        "GiB" => 1024.0 * 1024.0 * 1024.0,
        _ => return Err(refuse()),
    };
    Ok(number * multiplier)
}

/// A BacklogBudget that fits the plan: one replica per partition at most, the planned
/// per-consumer rate as capacity, the partition count fixed.
fn budget_skeleton(names: &BudgetFile, plan: &CapacityPlan) -> BacklogBudget {
    let deployment = names
        .deployment
        .clone()
        .unwrap_or_else(|| names.name.clone());
    let group = names
        .consumer_group
        .clone()
        .unwrap_or_else(|| names.name.clone());
    let topic = &names.topic;
    let max_replicas = i32::try_from(plan.max_useful_consumers).unwrap_or(i32::MAX);
    let spec = BacklogBudgetSpec {
        scale_target_ref: ScaleTargetRef {
            api_version: "apps/v1".to_owned(),
            kind: "Deployment".to_owned(),
            name: deployment.clone(),
        },
        // Two for availability where the partitions allow it; the budget scales up from there.
        min_replicas: max_replicas.min(2),
        max_replicas,
        workload: Some(WorkloadInfo {
            consumer_group: Some(group.clone()),
            ..WorkloadInfo::default()
        }),
        completion_deadline: names.completion_deadline.clone(),
        retry_policy_ref: None,
        prometheus: None,
        metrics: MetricQueries {
            backlog: format!(
                "sum(kafka_consumergroup_lag_sum{{consumergroup=\"{group}\", topic=\"{topic}\"}})"
            ),
            oldest_unfinished_age: Some(format!(
                "max(consumer_oldest_unfinished_event_age_seconds{{consumer=\"{deployment}\"}})"
            )),
            produce_rate: Some(format!(
                "sum(rate(kafka_topic_partition_current_offset{{topic=\"{topic}\"}}[1m]))"
            )),
            completion_rate: Some(format!(
                "sum(rate(consumer_events_completed_total{{consumer=\"{deployment}\"}}[1m]))"
            )),
            rate_window: None,
            retry_rate: None,
            quarantine_rate: None,
            partitions: None,
            partition_backlog: None,
            group_by: None,
        },
        partition_count: i32::try_from(plan.partitions).ok(),
        poll_interval: crate::api::backlog_budget::default_poll_interval(),
        capacity: Some(Capacity {
            per_replica_rate: Some(round_rate(plan.consumer_throughput)),
            reserved_retry_share: None,
        }),
        scaling: Default::default(),
        alerts: Default::default(),
        event_classes: Vec::new(),
    };
    let mut budget = BacklogBudget::new(&names.name, spec);
    budget.metadata.namespace = names.namespace.clone();
    budget
}

/// Three significant digits: a capacity, not a measurement.
fn round_rate(rate: f64) -> f64 {
    if rate <= 0.0 || !rate.is_finite() {
        return rate;
    }
    let digits = 3 - 1 - rate.log10().floor() as i32;
    let scale = 10f64.powi(digits);
    (rate * scale).round() / scale
}

/// Seconds as a Go duration, to the millisecond.
fn precise(seconds: f64) -> String {
    format_go_duration(std::time::Duration::from_millis(
        (seconds * 1000.0).round() as u64
    ))
}

/// Bytes in decimal units, as disks are sold.
fn bytes(value: f64) -> String {
    const UNITS: [&str; 6] = ["B", "KB", "MB", "GB", "TB", "PB"];
    let mut scaled = value;
    let mut unit = 0;
    while scaled >= 1000.0 && unit < UNITS.len() - 1 {
        scaled /= 1000.0;
        unit += 1;
    }
    format!("{scaled:.1} {}", UNITS[unit])
}

/// The plan as a table, then the BacklogBudget as YAML.
pub fn table(report: &PlanReport) -> Result<String, PlanFileError> {
    let plan = &report.plan;
    let mut out = String::new();
    let bound = match plan.bound {
        capacity_plan::PartitionBound::PartitionThroughput => {
            "set by the per-partition throughput".to_owned()
        }
        capacity_plan::PartitionBound::ConsumersNeeded => format!(
            "set by the consumers: {} partitions carry the throughput, but {} consumers there complete only {}/s",
            plan.partitions_for_throughput,
            plan.partitions_for_throughput,
            format::si(plan.group_throughput_at_those)
        ),
    };
    out.push_str(&format!(
        "partitions          {}  ({bound})\n",
        plan.partitions
    ));
    out.push_str(&format!(
        "consumer throughput {}/s each\n",
        format::si(plan.consumer_throughput)
    ));
    out.push_str(&format!(
        "useful consumers    {}..{}  (at least {} to keep up with the target, {} for the headroom; one more than {} idles)\n",
        plan.min_consumers,
        plan.max_useful_consumers,
        plan.min_consumers,
        plan.consumers_for_headroom,
        plan.max_useful_consumers
    ));
    out.push_str(&format!(
        "group throughput    {}/s with every useful consumer\n",
        format::si(plan.max_group_throughput)
    ));
    out.push_str(&format!(
        "storage             {}  (write rate × message size × retention × replicas)\n",
        bytes(plan.storage_bytes)
    ));
    if let Some(batch) = &plan.batch {
        let verdict = if batch.within_limit { "within" } else { "OVER" };
        out.push_str(&format!(
            "batch time          {} {verdict} half the consumer timeout ({}); largest batch that fits: {}\n",
            precise(batch.batch_seconds),
            precise(batch.limit_seconds),
            batch.largest_batch
        ));
    }
    for warning in &plan.skew_warnings {
        out.push_str(&format!(
            "WARNING key {:?} ({:.0}% of the traffic) puts {}/s on its partition, above one {}'s {}/s: more consumers cannot spread one key; split it or give it a topic of its own\n",
            warning.key,
            warning.share * 100.0,
            format::si(warning.rate),
            warning.exceeds,
            format::si(warning.limit)
        ));
    }
    out.push_str("---\n");
    out.push_str(
        &serde_yaml::to_string(&report.budget)
            .map_err(|error| PlanFileError::Encode(error.to_string()))?,
    );
    Ok(out)
}

/// The plan and the BacklogBudget as JSON.
pub fn json(report: &PlanReport) -> Result<String, PlanFileError> {
    serde_json::to_string_pretty(report).map_err(|error| PlanFileError::Encode(error.to_string()))
}

/// The plan, then the BacklogBudget as a second YAML document (`kubectl apply` takes it as is
/// when the first is dropped).
pub fn yaml(report: &PlanReport) -> Result<String, PlanFileError> {
    let encode = |error: serde_yaml::Error| PlanFileError::Encode(error.to_string());
    Ok(format!(
        "{}---\n{}",
        serde_yaml::to_string(&report.plan).map_err(encode)?,
        serde_yaml::to_string(&report.budget).map_err(encode)?
    ))
}

#[cfg(test)]
mod tests;
