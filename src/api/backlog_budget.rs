//! `BacklogBudget` (`bb`): one consumer workload and its promise in time.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, MicroTime};
use kube::core::Rule;
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

use super::validation::{
    DNS_SUBDOMAIN, duration_at_least, duration_at_least_literal, duration_at_most,
    duration_not_below, duration_shorter, is_duration, non_negative_duration, not_blank,
    positive_duration,
};

pub use crate::core::capacity_estimate::CapacitySource;
pub use crate::core::event_class::{ClassMode, ClassState};
pub use crate::core::phase::BudgetPhase;

/// A consumer workload, the deadline its events must meet, and how the operator may scale it.
// kube-derive repeats `printcolumn(type_ = ...)` attributes by design.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "backlog.dev",
    version = "v1alpha1",
    kind = "BacklogBudget",
    namespaced,
    status = "Box<BacklogBudgetStatus>",
    shortname = "bb",
    category = "backlog",
    derive = "PartialEq",
    doc = "A consumer workload and its promise in time: the oldest unfinished event must finish before completionDeadline.",
    validation = Rule::new("self.metadata.name.size() <= 245").message("metadata.name must be at most 245 characters: the budget's control document is the ConfigMap <name>-control"),
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"),
    printcolumn(
        name = "Replicas",
        type_ = "integer",
        json_path = ".status.observed.replicas"
    ),
    printcolumn(
        name = "Desired",
        type_ = "integer",
        json_path = ".status.desiredReplicas"
    ),
    printcolumn(
        name = "Partitions",
        type_ = "integer",
        json_path = ".status.observed.partitions"
    ),
    printcolumn(
        name = "Backlog",
        type_ = "number",
        json_path = ".status.observed.backlog"
    ),
    printcolumn(
        name = "Oldest",
        type_ = "string",
        json_path = ".status.observed.oldestUnfinishedAgeText",
        description = "Age of the oldest unfinished event"
    ),
    printcolumn(
        name = "Deadline",
        type_ = "string",
        json_path = ".spec.completionDeadline"
    ),
    printcolumn(
        name = "Drain",
        type_ = "string",
        json_path = ".status.drainTime",
        description = "Predicted time to drain the backlog at the current rates"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    ),
    printcolumn(
        name = "Headroom",
        type_ = "number",
        json_path = ".status.capacityHeadroom",
        description = "What the replica cap completes over the produce rate's 24-hour peak",
        priority = 1
    ),
    printcolumn(
        name = "Reason",
        type_ = "string",
        json_path = ".status.explanation",
        priority = 1
    )
)]
#[x_kube(validation = Rule::new("self.minReplicas <= self.maxReplicas").message("minReplicas must not exceed maxReplicas; lower minReplicas or raise maxReplicas").field_path(".minReplicas"))]
#[x_kube(validation = Rule::new("has(self.partitionCount) != has(self.metrics.partitions)").message("give the partition count exactly once: either spec.partitionCount (a number) or spec.metrics.partitions (a PromQL query), not both and not neither"))]
#[x_kube(validation = Rule::new("!has(self.partitionCount) || self.minReplicas <= self.partitionCount").message("minReplicas must not exceed partitionCount: consumers beyond the partition count get no partition and idle; lower minReplicas").field_path(".minReplicas"))]
#[x_kube(validation = duration_shorter(&["pollInterval"], &["completionDeadline"], true, "completionDeadline must be at least pollInterval: the operator looks once per pollInterval, so a shorter deadline passes between two looks; lengthen completionDeadline or shorten pollInterval", ".completionDeadline"))]
#[x_kube(validation = duration_shorter(&["scaling", "rebalanceCost"], &["completionDeadline"], false, "scaling.rebalanceCost must be shorter than completionDeadline: every scale change stops consumption that long, so none could keep the deadline; measure the rebalance again or lengthen completionDeadline", ".scaling.rebalanceCost"))]
#[x_kube(validation = duration_shorter(&["pollInterval"], &["scaling", "targetDrainTime"], true, "scaling.targetDrainTime must be at least pollInterval: the operator looks once per pollInterval, so no backlog can be seen drained sooner, and every plan would fail it; lengthen targetDrainTime or shorten pollInterval", ".scaling.targetDrainTime"))]
#[x_kube(validation = class_windows_cover_a_poll())]
#[x_kube(validation = duration_shorter(&["scaling", "scaleUpStabilization"], &["completionDeadline"], false, "scaling.scaleUpStabilization must be shorter than completionDeadline: a scale-up held that long comes after the deadline has passed; shorten it (0s, the default, acts at once)", ".scaling.scaleUpStabilization"))]
#[x_kube(validation = Rule::new("has(self.capacity) && has(self.capacity.perReplicaRate) || has(self.metrics.completionRate)").message("capacity.perReplicaRate is unset, so it is measured from metrics.completionRate, which is unset too; set one of them"))]
#[serde(rename_all = "camelCase")]
pub struct BacklogBudgetSpec {
    /// The workload to scale; it must have a `/scale` subresource (Deployment, StatefulSet,
    /// Argo Rollout, ...).
    pub scale_target_ref: ScaleTargetRef,

    /// Fewest replicas. Scale-to-zero is not supported: a stopped consumer cannot report the
    /// age of its oldest unfinished event.
    #[schemars(range(min = 1, max = 10000))]
    pub min_replicas: i32,

    /// Most replicas; the effective cap is also never above the partition count.
    #[schemars(range(min = 1, max = 10000))]
    pub max_replicas: i32,

    /// Descriptive labels shown in status and metrics.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workload: Option<WorkloadInfo>,

    /// Time from an event's creation to its business completion, e.g. 10m.
    #[schemars(length(max = 32))]
    #[x_kube(validation = positive_duration("completionDeadline"))]
    #[x_kube(validation = duration_at_most("completionDeadline", "168h", "plans look ahead at least this far; a longer business deadline is a batch job, not a backlog"))]
    pub completion_deadline: String,

    /// The RetryPolicy these consumers use (same namespace).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_policy_ref: Option<LocalRef>,

    /// Where to query; defaults to the operator's --prometheus-url.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prometheus: Option<PrometheusSource>,

    /// PromQL expressions, each expected to return exactly one sample.
    pub metrics: MetricQueries,

    /// Fixed partition count, instead of the query metrics.partitions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 100000))]
    pub partition_count: Option<i32>,

    /// How often the budget is evaluated (at least 1s).
    #[serde(default = "default_poll_interval")]
    #[schemars(length(max = 32))]
    #[x_kube(validation = duration_at_least_literal("pollInterval", "1s", "15s"))]
    pub poll_interval: String,

    /// Consumer capacity.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity: Option<Capacity>,

    /// How scaling is paced.
    #[serde(default)]
    pub scaling: Scaling,

    /// When the oldest age counts as a warning or critical, and who to tell.
    #[serde(default)]
    pub alerts: Alerts,

    /// Event classes that can be paused when they keep failing.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    #[x_kube(merge_strategy = kube::core::ListMerge::Map(vec!["name".into()]))]
    pub event_classes: Vec<EventClass>,
}

pub(crate) fn default_poll_interval() -> String {
    "15s".to_owned()
}

/// Reference to a workload with a `/scale` subresource.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Hash)]
#[serde(rename_all = "camelCase")]
pub struct ScaleTargetRef {
    /// e.g. apps/v1
    #[serde(default = "default_target_api_version")]
    #[schemars(length(min = 1, max = 253))]
    #[x_kube(validation = Rule::new(format!("self.matches('^({DNS_SUBDOMAIN}/)?v[0-9]+((alpha|beta)[0-9]+)?$')")).message("scaleTargetRef.apiVersion must be group/version or a core version, such as apps/v1"))]
    pub api_version: String,
    /// e.g. Deployment, StatefulSet
    #[schemars(length(min = 1, max = 63))]
    #[x_kube(validation = Rule::new("self.matches('^[A-Z][A-Za-z0-9]*$')").message("scaleTargetRef.kind must be the workload's kind as its API names it, such as Deployment or StatefulSet"))]
    pub kind: String,
    #[schemars(length(min = 1, max = 253))]
    #[x_kube(validation = Rule::new(format!("self.matches('^{DNS_SUBDOMAIN}$')")).message("scaleTargetRef.name must be the workload's name: lowercase letters, digits, '-' and '.', starting and ending with a letter or digit (no spaces)"))]
    pub name: String,
}

fn default_target_api_version() -> String {
    "apps/v1".to_owned()
}

/// Descriptive information about the consumer.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct WorkloadInfo {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    pub event_type: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    pub consumer_group: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 63))]
    pub priority: Option<String>,
}

/// A reference to an object in the same namespace.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Hash)]
pub struct LocalRef {
    #[schemars(length(min = 1, max = 253))]
    #[x_kube(validation = Rule::new(format!("self.matches('^{DNS_SUBDOMAIN}$')")).message("the name must be an object's name in this namespace: lowercase letters, digits, '-' and '.', starting and ending with a letter or digit (no namespace/ prefix, no spaces)"))]
    pub name: String,
}

/// Rule: every event class's `pausePolicy.for` and `openDuration` span at least one poll.
/// The ratio is read once per poll and a pause is seen by the consumers at the next one, so a
/// shorter span decides on one reading, or ends before anyone saw it.
fn class_windows_cover_a_poll() -> Rule {
    let poll = "self.pollInterval";
    let covers = |field: &str| {
        let value = format!("c.pausePolicy.{field}");
        format!(
            "!has({value}) || !{} || duration({value}) >= duration({poll})",
            is_duration(&value)
        )
    };
    Rule::new(format!(
        "!has(self.eventClasses) || !has({poll}) || !{} || self.eventClasses.all(c, !has(c.pausePolicy) || (({}) && ({})))",
        is_duration(poll),
        // `for` is a CEL keyword; the API server escapes such field names so.
        covers("__for__"),
        covers("openDuration"),
    ))
    .message("every eventClasses[].pausePolicy.for and openDuration must be at least pollInterval: the failure ratio is read once per poll and a pause is seen at the next one, so a shorter span decides on one reading or ends unseen; lengthen them or shorten pollInterval")
    .field_path(".eventClasses")
}

/// A Prometheus server.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Hash)]
pub struct PrometheusSource {
    /// Base URL, e.g. http://prometheus.monitoring:9090
    #[schemars(length(max = 2048))]
    #[x_kube(validation = Rule::new("self.matches('^https?://[^\\\\s]+$')").message("prometheus.address must be an http:// or https:// URL such as http://prometheus.monitoring:9090"))]
    #[x_kube(validation = Rule::new("!self.matches('^https?://[^\\\\s]+$') || (isURL(self) && url(self).getHostname() != '')").message("prometheus.address must name a host, such as http://prometheus.monitoring:9090"))]
    #[x_kube(validation = Rule::new("!self.contains('/api/v1')").message("prometheus.address is the server's base URL, such as http://prometheus.monitoring:9090 (or one with its path prefix): the operator adds /api/v1/query itself"))]
    // The operator refuses these too, but only after the spec (and a password in it) is stored.
    #[x_kube(validation = Rule::new("!self.matches('^https?://[^/?#]*@') && !self.contains('?') && !self.contains('#')").message("prometheus.address must hold no user or password, query or fragment, such as http://prometheus.monitoring:9090: credentials in a spec are readable by everyone who reads it, and the operator adds the query itself"))]
    #[x_kube(validation = Rule::new("!self.matches('^https?://[^/?#@]*:[0-9]*([/?#].*)?$') || self.matches('^https?://[^/?#@]*:([1-9][0-9]{0,3}|[1-5][0-9]{4}|6[0-4][0-9]{3}|65[0-4][0-9]{2}|655[0-2][0-9]|6553[0-5])([/?#].*)?$')").message("prometheus.address must have a port from 1 to 65535 if it names one, such as http://prometheus.monitoring:9090"))]
    pub address: String,
}

/// The PromQL the budget is evaluated from. Each must return exactly one sample; an empty
/// result is missing data, never zero.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct MetricQueries {
    /// Unfinished events (e.g. summed consumer-group lag). Required.
    #[schemars(length(min = 1, max = 4096))]
    #[x_kube(validation = not_blank("metrics.backlog", "give the PromQL that returns the unfinished events as one sample"))]
    pub backlog: String,
    /// Age in seconds of the oldest unfinished event. If absent, the operator estimates it from
    /// backlog and completion rate and says so in status.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 4096))]
    #[x_kube(validation = not_blank("metrics.oldestUnfinishedAge", "give the PromQL for the oldest unfinished event's age in seconds, or leave the field out to have it estimated"))]
    pub oldest_unfinished_age: Option<String>,
    /// Events produced per second (λ).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 4096))]
    #[x_kube(validation = not_blank("metrics.produceRate", "give the PromQL for the events produced per second, or leave the field out"))]
    pub produce_rate: Option<String>,
    /// Events completed per second (μ) by the whole workload.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 4096))]
    #[x_kube(validation = not_blank("metrics.completionRate", "give the PromQL for the events completed per second, or leave the field out"))]
    pub completion_rate: Option<String>,
    /// The window `produceRate` and `completionRate` average over (e.g. 5m for
    /// `rate(…[5m])`). Default: the longest range in those queries, else 1m. After a change of
    /// replicas the completion rate is trusted as capacity only once a whole window has passed,
    /// so set it when the queries read a recording rule whose window the operator cannot see.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 32))]
    #[x_kube(validation = positive_duration("metrics.rateWindow"))]
    #[x_kube(validation = duration_not_below("metrics.rateWindow", "1s", "Prometheus rates need at least two samples inside the window"))]
    #[x_kube(validation = duration_at_most("metrics.rateWindow", "24h", "a rate over a longer window never shows a burst, and capacity is trusted only a whole window after a change"))]
    pub rate_window: Option<String>,
    /// Retries per second.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 4096))]
    #[x_kube(validation = not_blank("metrics.retryRate", "give the PromQL for the retries per second, or leave the field out"))]
    pub retry_rate: Option<String>,
    /// Events quarantined per second.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 4096))]
    #[x_kube(validation = not_blank("metrics.quarantineRate", "give the PromQL for the events quarantined per second, or leave the field out"))]
    pub quarantine_rate: Option<String>,
    /// Partition count, instead of spec.partitionCount.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 4096))]
    #[x_kube(validation = not_blank("metrics.partitions", "give the PromQL for the partition count, or use spec.partitionCount"))]
    pub partitions: Option<String>,
    /// Unfinished events per partition: one series per partition, labelled `partition`
    /// (e.g. `sum by (partition) (kafka_consumergroup_lag{consumergroup="orders"})`). With it the
    /// budget sees a hot partition (condition `PartitionSkew`), sizes the workload for the
    /// other partitions, and measures capacity only while every partition has work.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 4096))]
    #[x_kube(validation = not_blank("metrics.partitionBacklog", "give the PromQL with one series per partition, or leave the field out"))]
    pub partition_backlog: Option<String>,
    /// A label whose value is what sets this budget's queries apart from other budgets' (e.g.
    /// `consumergroup` when each budget asks `…{consumergroup="orders"}`). Every query that
    /// matches it with `=` in each selector is then answered from one evaluation grouped by
    /// it, shared by every budget on the same Prometheus, instead of one per budget (condition
    /// `QueriesGrouped` says which queries are and why any other is not). Not
    /// `partitionBacklog`, which is already grouped by partition.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 128))]
    #[x_kube(validation = Rule::new("self.matches('^[a-zA-Z_][a-zA-Z0-9_]*$')").message("metrics.groupBy must be a Prometheus label name such as consumergroup: letters, digits and '_', not starting with a digit"))]
    pub group_by: Option<String>,
}

/// Consumer capacity.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Capacity {
    /// Events per second one replica completes: a prior until completionRate / ready
    /// replicas is measured while the consumers are saturated (status.capacity says which is
    /// used).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self > 0.0 && self <= 1000000000.0").message("capacity.perReplicaRate must be greater than 0 and at most 1e9 (events per second one replica completes)"))]
    pub per_replica_rate: Option<f64>,
    /// Share of capacity kept for retries, in [0, 0.9]; default 0.1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.0, max = 0.9))]
    pub reserved_retry_share: Option<f64>,
}

/// How scaling is paced. Every scale change costs a consumer-group rebalance.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Scaling {
    /// The longest the events waiting now may wait before they complete: every plan clears
    /// them within it, or within a poll of when added pods work if they start later. An
    /// upper bound, not the speed every backlog is drained at; default 5m.
    #[serde(default = "default_target_drain_time")]
    #[schemars(length(max = 32))]
    #[x_kube(validation = positive_duration("scaling.targetDrainTime"))]
    #[x_kube(validation = duration_at_most("scaling.targetDrainTime", "168h", "it bounds how long waiting events may wait, and completionDeadline is at most that"))]
    pub target_drain_time: String,
    /// Time a higher recommendation must persist before scaling up; default 0s.
    #[serde(default = "zero_duration")]
    #[schemars(length(max = 32))]
    #[x_kube(validation = non_negative_duration("scaling.scaleUpStabilization"))]
    #[x_kube(validation = duration_at_most("scaling.scaleUpStabilization", "24h", "a scale-up held longer than a day is no scale-up"))]
    pub scale_up_stabilization: String,
    /// Time a lower recommendation must persist before scaling down; default 3m. The recent
    /// demand is remembered for twice this and plans look ahead at least four times it.
    #[serde(default = "default_scale_down_stabilization")]
    #[schemars(length(max = 32))]
    #[x_kube(validation = non_negative_duration("scaling.scaleDownStabilization"))]
    #[x_kube(validation = duration_at_most("scaling.scaleDownStabilization", "24h", "plans look ahead four times it, and a scale-down held longer than a day is no scale-down"))]
    pub scale_down_stabilization: String,
    /// Most replicas added or removed in one change; default 0 means no limit.
    #[serde(default)]
    #[schemars(range(min = 0, max = 10000))]
    pub max_step: i32,
    /// How long consumption stops during a rebalance, e.g. 20s: every plan pays it, and a
    /// scale-down must save more replica-seconds than the consumers that stop for it.
    #[serde(default = "zero_duration")]
    #[schemars(length(max = 32))]
    #[x_kube(validation = non_negative_duration("scaling.rebalanceCost"))]
    pub rebalance_cost: String,
    /// How long a new consumer pod takes from a scale-up to consuming, e.g. 90s for a slow
    /// image or a JVM warm-up: plans assume it until the operator has seen a scale-up's pods
    /// become ready, then use the last start seen (status.podStartSeconds). Default 30s.
    #[serde(default = "default_pod_start_time")]
    #[schemars(length(max = 32))]
    #[x_kube(validation = non_negative_duration("scaling.podStartTime"))]
    #[x_kube(validation = duration_at_most("scaling.podStartTime", "1h", "plans count on added pods within it, and a pod that takes longer to consume is not starting but failing"))]
    pub pod_start_time: String,
    /// Most replica changes in any hour (each is a consumer-group rebalance), besides the
    /// ones the deadline needs: a correction into [minReplicas, the cap], or a scale-up while
    /// events are past the warning fraction or the backlog cannot drain. Default: no cap.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 120))]
    pub max_changes_per_hour: Option<i32>,
    /// Economy runs fewer replicas than arrivals need while the deadline has room for the
    /// backlog that grows, and scales up when the room is used: the cheapest way to serve a
    /// steady load whose keep-up count would idle. It is entered only when the count keeps
    /// the deadline for at least four scale-down windows, and not again within this long of
    /// ending at about the same load: at most one planned pair of rebalances per dwell.
    /// Default 1h; "0s" turns economy off.
    #[serde(default = "default_economy_dwell")]
    #[schemars(length(max = 32))]
    #[x_kube(validation = non_negative_duration("scaling.economyDwell"))]
    #[x_kube(validation = duration_at_most("scaling.economyDwell", "168h", "a longer dwell is economy off; write 0s for that"))]
    pub economy_dwell: String,
}

impl Default for Scaling {
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

fn default_target_drain_time() -> String {
    "5m".to_owned()
}
fn default_scale_down_stabilization() -> String {
    // Shorter than the HPA's 5m: the inputs are already windowed rates and a scale-down is
    // one step to the window's highest recommendation, so a shorter hold does not flap and
    // idles fewer replicas after a burst.
    "3m".to_owned()
}
fn default_pod_start_time() -> String {
    crate::core::budget_config::default_pod_start_time()
}
fn default_economy_dwell() -> String {
    crate::core::budget_config::default_economy_dwell()
}
fn zero_duration() -> String {
    "0s".to_owned()
}

/// Alert thresholds as fractions of the completion deadline, and who to tell.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("self.warningAt < self.criticalAt").message("alerts.warningAt must be below alerts.criticalAt").field_path(".warningAt"))]
pub struct Alerts {
    /// Oldest age / deadline at which the budget is AtRisk, in (0, 1); default 0.5.
    #[serde(default = "default_warning_at")]
    #[schemars(range(min = 0.0, max = 1.0))]
    #[x_kube(validation = Rule::new("self > 0.0").message("alerts.warningAt must be greater than 0: at 0 every budget would always be AtRisk"))]
    pub warning_at: f64,
    /// Oldest age / deadline at which the budget is Breaching; default 0.8.
    #[serde(default = "default_critical_at")]
    #[schemars(range(min = 0.0, max = 1.0))]
    pub critical_at: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    pub owner: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 2048))]
    pub runbook: Option<String>,
}

impl Default for Alerts {
    fn default() -> Self {
        Self {
            warning_at: default_warning_at(),
            critical_at: default_critical_at(),
            owner: None,
            runbook: None,
        }
    }
}

fn default_warning_at() -> f64 {
    0.5
}
fn default_critical_at() -> f64 {
    0.8
}

/// An event class that can be paused when it keeps failing.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct EventClass {
    /// Class name as consumers report it (e.g. the event type).
    #[schemars(length(min = 1, max = 63))]
    #[x_kube(validation = Rule::new("self.matches('^[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?$')").message("eventClasses[].name must be letters, digits, '.', '_' or '-', starting and ending with a letter or digit"))]
    pub name: String,
    /// PromQL: share of this class's executions that fail persistently, in [0, 1].
    #[schemars(length(min = 1, max = 4096))]
    #[x_kube(validation = not_blank("eventClasses[].failureRatio", "give the PromQL for the share of the class's executions that fail"))]
    pub failure_ratio: String,
    /// PromQL: this class's executions per second (to ignore tiny samples).
    #[schemars(length(min = 1, max = 4096))]
    #[x_kube(validation = not_blank("eventClasses[].executionRate", "give the PromQL for the class's executions per second"))]
    pub execution_rate: String,
    /// Fewest executions per second before the breaker decides anything; default 1.
    #[serde(default = "default_min_rate")]
    #[schemars(range(min = 0.0, max = 1_000_000_000.0))]
    pub min_rate: f64,
    /// PromQL: this class's backlog, taken out of the scaling input while it is paused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 4096))]
    #[x_kube(validation = not_blank("eventClasses[].backlog", "give the PromQL for the class's backlog, or leave the field out"))]
    pub backlog: Option<String>,
    /// Auto lets the breaker decide; Paused and Active are manual overrides.
    #[serde(default)]
    pub mode: ClassMode,
    /// When the breaker opens and how it probes.
    #[serde(default)]
    pub pause_policy: PausePolicy,
}

fn default_min_rate() -> f64 {
    1.0
}

/// Class breaker parameters.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = duration_at_least("maxOpenDuration", "openDuration", "pausePolicy.maxOpenDuration must be at least pausePolicy.openDuration"))]
pub struct PausePolicy {
    /// Persistent-failure ratio at or above which the class counts as failing, in (0, 1];
    /// default 0.5.
    #[serde(default = "default_threshold")]
    #[x_kube(validation = Rule::new("self > 0.0 && self <= 1.0").message("pausePolicy.threshold must be in (0, 1]: at 0 every class would count as failing"))]
    pub threshold: f64,
    /// How long the ratio must stay at or above the threshold (and, when probing, healthy);
    /// default 2m.
    #[serde(default = "default_for", rename = "for")]
    #[schemars(length(max = 32))]
    #[x_kube(validation = positive_duration("pausePolicy.for"))]
    #[x_kube(validation = duration_not_below("pausePolicy.for", "1s", "the ratio is read once per poll, so a shorter span decides on one reading"))]
    #[x_kube(validation = duration_at_most("pausePolicy.for", "24h", "a class failing for longer than a day starves healthy work long before it is paused"))]
    pub for_: String,
    /// How long a paused class stays paused before probing; default 5m.
    #[serde(default = "default_open_duration")]
    #[schemars(length(max = 32))]
    #[x_kube(validation = positive_duration("pausePolicy.openDuration"))]
    #[x_kube(validation = duration_not_below("pausePolicy.openDuration", "1s", "a pause shorter than a poll is never seen by the consumers"))]
    #[x_kube(validation = duration_at_most("pausePolicy.openDuration", "24h", "the first probe comes after it, and maxOpenDuration bounds the pauses after failed probes"))]
    pub open_duration: String,
    /// Longest pause after repeated failed probes (the open duration doubles); default 1h.
    #[serde(default = "default_max_open_duration")]
    #[schemars(length(max = 32))]
    #[x_kube(validation = positive_duration("pausePolicy.maxOpenDuration"))]
    #[x_kube(validation = duration_at_most("pausePolicy.maxOpenDuration", "168h", "a paused class is probed at least weekly, or its events wait unseen past any deadline"))]
    pub max_open_duration: String,
    /// Share of the class's events consumers process while probing, in (0, 1]; default 0.1.
    #[serde(default = "default_probe_ratio")]
    #[x_kube(validation = Rule::new("self > 0.0 && self <= 1.0").message("pausePolicy.probeRatio must be in (0, 1]"))]
    pub probe_ratio: f64,
}

impl Default for PausePolicy {
    fn default() -> Self {
        Self {
            threshold: default_threshold(),
            for_: default_for(),
            open_duration: default_open_duration(),
            max_open_duration: default_max_open_duration(),
            probe_ratio: default_probe_ratio(),
        }
    }
}

fn default_threshold() -> f64 {
    0.5
}
fn default_for() -> String {
    "2m".to_owned()
}
fn default_open_duration() -> String {
    "5m".to_owned()
}
fn default_max_open_duration() -> String {
    "1h".to_owned()
}
fn default_probe_ratio() -> f64 {
    0.1
}

/// What the operator saw and decided.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct BacklogBudgetStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<BudgetPhase>,
    /// The last complete set of inputs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed: Option<Observed>,
    /// Predicted seconds to drain the backlog at the current rates; absent when it cannot drain.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drain_time_seconds: Option<f64>,
    /// The same, readable (e.g. 4m10s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drain_time: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub desired_replicas: Option<i32>,
    /// One line: why the operator wants this many replicas.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub explanation: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_scale: Option<LastScale>,
    /// The recommendations of the scale-down window that can still be its highest (oldest
    /// first): the window survives an operator restart.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub scale_down_window: Vec<PendingScale>,
    /// A higher recommendation waiting out scaleUpStabilization (the lowest since it began).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scale_up_pending: Option<PendingScale>,
    /// The per-replica rate the decision used and where it comes from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity: Option<CapacityStatus>,
    /// The recent past as runs of about the same λ, each with its highest (oldest first):
    /// scale-downs are judged as if it repeats, so a load that returns is not chased down at
    /// its trough.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 24))]
    pub recent_demand: Vec<DemandBucket>,
    /// Since when pods of the last scale-up have not all been ready.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pods_pending_since: Option<MicroTime>,
    /// Since when work has waited beyond what the consumers complete in two polls: their
    /// completion rate is measured as capacity once this spans the rate window.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub busy_since: Option<MicroTime>,
    /// How long the last scale-up took until every pod was ready (plans assume 30 s before
    /// one was seen).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_start_seconds: Option<f64>,
    /// When the replicas changed in the last hour (for `scaling.maxChangesPerHour`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 200))]
    pub recent_scale_changes: Vec<MicroTime>,
    /// Economy: since when the replicas complete less than arrives while the deadline has
    /// room, and when economy last ended because the room was used.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub economy: Option<EconomyStatus>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub paused_classes: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = kube::core::ListMerge::Map(vec!["name".into()]))]
    pub event_classes: Vec<EventClassStatus>,
    /// What the replica cap (maxReplicas and the partitions) completes over the highest
    /// produce rate of the last 24 hours: 2.0 is twice the peak, below 1 the peak cannot
    /// drain. Absent while either is unknown; the `CapacityPlan` condition says why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity_headroom: Option<f64>,
    /// Name of the consumer control document ConfigMap.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub control_document: Option<String>,
    /// The document's latest revision. Kept here too, so the revision keeps growing even if
    /// the ConfigMap is deleted or edited by hand.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub control_document_revision: Option<i64>,
    /// `MetricsAvailable`, `PartitionLimited`, `DeadlineAtRisk`, `ScalingActive`, `Conflict`,
    /// `CapacityPlan`, and `PartitionSkew` when `metrics.partitionBacklog` is set.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = kube::core::ListMerge::Map(vec!["type".into()]))]
    pub conditions: Vec<Condition>,
}

/// The capacity the decision used.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct CapacityStatus {
    pub source: CapacitySource,
    /// Events per second one replica completes, as used.
    pub per_replica_rate: f64,
    /// The last measurement taken while the consumers were saturated or, without one, the
    /// highest completions per ready replica seen (`measuredLowerBound`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub measured_per_replica_rate: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub measured_at: Option<MicroTime>,
    /// The measurement is of consumers that were not saturated: they can do at least this.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub measured_lower_bound: bool,
    /// How many times in a row the configured rate was tried again after the measurement went
    /// stale and the consumers fell short of it again; each doubles how long the measurement
    /// stands before the next try.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub measured_confirmations: u32,
    /// The most per replica the consumers were ever shown to complete. Without
    /// `capacity.perReplicaRate`, a measurement below it that has gone stale is tried
    /// again by fewer replicas (source `Stale`): a consumer that recovered from a slowdown is
    /// never saturated by the replicas sized for it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub most_seen_per_replica_rate: Option<f64>,
    /// When fewer replicas were last tried to learn a capacity known only as a lower bound
    /// (the consumers idled and were never saturated); at most one try per cost
    /// window.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probed_at: Option<MicroTime>,
}

/// Economy's memory (`scaling.economyDwell`).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct EconomyStatus {
    /// Since when the replicas complete less than arrives.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since: Option<MicroTime>,
    /// The load when it began, in replicas' worth of work (λ / per-replica rate).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub load: Option<f64>,
    /// When economy last ended because its room was used: it is not entered again within
    /// `scaling.economyDwell` of this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub left_at: Option<MicroTime>,
}

/// A run of about the same λ: when it began and its highest value.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct DemandBucket {
    pub at: MicroTime,
    pub produce_rate: f64,
}

/// Inputs of the last evaluation.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Observed {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backlog: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub produce_rate: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completion_rate: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_rate: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quarantine_rate: Option<f64>,
    /// Seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oldest_unfinished_age: Option<f64>,
    /// The same, readable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oldest_unfinished_age_text: Option<String>,
    /// True when no oldest-age query is configured and the age was estimated.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub oldest_age_estimated: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partitions: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at: Option<MicroTime>,
    /// When this backlog sample was first seen: a scrape slower than the poll shows one
    /// sample to several polls, and the next sample's change spans the time since then.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backlog_since: Option<MicroTime>,
    /// How long the backlog value before this one was seen unchanged, in seconds: a value
    /// that stands longer is a level (an empty queue), and its change spans at most this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous_backlog_stood_seconds: Option<f64>,
}

/// The last change the operator made to the target's replicas.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct LastScale {
    pub at: MicroTime,
    pub from: i32,
    pub to: i32,
    pub reason: String,
    /// For a scale-up: the oldest age, in seconds, it was planned to stay under. The count
    /// it asked for is held to that age while it turns the backlog, not asked to grow again
    /// at every poll until its pods work.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub age_limit_seconds: Option<f64>,
}

/// A recommendation waiting out its stabilization window.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PendingScale {
    pub since: MicroTime,
    /// The recommendation (made at `since`, or held since then).
    pub replicas: i32,
}

/// One event class's breaker state; also the breaker's memory across restarts.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct EventClassStatus {
    pub name: String,
    pub state: ClassState,
    /// When the class entered this state.
    pub since: MicroTime,
    /// Last failure ratio seen.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_ratio: Option<f64>,
    /// The failure ratio that caused the last transition (for a transition by time or by
    /// hand, the last ratio seen then).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transition_ratio: Option<f64>,
    /// Since when the ratio has been at or above the threshold (Active) or below it (Probing).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub condition_since: Option<MicroTime>,
    /// The current pause length; doubles on each failed probe up to maxOpenDuration.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub open_duration: Option<String>,
    /// Share of the class processed while probing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probe_ratio: Option<f64>,
    /// Why the class is in this state, with the ratio that caused it.
    pub message: String,
}

fn is_zero(count: &u32) -> bool {
    *count == 0
}
